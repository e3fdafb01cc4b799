"""Ingest throughput: the full order pipeline against raw Ed25519 verification.

Measures in one run, on the same signed messages:
- raw: PyNaCl verifications per second of the exact signed bytes (the physical limit);
- pipeline: Trader.receive_order per second (decode + verify + admit + insert into the book
  + match), into a book already holding 10,000 resting orders, with a handful of the node's
  own active orders for incoming ones to match against.
Goal: pipeline >= 0.8x raw. The two alternate every CHUNK orders, so a noisy neighbour
slows both alike; the ratio is the median of the rounds' ratios (wall clock; the CPU-time
ratio is printed beside it). The process's garbage collector is set as `cx node` sets
it (node/gc_policy.py). Prints a table, then one
JSON line.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import nacl.signing
from factories import GIB, HOUR_MS, T0, Nonces, bid, key, offer

from node.gc_policy import tune_gc
from protocol.envelope import SIGNATURE_SIZE, domain_of, open_signed
from protocol.identity import signing_input
from protocol.messages import Arch, Constraints
from protocol.trader import Trader

RESTING = 10_000
INCOMING = 4_000
SIGNERS = 200
ROUNDS = 5
CHUNK = 100
GOAL = 0.8


def make_orders(count: int, nonce: Nonces, start_ms: int) -> list[bytes]:
    signers = [key(f"signer-{i}") for i in range(SIGNERS)]
    wires = []
    for i in range(count):
        signer = signers[i % SIGNERS]
        if i % 2:
            payload = offer(
                cpu_milli=1000 * (1 + i % 16),
                memory=GIB * (1 + i % 64),
                cpu_price=50_000 + (i * 7919) % 100_000,
                region=("eu", "us", "ap")[i % 3],
                arch=(Arch.AMD64, Arch.ARM64)[i % 5 == 0],
            )
        else:
            payload = bid(
                cpu_milli=500 * (1 + i % 8),
                memory=GIB // 2 * (1 + i % 16),
                cpu_limit=40_000 + (i * 104_729) % 120_000,
                constraints=Constraints(regions=(("eu", "us", "ap")[i % 3],)),
            )
        trader = Trader(signer)
        order, _ = trader.post(payload, nonce=nonce(), now_ms=start_ms + i, ttl_ms=HOUR_MS)
        wires.append(order.wire)
    return wires


@dataclass(slots=True)
class Clock:
    """Wall and CPU seconds spent on one side of the comparison."""

    wall: float = 0.0
    cpu: float = 0.0

    def add(self, wall: float, cpu: float) -> None:
        self.wall += wall
        self.cpu += cpu


def verify_items(wires: list[bytes]) -> list[tuple[nacl.signing.VerifyKey, bytes, bytes]]:
    """Parsed outside the timed loop: raw verification times only the verification."""
    items = []
    for wire in wires:
        msg = open_signed(wire)
        signed = signing_input(domain_of(msg.type), msg.body)
        items.append((nacl.signing.VerifyKey(msg.signer.raw), signed, wire[:SIGNATURE_SIZE]))
    return items


def fresh_node(resting: list[bytes]) -> Trader:
    node = Trader(key("the node"))
    nonce = Nonces("own")
    for i in range(3):  # our own standing bids and one offer, which incoming orders meet
        node.post(bid(cpu_limit=90_000 + i), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    node.post(offer(cpu_price=60_000), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    for wire in resting:
        node.receive_order(wire, now_ms=T0 + RESTING)
    return node


def pipeline_rate(resting: list[bytes], incoming: list[bytes]) -> tuple[float, int, int]:
    """Orders per second through the pipeline alone (bench/tape.py compares with it), the
    book's size and the matches made."""
    node = fresh_node(resting)
    book_size, matches = len(node.book), 0
    start = time.perf_counter()
    for wire in incoming:
        _, made = node.receive_order(wire, now_ms=T0 + RESTING + INCOMING)
        matches += len(made)
    return len(incoming) / (time.perf_counter() - start), book_size, matches


def one_round(
    resting: list[bytes], incoming: list[bytes], raw: Clock, pipeline: Clock
) -> tuple[int, int]:
    """Both sides over the same orders, alternating every CHUNK orders."""
    items = verify_items(incoming)
    node = fresh_node(resting)
    book_size = len(node.book)
    matches = 0
    now_ms = T0 + RESTING + INCOMING
    for at in range(0, len(incoming), CHUNK):
        wall, cpu = time.perf_counter(), time.process_time()
        for verify_key, message, signature in items[at : at + CHUNK]:
            verify_key.verify(message, signature)
        raw.add(time.perf_counter() - wall, time.process_time() - cpu)
        wall, cpu = time.perf_counter(), time.process_time()
        for wire in incoming[at : at + CHUNK]:
            _, made = node.receive_order(wire, now_ms=now_ms)
            matches += len(made)
        pipeline.add(time.perf_counter() - wall, time.process_time() - cpu)
    return book_size, matches


def main() -> None:
    tune_gc()  # as `cx node` does: the collector's settings are part of the pipeline
    resting = make_orders(RESTING, Nonces("resting"), T0)
    incoming = make_orders(INCOMING, Nonces("incoming"), T0 + RESTING)
    load_before = os.getloadavg()[0]
    ratios, cpu_ratios, raw_rates, pipeline_rates = [], [], [], []
    for _ in range(ROUNDS):
        raw, pipeline = Clock(), Clock()
        book_size, matches = one_round(resting, incoming, raw, pipeline)
        ratios.append(raw.wall / pipeline.wall)
        cpu_ratios.append(raw.cpu / pipeline.cpu)
        raw_rates.append(INCOMING / raw.wall)
        pipeline_rates.append(INCOMING / pipeline.wall)
    load_after = os.getloadavg()[0]
    ratio, cpu_ratio = statistics.median(ratios), statistics.median(cpu_ratios)
    raw_rate, pipeline_rate = statistics.median(raw_rates), statistics.median(pipeline_rates)
    mean_size = sum(map(len, incoming)) / len(incoming)
    print(f"orders: {INCOMING} incoming (mean {mean_size:.0f} bytes) into a book of {book_size}")
    print(
        f"{ROUNDS} rounds alternating every {CHUNK} orders, medians; "
        f"load average {load_before:.1f}-{load_after:.1f}"
    )
    print(f"{'measure':<40}{'per second':>12}{'vs raw':>9}{'CPU vs raw':>12}")
    print(f"{'raw Ed25519 verify (PyNaCl)':<40}{raw_rate:>12,.0f}{1.0:>9.2f}{1.0:>12.2f}")
    print(
        f"{'ingest pipeline (Trader.receive_order)':<40}{pipeline_rate:>12,.0f}"
        f"{ratio:>9.2f}{cpu_ratio:>12.2f}"
    )
    print(f"ratio per round: {' '.join(f'{r:.2f}' for r in ratios)}")
    print(
        f"matches made against own orders: {matches}; goal ratio >= {GOAL}: "
        f"{'met' if ratio >= GOAL else 'NOT met'}"
    )
    # The tape's prints compete for the same node's time (bench/tape.py for the detail).
    from tape import PRINTS, admit_rate, make_prints

    prints_rate = statistics.median(admit_rate(make_prints(PRINTS), None) for _ in range(3))
    print(
        f"{'trade prints admitted (Tape.admit)':<40}{prints_rate:>12,.0f}"
        f"{prints_rate / raw_rate:>9.2f}   ({prints_rate / pipeline_rate:.2f}x the orders)"
    )
    digest = hashlib.sha256(b"".join(incoming)).hexdigest()[:12]
    print(
        json.dumps(
            {
                "bench": "ingest",
                "prints_per_s": round(prints_rate),
                "prints_vs_orders": round(prints_rate / pipeline_rate, 3),
                "raw_verify_per_s": round(raw_rate),
                "pipeline_per_s": round(pipeline_rate),
                "ratio": round(ratio, 3),
                "ratio_min": round(min(ratios), 3),
                "ratio_max": round(max(ratios), 3),
                "cpu_ratio": round(cpu_ratio, 3),
                "rounds": ROUNDS,
                "book_size": book_size,
                "incoming": INCOMING,
                "mean_order_bytes": round(mean_size),
                "matches": matches,
                "load_average": [round(load_before, 2), round(load_after, 2)],
                "orders_digest": digest,
            }
        )
    )


if __name__ == "__main__":
    main()
