"""Execution: run one agreed job in a real OCI container with enforced limits, and meter it.

- ``executor``: admission against capacity, the job's lifecycle, outputs and usage.
- ``runtime``: crun or runc; ``mountns`` (with ``mountns_child``): the private mount
  namespace crun needs on hybrid hosts, held by one helper process; ``cgroups``: v1/v2
  detection, usage counters, removal; ``mounts``: the job areas' mounts; ``janitor``:
  cleanup after a job's result; ``ocispec``: the container's config.json; ``gpu``: NVIDIA
  GPU detection and wiring.
"""

from node.exec.executor import CapacityExceeded, Executor, ExecutorConfig, JobResult
from node.exec.gpu import GpuDevice, detect_gpus

__all__ = [
    "CapacityExceeded",
    "Executor",
    "ExecutorConfig",
    "GpuDevice",
    "JobResult",
    "detect_gpus",
]
