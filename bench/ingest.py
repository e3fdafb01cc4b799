"""Ingest throughput: the full order pipeline against raw Ed25519 verification.

Measures in one run, on the same signed messages:
- raw: PyNaCl verifications per second of the exact signed bytes (the physical limit);
- pipeline: Trader.receive_order per second (decode + verify + admit + insert into the book
  + match), into a book already holding 10,000 resting orders, with a handful of the node's
  own active orders for incoming ones to match against.
Goal: pipeline >= 50% of raw. Prints a table, then one JSON line.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import nacl.signing
from factories import GIB, HOUR_MS, T0, Nonces, bid, key, offer

from protocol.envelope import SIGNATURE_SIZE, domain_of, open_signed
from protocol.identity import signing_input
from protocol.messages import Arch, Constraints
from protocol.trader import Trader

RESTING = 10_000
INCOMING = 4_000
SIGNERS = 200


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


def raw_verify_rate(wires: list[bytes]) -> float:
    items = []
    for wire in wires:  # parse outside the timed loop: only the verification is timed
        msg = open_signed(wire)
        signed = signing_input(domain_of(msg.type), msg.body)
        items.append((nacl.signing.VerifyKey(msg.signer.raw), signed, wire[:SIGNATURE_SIZE]))
    start = time.perf_counter()
    for verify_key, message, signature in items:
        verify_key.verify(message, signature)
    return len(items) / (time.perf_counter() - start)


def pipeline_rate(resting: list[bytes], incoming: list[bytes]) -> tuple[float, int, int]:
    node = Trader(key("the node"))
    nonce = Nonces("own")
    for i in range(3):  # our own standing bids and one offer, which incoming orders meet
        node.post(bid(cpu_limit=90_000 + i), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    node.post(offer(cpu_price=60_000), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    for wire in resting:
        node.receive_order(wire, now_ms=T0 + RESTING)
    book_size = len(node.book)
    matches = 0
    start = time.perf_counter()
    for wire in incoming:
        _, made = node.receive_order(wire, now_ms=T0 + RESTING + INCOMING)
        matches += len(made)
    return len(incoming) / (time.perf_counter() - start), book_size, matches


def main() -> None:
    resting = make_orders(RESTING, Nonces("resting"), T0)
    incoming = make_orders(INCOMING, Nonces("incoming"), T0 + RESTING)
    raw = max(raw_verify_rate(incoming) for _ in range(3))
    pipeline, book_size, matches = max(pipeline_rate(resting, incoming) for _ in range(3))
    ratio = pipeline / raw
    mean_size = sum(map(len, incoming)) / len(incoming)
    print(f"orders: {INCOMING} incoming (mean {mean_size:.0f} bytes) into a book of {book_size}")
    print(f"{'measure':<40}{'per second':>12}{'vs raw':>9}")
    print(f"{'raw Ed25519 verify (PyNaCl)':<40}{raw:>12,.0f}{1.0:>9.2f}")
    print(f"{'ingest pipeline (Trader.receive_order)':<40}{pipeline:>12,.0f}{ratio:>9.2f}")
    print(
        f"matches made against own orders: {matches}; goal ratio >= 0.50: "
        f"{'met' if ratio >= 0.5 else 'NOT met'}"
    )
    digest = hashlib.sha256(b"".join(incoming)).hexdigest()[:12]
    print(
        json.dumps(
            {
                "bench": "ingest",
                "raw_verify_per_s": round(raw),
                "pipeline_per_s": round(pipeline),
                "ratio": round(ratio, 3),
                "book_size": book_size,
                "incoming": INCOMING,
                "mean_order_bytes": round(mean_size),
                "matches": matches,
                "orders_digest": digest,
            }
        )
    )


if __name__ == "__main__":
    main()
