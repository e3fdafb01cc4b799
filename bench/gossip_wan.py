"""Gossip across an emulated WAN: propagation to every node, and CPU per node, at 5, 10, 20.

Each node is a libp2p node (node/net/p2p.py) in a process of its own, in a network namespace
of its own (node/testnet/netns.py), every packet between two of them delayed by
``--latency-ms`` one way (node/testnet/wan.py). Node i dials node 0 and up to 3 random
earlier nodes (as bench/gossip.py). Offers of ~485 bytes are published one at a time from
random nodes; a message's propagation is from its publish to its arrival at the last
node (one clock: all the processes run on this machine). Baseline, in the same run: the
emulator's one-way latency itself, and the same network of the largest size with no delay.
CPU per node is the process time each node spent during the publishing, per message.
The goal (issue 11): propagation p99 under 1 s on 20 nodes at 50 ms.

Prints a table (cost as the network grows), then one JSON line. Needs root.
Run ``.venv/bin/python bench/gossip_wan.py``; ``--sizes 5,10,20``, ``--messages 60``.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TOPIC = "cx/bench/wan/v1"
PORT = 4001


# -- a node process ------------------------------------------------------------------------


async def node_main(seed: int, listen: str) -> None:
    """One node, driven by JSON lines on stdin: ``connect``, ``subscribe``, ``publish``,
    ``wait`` (until it holds messages named), ``report`` (arrival times, CPU seconds)."""
    import trio

    from node.net.p2p import P2PConfig, serve_network
    from node.net.transport import Gossip, PeerId, Verdict
    from protocol.identity import PrivateKey

    def accept(sender: PeerId, data: bytes) -> Verdict:
        return Verdict.ACCEPT

    arrived: dict[str, float] = {}
    changed = trio.Event()

    async def drain(inbox: trio.MemoryReceiveChannel[Gossip]) -> None:
        nonlocal changed
        async for gossip in inbox:
            arrived[gossip.data[:16].decode()] = time.time()
            changed.set()
            changed = trio.Event()

    def say(answer: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()

    config = P2PConfig(listen_addrs=(listen,))
    async with trio.open_nursery() as nursery:
        key = PrivateKey.from_seed(bytes([seed]) * 32)
        net = await nursery.start(serve_network, key, config)
        say({"peer": net.peer_id, "addr": net.listen_addrs[0]})
        async for line in trio.wrap_file(sys.stdin):
            cmd = json.loads(line)
            op = cmd["op"]
            if op == "connect":
                await net.connect(cmd["addr"])
            elif op == "subscribe":
                nursery.start_soon(drain, await net.subscribe(TOPIC, accept))
            elif op == "publish":
                name = cmd["name"]
                arrived[name] = time.time()  # its publish time, for the publisher
                await net.publish(TOPIC, name.encode() + b"\0" * 469)
            elif op == "wait":
                with trio.move_on_after(cmd["timeout"]):
                    while not all(n in arrived for n in cmd["names"]):
                        await changed.wait()
            elif op == "report":
                cmd = {"arrived": arrived, "cpu_s": time.process_time()}
            say(cmd)
        nursery.cancel_scope.cancel()


# -- the benchmark -------------------------------------------------------------------------


class Proc:
    def __init__(self, argv: list[str]) -> None:
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.hello = self.read()

    def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"a node exited with {self.process.wait()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def send(self, **cmd: Any) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(cmd) + "\n")
        self.process.stdin.flush()

    def ask(self, **cmd: Any) -> dict[str, Any]:
        self.send(**cmd)
        return self.read()

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_size(size: int, latency_s: float, messages: int, rng: random.Random) -> dict[str, Any]:
    from node.testnet.netns import Lab
    from node.testnet.wan import Impairment

    with Lab() as lab:
        hosts = [lab.add_host(f"n{i}") for i in range(size)]
        lab.start_wan(Impairment(latency_s=latency_s))
        nodes: list[Proc] = []
        try:
            started = time.monotonic()
            for i, host in enumerate(hosts):
                listen = f"/ip4/{host.address}/tcp/{PORT}"
                argv = [sys.executable, __file__, "--node", str(i + 1), listen]
                nodes.append(Proc(lab.command(host, argv)))
            startup_s = time.monotonic() - started
            for i in range(1, size):
                for j in {0, *rng.sample(range(i), min(3, i))}:
                    nodes[i].ask(op="connect", addr=nodes[j].hello["addr"])
            for node in nodes:
                node.ask(op="subscribe")
            # Warm up until the mesh carries a message to everyone (GossipSub grafts on its
            # heartbeat, about a second): then every node is in the mesh.
            for attempt in range(30):
                name = f"warm{attempt:012d}"
                nodes[0].ask(op="publish", name=name)
                for n in nodes[1:]:
                    n.ask(op="wait", names=[name], timeout=2.0)
                if all(name in n.ask(op="report")["arrived"] for n in nodes[1:]):
                    break
            cpu_before = [n.ask(op="report")["cpu_s"] for n in nodes]
            names = []
            for m in range(messages):
                origin = rng.randrange(size)
                name = f"msg{m:013d}"
                names.append((name, origin))
                nodes[origin].ask(op="publish", name=name)
                for n in nodes:
                    n.ask(op="wait", names=[name], timeout=10.0)
            reports = [n.ask(op="report") for n in nodes]
        finally:
            for node in nodes:
                node.stop()
    spreads, lost = [], 0
    for name, origin in names:
        sent = reports[origin]["arrived"][name]
        times = [r["arrived"].get(name) for k, r in enumerate(reports) if k != origin]
        lost += sum(t is None for t in times)
        spreads.append(max(t for t in times if t is not None) - sent)
    cpu = [r["cpu_s"] - before for r, before in zip(reports, cpu_before, strict=True)]
    return {
        "nodes": size,
        "latency_ms": latency_s * 1000,
        "p50_ms": round(pct(spreads, 0.5) * 1000, 1),
        "p99_ms": round(pct(spreads, 0.99) * 1000, 1),
        "lost": lost,
        "cpu_ms_per_message_per_node": round(sum(cpu) / len(cpu) / messages * 1000, 2),
        "cpu_ms_per_message_max_node": round(max(cpu) / messages * 1000, 2),
        "startup_s": round(startup_s, 1),
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--node":
        import trio

        logging.basicConfig(level=logging.ERROR)
        trio.run(node_main, int(sys.argv[2]), sys.argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="5,10,20")
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--messages", type=int, default=60)
    args = parser.parse_args()
    rng = random.Random(7)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = [run_size(n, args.latency_ms / 1000, args.messages, rng) for n in sizes]
    base = run_size(max(sizes), 0.0, args.messages, rng)
    print(
        f"gossip across an emulated WAN ({args.latency_ms:g} ms one way), one process and "
        f"namespace per node, {args.messages} messages of 485 bytes each"
    )
    print(f"{'nodes':>6}{'latency':>9}{'p50 ms':>9}{'p99 ms':>9}{'p99/latency':>13}"
          f"{'lost':>6}{'CPU ms/msg/node':>17}{'max node':>10}")  # fmt: skip
    for r in [*rows, base]:
        ratio = f"{r['p99_ms'] / r['latency_ms']:.1f}x" if r["latency_ms"] else "-"
        print(
            f"{r['nodes']:>6}{r['latency_ms']:>7g}ms{r['p50_ms']:>9}{r['p99_ms']:>9}{ratio:>13}"
            f"{r['lost']:>6}{r['cpu_ms_per_message_per_node']:>17}"
            f"{r['cpu_ms_per_message_max_node']:>10}"
        )
    largest = rows[-1]
    print(f"goal: p99 under 1 s on {largest['nodes']} nodes: {largest['p99_ms'] < 1000}")
    print(json.dumps({"wan": rows, "no_delay": base}))
    return 1 if any(r["lost"] for r in [*rows, base]) else 0


if __name__ == "__main__":
    sys.exit(main())
