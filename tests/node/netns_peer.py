"""One libp2p node (node/net/p2p.py) in a process of its own, driven by JSON lines.

The netns tests run it inside a namespace of a :class:`node.testnet.netns.Lab`
(``ip netns exec``) and talk to it over stdin/stdout: one command a line, one answer a line.
Commands wait for what they name, bounded by their ``timeout``; an answer of
``{"error": ...}`` says why not.

    {"op": "info"}                           peer id, listen addresses, reachability, peers
    {"op": "connect", "addr": A}             dial (direct or /p2p-circuit)
    {"op": "await", "what": "reachability", "value": "private"}
    {"op": "await", "what": "relayed"}       a relay's circuit address is our first
    {"op": "await", "what": "connected", "peer": P, "kind": "direct"}
    {"op": "provide", "key": K}  {"op": "find", "key": K}
    {"op": "subscribe", "topic": T}  {"op": "publish", "topic": T, "data": D}
    {"op": "await", "what": "received", "data": D}
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import trio

from node.net.p2p import NatTuning, P2PConfig, P2PNetwork, serve_network
from node.net.transport import Gossip, PeerId, Verdict
from protocol.identity import PrivateKey


def accept(sender: PeerId, data: bytes) -> Verdict:
    return Verdict.ACCEPT


class Driver:
    def __init__(self, net: P2PNetwork, nursery: trio.Nursery) -> None:
        self.net = net
        self.nursery = nursery
        self.received: set[str] = set()
        self.arrived = trio.Event()

    def info(self) -> dict[str, Any]:
        net = self.net
        return {
            "peer": net.peer_id,
            "addrs": net.listen_addrs,
            "reachability": net.reachability,
            "peers": {p: sorted(net.connection_kinds(p)) for p in net.peers()},
        }

    async def drain(self, inbox: trio.MemoryReceiveChannel[Gossip]) -> None:
        async for gossip in inbox:
            self.received.add(gossip.data.decode())
            self.arrived.set()
            self.arrived = trio.Event()

    def holds(self, cmd: dict[str, Any]) -> bool:
        what = cmd["what"]
        if what == "reachability":
            return bool(self.net.reachability == cmd["value"])
        if what == "relayed":  # reachable through a relay: a circuit address comes first
            return "/p2p-circuit/" in self.net.listen_addrs[0]
        if what == "connected":
            peer = PeerId(cmd["peer"])
            return peer in self.net.peers() and cmd["kind"] in self.net.connection_kinds(peer)
        if what == "received":
            return cmd["data"] in self.received
        raise ValueError(f"cannot wait for {what!r}")

    async def run(self, cmd: dict[str, Any]) -> dict[str, Any]:
        op = cmd["op"]
        if op == "info":
            return self.info()
        if op == "connect":
            return {"peer": await self.net.connect(cmd["addr"])}
        if op == "provide":
            await self.net.provide(cmd["key"])
            return {}
        if op == "find":
            return {"found": await self.net.find_providers(cmd["key"])}
        if op == "subscribe":
            self.nursery.start_soon(self.drain, await self.net.subscribe(cmd["topic"], accept))
            return {}
        if op == "publish":
            await self.net.publish(cmd["topic"], cmd["data"].encode())
            return {}
        if op == "await":
            while not self.holds(cmd):
                with trio.move_on_after(0.1):  # connections and AutoNAT have no one event
                    await self.arrived.wait()
            return self.info()
        raise ValueError(f"unknown op {op!r}")


def say(answer: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


async def main() -> None:
    seed, listen = int(sys.argv[1]), sys.argv[2]
    config = P2PConfig(
        listen_addrs=(listen,),
        bootstrap=tuple(sys.argv[3:]),
        nat=NatTuning(check_interval=2.0),
    )
    async with trio.open_nursery() as nursery:
        net = await nursery.start(serve_network, PrivateKey.from_seed(bytes([seed]) * 32), config)
        driver = Driver(net, nursery)
        say(driver.info())
        async for line in trio.wrap_file(sys.stdin):
            cmd = json.loads(line)
            try:
                with trio.fail_after(cmd.get("timeout", 30)):
                    answer = await driver.run(cmd)
            except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
                answer = {"error": f"{type(exc).__name__}: {exc}", **driver.info()}
            say(answer)
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    trio.run(main)
