"""Local testnets of node processes: on loopback, or in network namespaces that look like
the internet (latency, jitter, loss, NAT, partitions, churn).

- ``runner``: :class:`Testnet` starts the nodes, drives them through a workload over their
  control APIs, and checks that nothing was lost (``node/workload.py``'s judgement).
- ``netns``: :class:`Lab`, the namespaces, NAT routers and addresses of an emulated internet.
- ``wan``: the userspace router that carries every packet between namespaces.
"""

from node.testnet.runner import Conditions, Node, Testnet

__all__ = ["Conditions", "Node", "Testnet"]
