"""WAN emulator benchmark: what ``node/testnet/wan.py`` does to packets between namespaces.

This kernel has no ``sch_netem``, so a netns testnet's latency, jitter and loss come from a
userspace router (see its docstring). This measures, in one run, for a path between two
namespaces of a :class:`~node.testnet.netns.Lab`:
- one-way delay of UDP datagrams: both sockets live in this process (each made inside its
  own namespace), so send and receive times come from one clock; p50, p99, the spread
  p95 - p5 (jitter) and the share lost, against the configured latency, jitter and loss;
- TCP throughput through the router (it copies every packet in Python);
- the same with no impairment, the router's own cost: the baseline.
Datagrams go out every ``--gap-ms`` (default 25 ms, above the jitter: the router keeps each
path's packets in order, so datagrams sent closer than the jitter are held behind earlier
ones and the delay measured grows). Prints a table, then one JSON line. Needs root.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from node.testnet.netns import Host, Lab, entered
from node.testnet.wan import Impairment

PORT = 5001
CHUNK = 64 * 1024


def udp_path(a: Host, b: Host, *, count: int, gap_s: float) -> list[float | None]:
    """One-way delays (seconds) of ``count`` datagrams from ``a`` to ``b``; None: lost."""
    with entered(b.netns):
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rx.bind((b.address, PORT))
    with entered(a.netns):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    arrived: dict[int, float] = {}

    def receive() -> None:
        rx.settimeout(2.0)
        while len(arrived) < count:
            try:
                data = rx.recv(64)
            except TimeoutError:
                return
            seq, sent = struct.unpack("!Id", data[:12])
            arrived[seq] = time.monotonic() - sent

    receiver = threading.Thread(target=receive)
    receiver.start()
    for seq in range(count):
        tx.sendto(struct.pack("!Id", seq, time.monotonic()), (b.address, PORT))
        time.sleep(gap_s)
    receiver.join()
    tx.close()
    rx.close()
    return [arrived.get(seq) for seq in range(count)]


def tcp_throughput(a: Host, b: Host, *, megabytes: int) -> float:
    """MB/s of one TCP stream from ``a`` to ``b``."""
    with entered(b.netns):
        listener = socket.create_server((b.address, PORT + 1))
    total = megabytes * 1024 * 1024
    got = 0

    def sink() -> None:
        nonlocal got
        conn, _ = listener.accept()
        with conn:
            while chunk := conn.recv(CHUNK):
                got += len(chunk)

    receiver = threading.Thread(target=sink)
    receiver.start()
    with entered(a.netns):
        sender = socket.socket()
    sender.connect((b.address, PORT + 1))
    payload = b"\0" * CHUNK
    started = time.monotonic()
    sent = 0
    while sent < total:
        sender.sendall(payload)
        sent += len(payload)
    sender.close()
    receiver.join()
    elapsed = time.monotonic() - started
    listener.close()
    assert got == total, f"TCP delivered {got} of {total} bytes"
    return total / elapsed / 1e6


def measure(
    impairment: Impairment, *, count: int, gap_s: float, megabytes: int
) -> dict[str, float]:
    with Lab() as lab:
        a, b = lab.add_host("a"), lab.add_host("b")
        lab.start_wan(impairment, seed=1)
        delays = udp_path(a, b, count=count, gap_s=gap_s)
        mbps = tcp_throughput(a, b, megabytes=megabytes)
    got = sorted(d * 1000 for d in delays if d is not None)
    q = statistics.quantiles(got, n=100)
    return {
        "p50_ms": round(statistics.median(got), 2),
        "p99_ms": round(q[98], 2),
        "spread_ms": round(q[94] - q[4], 2),
        "lost": round(1 - len(got) / count, 4),
        "tcp_mb_s": round(mbps, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--jitter-ms", type=float, default=20.0)
    parser.add_argument("--loss", type=float, default=0.01)
    parser.add_argument("--count", type=int, default=2000, help="datagrams per path")
    parser.add_argument("--gap-ms", type=float, default=25.0)
    parser.add_argument("--megabytes", type=int, default=64, help="TCP bytes per path")
    args = parser.parse_args()
    impaired = Impairment(
        latency_s=args.latency_ms / 1000, jitter_s=args.jitter_ms / 1000, loss=args.loss
    )
    options = {"count": args.count, "gap_s": args.gap_ms / 1000}
    base = measure(Impairment(), megabytes=args.megabytes, **options)
    # A lossy path of 100 ms round trips carries TCP slowly: 1/32 of the bytes suffices.
    wan = measure(impaired, megabytes=max(1, args.megabytes // 32), **options)
    rows = [
        ("none (baseline)", base),
        (f"{args.latency_ms:g}/{args.jitter_ms:g} ms, {args.loss:.0%}", wan),
    ]
    print(f"{'impairment':<22}{'p50 ms':>9}{'p99 ms':>9}{'p95-p5':>9}{'lost':>8}{'TCP MB/s':>10}")
    for name, r in rows:
        print(
            f"{name:<22}{r['p50_ms']:>9}{r['p99_ms']:>9}{r['spread_ms']:>9}"
            f"{r['lost']:>8.2%}{r['tcp_mb_s']:>10}"
        )
    excess = wan["p50_ms"] - args.latency_ms
    print(f"median one-way delay over the configured latency: {excess:+.2f} ms")
    print(f"loss measured / configured: {wan['lost'] / args.loss if args.loss else 0:.2f}")
    print(json.dumps({"configured": vars(args), "baseline": base, "impaired": wan}))


if __name__ == "__main__":
    main()
