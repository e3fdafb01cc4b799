"""Network benchmark: gossip propagation and rate over real libp2p, beside raw baselines.

Measures in one run, on loopback, in one process (so 1 core does all the nodes' work):
- raw TCP throughput (trio sockets) and one yamux stream through node/p2p.py (Noise +
  yamux), and their ratio;
- dial latency of P2PNetwork.connect (libp2p's happy-eyeballs wait would make it >= 250 ms);
- a testnet of N nodes, each dialing 3 earlier ones: offer propagation to *every* node,
  p50 and p99 over offers published one at a time from random nodes;
- sustained order rate with no loss: several nodes publish a burst of orders, the clock
  stops when every node holds every order; any loss fails the run (exit 1).
Goals (issue 5): propagation p99 < 1 s; >= 1,000 orders/s network-wide; stream >= 150 MB/s.
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

import trio

from node.p2p import P2PNetwork, serve_network
from node.transport import FramedStream, Gossip, PeerId, ProtocolId, Stream, Verdict
from protocol.identity import PrivateKey

TOPIC = "cx/bench/offers/v1"
SINK = ProtocolId("/cx/bench/sink/1")
CHUNK = 64 * 1024


def accept(sender: PeerId, data: bytes) -> Verdict:
    return Verdict.ACCEPT


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
    async with trio.open_nursery() as nursery:
        start = time.perf_counter()
        nets: list[P2PNetwork] = [
            await nursery.start(serve_network, PrivateKey.from_seed(bytes([i + 1]) * 32))
            for i in range(args.nodes)
        ]
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

        inboxes = [await net.subscribe(TOPIC, accept) for net in nets]
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
            for n in range(args.offers):
                origin = rng.randrange(args.nodes)
                data = b"offer-%06d" % n + b"\0" * 200
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
                burst.append((origin, b"order-%07d" % n + b"\0" * 150))
                for k in range(args.nodes):
                    if k != origin:
                        expected[k] += 1
            start = time.perf_counter()
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
            result["orders"] = args.orders
            result["orders_per_s"] = args.orders / elapsed
            result["deliveries_per_s"] = args.orders * (args.nodes - 1) / elapsed
            result["bundles"] = sum(net.stats["bundles"] for net in nets)
            result["lost"] = sum(expected) - sum(len(a) for a in arrivals)
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
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    started = time.perf_counter()
    r = trio.run(testnet, args)
    r["nodes"] = args.nodes
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
    ]
    print(f"gossip benchmark: {args.nodes} libp2p nodes in one process, loopback")
    for name, value, note in rows:
        print(f"  {name:<34} {value:>18}  {note}")
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}))
    return 1 if r["lost"] else 0


if __name__ == "__main__":
    sys.exit(main())
