"""How the order book's costs grow: ingest rate, match latency and memory at 10^3..10^6 orders.

One node's book (``protocol.trader.Trader``) grows from empty to 10^6 resting orders, half
offers and half bids from 200 signers, every one signed and admitted through the real
``Trader.receive_order``. At 10^3, 10^4, 10^5 and 10^6 resting orders it measures:
- ingest: INCOMING fresh gossiped orders into the book, per second (wall clock) and CPU
  microseconds each (decode + verify + admit + insert + match against our own orders);
- match: our own bid posted against the whole book (``Trader.post``: it searches the
  book's price grid, protocol/offer_index.py, for the cheapest offer that fits), median
  and worst of MATCHES, each taken back afterwards;
- memory: resident set growth per resting order since the book was empty.
The baseline is the same figures at 10^3 in the same run; goal: no more than 1.5x slower
at 10^6. Orders are made by patching prices, signer and nonce into encoded templates (every
one a canonical body, then signed), so making a million takes seconds, not minutes.
The garbage collector is set as `cx node` sets it (node/gc_policy.py).
Prints a table, then one JSON line.
Usage: .venv/bin/python bench/book.py [--max-exp 6]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from factories import GIB, HOUR_MS, T0, Nonces, bid, key, offer

from node.gc_policy import tune_gc
from protocol.envelope import domain_of, seal
from protocol.identity import PrivateKey
from protocol.messages import Arch, Constraints
from protocol.trader import Trader

SIGNERS = 200
INCOMING = 2_000
MATCHES = 21
GOAL = 1.5
_CPU_PRICE = b"\xadcpu_core_hour\xce"  # the key, then a uint32
_MEM_PRICE = b"\xafmemory_gib_hour\xcd"  # the key, then a uint16
_NONCE = b"\xa5nonce\xc4\x10"
_FROM = b"\xa4from\xc4\x20"


class OrderMaker:
    """Signed offers and bids, each with its own prices, signer and nonce."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._signers = [key(f"book-signer-{i}") for i in range(SIGNERS)]
        self._nonce = Nonces(f"book-{seed}")
        templates = []
        for i in range(48):
            if i % 2:
                payload = offer(
                    cpu_milli=1000 * (1 + i % 16),
                    memory=GIB * (1 + i % 64),
                    cpu_price=100_000,
                    mem_price=10_000,
                    region=("eu", "us", "ap")[i % 3],
                    arch=(Arch.AMD64, Arch.ARM64)[i % 5 == 0],
                )
            else:
                payload = bid(
                    cpu_milli=500 * (1 + i % 8),
                    memory=GIB // 2 * (1 + i % 16),
                    cpu_limit=100_000,
                    mem_limit=10_000,
                    constraints=Constraints(regions=(("eu", "us", "ap")[i % 3],)),
                )
            sealed = seal(
                self._signers[0], payload, nonce=bytes(16), issued_ms=T0, expires_ms=T0 + HOUR_MS
            )
            templates.append((sealed.type, sealed.body))
        self._templates = templates

    def make(self) -> bytes:
        kind, body = self._rng.choice(self._templates)
        signer: PrivateKey = self._rng.choice(self._signers)
        patched = bytearray(body)
        _patch(patched, _CPU_PRICE, self._rng.randrange(100_000, 1_000_000).to_bytes(4, "big"))
        _patch(patched, _MEM_PRICE, self._rng.randrange(1_000, 60_000).to_bytes(2, "big"))
        _patch(patched, _NONCE, self._nonce())
        _patch(patched, _FROM, signer.public_key.raw)
        data = bytes(patched)
        return signer.sign(domain_of(kind), data) + data


def _patch(body: bytearray, marker: bytes, value: bytes) -> None:
    at = body.index(marker) + len(marker)
    body[at : at + len(value)] = value


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def ingest(node: Trader, wires: list[bytes]) -> tuple[float, float]:
    """Orders per second (wall) and CPU µs per order."""
    wall, cpu = time.perf_counter(), time.process_time()
    for wire in wires:
        node.receive_order(wire, now_ms=T0 + 1)
    return len(wires) / (time.perf_counter() - wall), (time.process_time() - cpu) / len(wires) * 1e6


def match_latency(node: Trader, nonce: Nonces) -> tuple[float, float, int]:
    """Median and worst ms for our own bid to meet the book; how many matched."""
    times, matched = [], 0
    for i in range(MATCHES):
        payload = bid(cpu_milli=1000 + i, memory=GIB, cpu_limit=900_000, mem_limit=60_000)
        start = time.perf_counter()
        order, matches = node.post(payload, nonce=nonce(), now_ms=T0 + 1, ttl_ms=HOUR_MS)
        times.append((time.perf_counter() - start) * 1e3)
        matched += len(matches)
        for made in matches:  # take it back: the next bid meets the same book
            node.book.release(made, rest_bid=False)
        if not matches:
            node.cancel(order.id, nonce=nonce(), now_ms=T0 + 1)
    return statistics.median(times), max(times), matched


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-exp", type=int, default=6, help="largest book: 10^N orders")
    args = parser.parse_args()
    tune_gc()  # as `cx node` does
    maker = OrderMaker(seed=14)
    node = Trader(key("the node"))
    own = Nonces("own")
    load_before = os.getloadavg()[0]
    empty_rss = rss_bytes()
    rows = []
    for exp in range(3, args.max_exp + 1):
        while len(node.book) < 10**exp:
            node.receive_order(maker.make(), now_ms=T0 + 1)
        size = len(node.book)
        per_order = (rss_bytes() - empty_rss) / size
        fresh = [maker.make() for _ in range(INCOMING)]
        rate, cpu_us = ingest(node, fresh)
        median_ms, worst_ms, matched = match_latency(node, own)
        rows.append(
            {
                "orders": size,
                "ingest_per_s": round(rate),
                "ingest_cpu_us": round(cpu_us, 1),
                "match_ms_p50": round(median_ms, 3),
                "match_ms_max": round(worst_ms, 3),
                "matched": matched,
                "bytes_per_order": round(per_order),
            }
        )
    load_after = os.getloadavg()[0]
    base = rows[0]
    print(f"order book growth; load average {load_before:.1f}-{load_after:.1f}")
    print(
        f"{'orders':>10}{'ingest/s':>10}{'CPU µs':>8}{'vs 10^3':>9}"
        f"{'match p50 ms':>14}{'vs 10^3':>9}{'max ms':>9}{'bytes/order':>13}"
    )

    def growth(row: dict[str, Any]) -> tuple[float, float]:
        """How much slower ingest and matching are than at 10^3."""
        return base["ingest_per_s"] / row["ingest_per_s"], row["match_ms_p50"] / base[
            "match_ms_p50"
        ]

    for row in rows:
        ingest_x, match_x = growth(row)
        print(
            f"{row['orders']:>10,}{row['ingest_per_s']:>10,}{row['ingest_cpu_us']:>8}"
            f"{ingest_x:>8.2f}x{row['match_ms_p50']:>14.3f}{match_x:>8.2f}x"
            f"{row['match_ms_max']:>9.3f}{row['bytes_per_order']:>13,}"
        )
    last = rows[-1]
    ingest_growth, match_growth = growth(last)
    print(
        f"at {last['orders']:,} vs 10^3: ingest {ingest_growth:.2f}x slower, match "
        f"{match_growth:.2f}x; goal <= {GOAL}x: "
        f"{'met' if max(ingest_growth, match_growth) <= GOAL else 'NOT met'}"
    )
    print(
        json.dumps(
            {
                "bench": "book",
                "rows": rows,
                "ingest_growth": round(ingest_growth, 2),
                "match_growth": round(match_growth, 2),
                "load_average": [round(load_before, 2), round(load_after, 2)],
            }
        )
    )


if __name__ == "__main__":
    main()
