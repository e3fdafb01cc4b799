"""Network benchmark: gossip propagation and rate over real libp2p, beside raw baselines.

Measures in one run, on loopback, in one process (so 1 core does all the nodes' work):
- raw TCP throughput (trio sockets) and one yamux stream through node/net/p2p.py (Noise +
  yamux), and their ratio;
- dial latency of P2PNetwork.connect (libp2p's happy-eyeballs wait would make it >= 250 ms);
- a testnet of N nodes, each dialing 3 earlier ones: offer propagation to *every* node,
  p50 and p99 over offers published one at a time from random nodes;
- sustained order rate with no loss: several nodes publish a burst of orders, the clock
  stops when every node holds every order; any loss fails the run (exit 1).
The gossip is what a node gossips: offers and bids signed by the publishing node's key
(Trader.post), and every node's topic validator is the node's own admission,
``Trader.receive_order`` (decode, signature, expiry, replay, book insert, matching), as in
node/market/gossip.py; a rejected order fails the run. Orders are signed before their clock
starts (the rate phase's all before the burst). ``--validator trivial`` gossips raw bytes
and accepts everything instead, to see what admission costs.
Every node's admission runs on the one core this process has, so the network-wide rate is
what N nodes sharing one core sustain; the CPU per order delivered to a node (all the
process's work over all deliveries) is printed beside it.
Baseline for admission: raw Ed25519 verification (PyNaCl, as bench/ingest.py's) of the same
orders, in the same run, per second of CPU; the rate a node with a core of its own would
admit by gossip (per second of CPU: 1 / the CPU per delivery) is printed as a share of it.
Goals (issue 5): propagation p99 < 1 s; >= 1,000 orders/s network-wide; stream >= 150 MB/s.
Goal (issue 11): a node admits gossiped orders at >= 0.5x its raw verification rate.
Prints a table, then one JSON line. ``--nodes``, ``--orders`` to change the size.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import trio
from factories import HOUR_MS, Nonces, bid, offer
from ingest import verify_items

from node.net.p2p import P2PNetwork, serve_network
from node.net.transport import FramedStream, Gossip, PeerId, ProtocolId, Stream, Validator, Verdict
from protocol.errors import ProtocolError
from protocol.identity import PrivateKey
from protocol.trader import Trader

TOPIC = "cx/bench/offers/v1"
SINK = ProtocolId("/cx/bench/sink/1")
CHUNK = 64 * 1024


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def accept(sender: PeerId, data: bytes) -> Verdict:
    return Verdict.ACCEPT


def admission(trader: Trader, refused: list[str]) -> Validator:
    """The node's own admission (node/market/gossip.py's validator, less its bookkeeping)."""

    def validate(sender: PeerId, data: bytes) -> Verdict:
        try:
            trader.receive_order(data, now_ms=now_ms())
        except ProtocolError as exc:
            refused.append(f"{exc.reason.value}: {exc}")
            return Verdict.REJECT
        return Verdict.ACCEPT

    return validate


class Orders:
    """Signed orders of one node, or numbered raw bytes for the trivial validator."""

    def __init__(self, key: PrivateKey, index: int, signed: bool) -> None:
        self.trader = Trader(key)  # a signer only: its own book is not the node's
        self.nonce = Nonces(f"bench-{index}")
        self.signed = signed
        self.index = index
        self.count = 0

    def offer(self) -> bytes:
        self.count += 1
        if not self.signed:
            return b"offer-%06d-%02d" % (self.count, self.index) + b"\0" * 200
        payload = offer(cpu_price=50_000 + self.count % 1000, region=("eu", "us")[self.count % 2])
        order, _ = self.trader.post(payload, nonce=self.nonce(), now_ms=now_ms(), ttl_ms=HOUR_MS)
        return order.wire

    def order(self) -> bytes:
        """An offer or a bid, alternately."""
        if self.count % 2 == 0:
            return self.offer()
        self.count += 1
        if not self.signed:
            return b"order-%07d-%02d" % (self.count, self.index) + b"\0" * 150
        payload = bid(cpu_limit=40_000 + self.count % 1000)  # below every offer: no trades
        order, _ = self.trader.post(payload, nonce=self.nonce(), now_ms=now_ms(), ttl_ms=HOUR_MS)
        return order.wire


def raw_verify_cpu_rate(wires: list[bytes]) -> float:
    """Ed25519 verifications per CPU second (as the admission's cost is measured: on a
    shared machine, waiting for a core counts in neither)."""
    items = verify_items(wires)
    start = time.process_time()
    for verify_key, message, signature in items:
        verify_key.verify(message, signature)
    return len(items) / (time.process_time() - start)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def raw_tcp_mb_s(total: int) -> float:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    done = trio.Event()
    elapsed = 0.0

    async def sink(stream: trio.SocketStream) -> None:
        nonlocal elapsed
        got = 0
        start = time.perf_counter()
        while got < total:
            data = await stream.receive_some(1 << 20)
            if not data:
                break
            got += len(data)
        elapsed = time.perf_counter() - start
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, sink, listeners)
        client = await trio.open_tcp_stream("127.0.0.1", port)
        block = b"\0" * CHUNK
        for _ in range(total // CHUNK):
            await client.send_all(block)
        await done.wait()
        await client.aclose()
        nursery.cancel_scope.cancel()
    return total / elapsed / 1e6


async def stream_mb_s(a: P2PNetwork, b: P2PNetwork, total: int) -> float:
    done = trio.Event()
    elapsed = 0.0

    async def sink(stream: Stream) -> None:
        nonlocal elapsed
        got = 0
        start = time.perf_counter()
        while got < total:
            data = await stream.receive_some(1 << 20)
            if not data:
                break
            got += len(data)
        elapsed = time.perf_counter() - start
        await FramedStream(stream).send_frame(b"done")
        done.set()

    b.serve(SINK, sink)
    await a.connect(b.listen_addrs[0])
    stream = await a.open_stream(b.peer_id, SINK)
    block = b"\0" * CHUNK
    for _ in range(total // CHUNK):
        await stream.send_all(block)
    await done.wait()
    await stream.aclose()
    return total / elapsed / 1e6


async def testnet(args: argparse.Namespace) -> dict[str, float | int]:
    rng = random.Random(7)
    result: dict[str, float | int] = {}
    signed = args.validator == "admission"
    keys = [PrivateKey.from_seed(bytes([i + 1]) * 32) for i in range(args.nodes)]
    orders = [Orders(k, i, signed) for i, k in enumerate(keys)]
    refused: list[str] = []
    async with trio.open_nursery() as nursery:
        start = time.perf_counter()
        nets: list[P2PNetwork] = [await nursery.start(serve_network, k) for k in keys]
        result["startup_ms_per_node"] = (time.perf_counter() - start) * 1000 / args.nodes

        # Throughput baselines on the first two nodes (before gossip load exists).
        result["raw_tcp_mb_s"] = await raw_tcp_mb_s(args.raw_mb << 20)
        result["stream_mb_s"] = await stream_mb_s(nets[0], nets[1], args.stream_mb << 20)

        dials: list[float] = []
        links: list[tuple[int, int]] = []
        for i in range(1, args.nodes):
            for j in rng.sample(range(i), min(3, i)):
                if (i, j) == (1, 0):
                    continue  # already connected by the stream test
                t = time.perf_counter()
                await nets[i].connect(nets[j].listen_addrs[0])
                dials.append(time.perf_counter() - t)
                links.append((i, j))
        links.append((1, 0))
        result["dial_ms_p50"] = pct(dials, 0.5) * 1000
        result["dial_ms_max"] = max(dials) * 1000

        inboxes = [
            await net.subscribe(TOPIC, admission(Trader(k), refused) if signed else accept)
            for net, k in zip(nets, keys, strict=True)
        ]
        with trio.fail_after(60):
            for i, j in links:
                await nets[i].wait_subscribed(nets[j].peer_id, TOPIC)
                await nets[j].wait_subscribed(nets[i].peer_id, TOPIC)

        # Per node: message -> arrival time. Publishers do not receive their own.
        arrivals: list[dict[bytes, float]] = [{} for _ in nets]
        expected: list[int] = [0 for _ in nets]
        all_in = trio.Event()

        def check_done() -> None:
            if all(len(arrivals[k]) >= expected[k] for k in range(len(nets))):
                all_in.set()

        async def drain(k: int, inbox: trio.MemoryReceiveChannel[Gossip]) -> None:
            async for gossip in inbox:
                if gossip.data in arrivals[k]:
                    raise AssertionError(f"node {k} received a message twice")
                arrivals[k][gossip.data] = time.perf_counter()
                check_done()

        async with trio.open_nursery() as drains:
            for k, inbox in enumerate(inboxes):
                drains.start_soon(drain, k, inbox)

            # 1. Propagation: one offer at a time, from random nodes.
            published: dict[bytes, tuple[int, float]] = {}
            for _ in range(args.offers):
                origin = rng.randrange(args.nodes)
                data = orders[origin].offer()
                all_in = trio.Event()
                for k in range(args.nodes):
                    if k != origin:
                        expected[k] += 1
                published[data] = (origin, time.perf_counter())
                await nets[origin].publish(TOPIC, data)
                with trio.fail_after(30):
                    await all_in.wait()
            spreads = []
            for data, (origin, sent) in published.items():
                last = max(arrivals[k][data] for k in range(args.nodes) if k != origin)
                spreads.append(last - sent)
            result["propagation_ms_p50"] = pct(spreads, 0.5) * 1000
            result["propagation_ms_p99"] = pct(spreads, 0.99) * 1000

            # 2. Sustained rate: bursts from several publishers, no loss allowed.
            publishers = rng.sample(range(args.nodes), args.publishers)
            all_in = trio.Event()
            burst: list[tuple[int, bytes]] = []
            for n in range(args.orders):
                origin = publishers[n % len(publishers)]
                burst.append((origin, orders[origin].order()))
                for k in range(args.nodes):
                    if k != origin:
                        expected[k] += 1
            result["order_bytes"] = sum(len(data) for _, data in burst) / len(burst)
            start, cpu = time.perf_counter(), time.process_time()
            async with trio.open_nursery() as pubs:
                for origin in publishers:

                    async def publish_all(origin: int = origin) -> None:
                        for who, data in burst:
                            if who == origin:
                                await nets[origin].publish(TOPIC, data)

                    pubs.start_soon(publish_all)
            with trio.fail_after(args.orders / 50 + 30):
                await all_in.wait()
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu
            result["orders"] = args.orders
            result["orders_per_s"] = args.orders / elapsed
            result["deliveries_per_s"] = args.orders * (args.nodes - 1) / elapsed
            result["bundles"] = sum(net.stats["bundles"] for net in nets)
            result["lost"] = sum(expected) - sum(len(a) for a in arrivals)
            # CPU of the whole process per order delivered to one node: gossip and admission.
            result["cpu_us_per_delivery"] = cpu / (args.orders * (args.nodes - 1)) * 1e6
            result["refused"] = len(refused)
            if signed:
                wires = [data for _, data in burst]
                result["raw_verify_per_s"] = max(raw_verify_cpu_rate(wires) for _ in range(3))
            drains.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--offers", type=int, default=100)
    parser.add_argument("--orders", type=int, default=5000)
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--raw-mb", type=int, default=512)
    parser.add_argument("--stream-mb", type=int, default=64)
    parser.add_argument(
        "--validator",
        choices=("admission", "trivial"),
        default="admission",
        help="admission: signed orders through Trader.receive_order (the node's); "
        "trivial: raw bytes, accept everything",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    started = time.perf_counter()
    r = trio.run(testnet, args)
    r["nodes"] = args.nodes
    r["validator"] = args.validator
    r["wall_s"] = time.perf_counter() - started
    rows = [
        ("raw TCP loopback", f"{r['raw_tcp_mb_s']:.0f} MB/s", ""),
        (
            "yamux stream (Noise)",
            f"{r['stream_mb_s']:.0f} MB/s",
            f"{r['stream_mb_s'] / r['raw_tcp_mb_s']:.1%} of raw TCP; goal 150 MB/s",
        ),
        ("dial, p50 / max", f"{r['dial_ms_p50']:.1f} / {r['dial_ms_max']:.1f} ms", "vs 250 ms"),
        (
            f"propagation to all {args.nodes}, p50",
            f"{r['propagation_ms_p50']:.1f} ms",
            "",
        ),
        (
            f"propagation to all {args.nodes}, p99",
            f"{r['propagation_ms_p99']:.1f} ms",
            f"{r['propagation_ms_p99'] / 1000:.1%} of the 1 s goal",
        ),
        (
            "sustained orders, network-wide",
            f"{r['orders_per_s']:.0f} /s",
            f"{r['orders_per_s'] / 1000:.2f}x the 1,000/s goal; "
            f"{r['deliveries_per_s']:.0f} deliveries/s, lost {r['lost']}",
        ),
        (
            "CPU per order delivered to a node",
            f"{r['cpu_us_per_delivery']:.0f} us",
            f"all work / deliveries; a node with its own core: "
            f"~{1e6 / r['cpu_us_per_delivery']:.0f} orders/s (derived)",
        ),
    ]
    if "raw_verify_per_s" in r:
        per_node = 1e6 / r["cpu_us_per_delivery"]
        r["admitted_per_node_core_per_s"] = per_node
        r["vs_raw_verify"] = per_node / r["raw_verify_per_s"]
        rows.append(
            (
                "raw Ed25519 verify, same orders, CPU",
                f"{r['raw_verify_per_s']:.0f} /s",
                f"a node on its own core admits {r['vs_raw_verify']:.2f}x that; goal 0.5x",
            )
        )
    what = (
        "signed orders, Trader.receive_order as validator"
        if args.validator == "admission"
        else "raw bytes, trivial validator"
    )
    print(
        f"gossip benchmark: {args.nodes} libp2p nodes in one process, loopback; {what}; "
        f"orders of {r['order_bytes']:.0f} bytes"
    )
    for name, value, note in rows:
        print(f"  {name:<34} {value:>18}  {note}")
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}))
    if r["refused"]:
        print(f"{r['refused']} orders refused by admission", file=sys.stderr)
    return 1 if r["lost"] or r["refused"] else 0


if __name__ == "__main__":
    sys.exit(main())
