"""The tape's cost: trade prints verified and stored per second, beside orders
(bench/ingest.py prints the admission rate beside its own figures too).

Measures in one run:
- raw: PyNaCl verifications per second of the prints' signatures (two per print: the
  physical limit is half this many prints per second);
- admit: Tape.admit per second (decode, both signatures, replay guard, insert in order);
- admit + store: the same plus the node's SQLite insert of the prints (node.db's tape
  table, WAL, synchronous=FULL), in one transaction per second's worth as a node batches
  them, and (for comparison) one commit per print;
- orders: Trader.receive_order per second of gossiped orders (bench/ingest.py's pipeline)
  into a book of 10,000, the baseline a print competes with for the node's time.
Prints a table, then one JSON line.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import nacl.signing
from factories import GIB, T0, key
from ingest import RESTING, Nonces, make_orders, pipeline_rate

from node.storage.db import Database
from protocol.encoding import decode, encode
from protocol.identity import signing_input
from protocol.messages import Prices, Resources
from protocol.schema import to_value
from protocol.tape import TRADE_PRINT_DOMAIN, SignedPrint, Tape, TradePrint, sign_print

PRINTS = 4_000
PARTIES = 50


def make_prints(count: int) -> list[SignedPrint]:
    buyers = [key(f"buyer-{i}") for i in range(PARTIES)]
    providers = [key(f"provider-{i}") for i in range(PARTIES)]
    out = []
    for i in range(count):
        buyer, provider = buyers[i % PARTIES], providers[(i * 7) % PARTIES]
        trade = TradePrint(
            trade_id=i.to_bytes(32, "big"),
            resource_class=("amd64/cpu/eu", "amd64/cpu/us", "arm64/cpu/ap")[i % 3],
            prices=Prices(cpu_core_hour=50_000_000 + i * 997 % 100_000_000, memory_gib_hour=9),
            resources=Resources(cpu_milli=500 * (1 + i % 8), memory_bytes=GIB),
            at_ms=T0 + i,
            buyer=buyer.public_key.raw,
            provider=provider.public_key.raw,
        )
        out.append(
            SignedPrint.assemble(trade, sign_print(buyer, trade), sign_print(provider, trade))
        )
    return out


def raw_rate(prints: list[SignedPrint]) -> float:
    items = []
    for p in prints:
        raw = signing_input(TRADE_PRINT_DOMAIN, encode(to_value(p.trade)))
        signature = decode(p.wire)["buyer_sig"]  # type: ignore[index]
        items.append((nacl.signing.VerifyKey(p.trade.buyer), raw, signature))
    start = time.perf_counter()
    for verify_key, message, signature in items:
        verify_key.verify(message, signature)
    return len(items) / (time.perf_counter() - start)


def admit_rate(prints: list[SignedPrint], db: Database | None, batch: int = 1) -> float:
    tape = Tape()
    now = T0 + len(prints)
    pending: list[tuple[bytes, int, bytes]] = []
    start = time.perf_counter()
    for p in prints:
        signed = tape.admit(p.wire, now_ms=now)
        if db is not None:
            pending.append((signed.trade.trade_id, signed.trade.at_ms, signed.wire))
            if len(pending) >= batch:
                db.save_prints(pending)
                pending = []
    if db is not None and pending:
        db.save_prints(pending)
    return len(prints) / (time.perf_counter() - start)


def main() -> None:
    prints = make_prints(PRINTS)
    raw = max(raw_rate(prints) for _ in range(3))
    admit = max(admit_rate(prints, None) for _ in range(3))
    with tempfile.TemporaryDirectory() as root:
        batched = max(
            admit_rate(prints, Database(Path(root) / f"b{i}.db"), batch=500) for i in range(3)
        )
        single = admit_rate(prints[:500], Database(Path(root) / "single.db"))
    resting = make_orders(RESTING, Nonces("resting"), T0)
    incoming = make_orders(PRINTS, Nonces("incoming"), T0 + RESTING)
    orders = max(pipeline_rate(resting, incoming)[0] for _ in range(3))
    size = sum(len(p.wire) for p in prints) / len(prints)
    print(f"prints: {PRINTS} (mean {size:.0f} bytes, two signatures each)")
    print(f"{'measure':<46}{'per second':>12}{'vs orders':>11}")
    rows = [
        ("Ed25519 verify (PyNaCl), one signature", raw),
        ("prints admitted (Tape.admit)", admit),
        ("prints admitted and stored, batched", batched),
        ("prints admitted and stored, a commit each", single),
        ("orders ingested (Trader.receive_order)", orders),
    ]
    for name, rate in rows:
        print(f"{name:<46}{rate:>12,.0f}{rate / orders:>11.2f}")
    print(f"admit vs the two-signature limit: {admit / (raw / 2):.2f}")
    print(
        json.dumps(
            {
                "bench": "tape",
                "verify_per_s": round(raw),
                "admit_per_s": round(admit),
                "admit_store_per_s": round(batched),
                "admit_store_unbatched_per_s": round(single),
                "orders_per_s": round(orders),
                "admit_vs_orders": round(admit / orders, 3),
                "admit_store_vs_orders": round(batched / orders, 3),
                "admit_vs_two_verifies": round(admit / (raw / 2), 3),
                "mean_print_bytes": round(size),
            }
        )
    )


if __name__ == "__main__":
    main()
