"""Reputation cost: admitting gossiped receipt summaries, and computing scores.

Measures in one run:
- raw: pairs of PyNaCl Ed25519 verifications per second over the exact bytes a summary's
  two signatures cover (the physical limit: every summary carries two);
- admission: protocol.reputation.open_summary per second (decode, schema, rules, both
  signatures, replay lookup) plus TrustGraph.add, which is what the node's topic
  validator does for each summary;
- scores: protocol.reputation.propagate (ROUNDS rounds) over graphs of 1,000, 10,000 and
  100,000 summaries among 1,000 keys; the node runs it at most once a maintenance period
  (1 s), in a worker thread.
Goal: admission >= 50% of raw. Prints a table, then one JSON line.
"""

from __future__ import annotations

import json
import random
import time

import nacl.signing

from protocol.identity import PrivateKey, signing_input
from protocol.reputation import (
    SUMMARY_DOMAIN,
    Outcome,
    ReceiptSummary,
    SignedSummary,
    TrustGraph,
    open_summary,
    propagate,
    sign_summary,
)

KEYS = 1_000
INCOMING = 3_000
GRAPHS = (1_000, 10_000, 100_000)
NOW = 1_800_000_000_000


def make_summaries(count: int, keys: list[PrivateKey], rng: random.Random) -> list[ReceiptSummary]:
    made = []
    for i in range(count):
        payer, payee = rng.sample(keys, 2)
        outcome = rng.choice((Outcome.COMPLETED,) * 6 + tuple(Outcome))
        amount = 0 if outcome is Outcome.PROVIDER_FAULT else rng.randint(1, 10**7)
        made.append(
            ReceiptSummary(
                agreement_id=i.to_bytes(32, "big"),
                payer=payer.public_key.raw,
                payee=payee.public_key.raw,
                amount=amount,
                stake=10**7,
                outcome=outcome,
                at_ms=NOW - rng.randint(0, 10**9),
            )
        )
    return made


def wires(summaries: list[ReceiptSummary], by_key: dict[bytes, PrivateKey]) -> list[bytes]:
    return [SignedSummary.by_both(s, by_key[s.payer], by_key[s.payee]).to_wire() for s in summaries]


def raw_rate(summaries: list[ReceiptSummary], by_key: dict[bytes, PrivateKey]) -> float:
    items: list[tuple[nacl.signing.VerifyKey, bytes, bytes]] = []
    for s in summaries:
        signed = signing_input(SUMMARY_DOMAIN, s.to_bytes())
        items.extend(
            (nacl.signing.VerifyKey(who), signed, sign_summary(by_key[who], s))
            for who in (s.payer, s.payee)
        )
    start = time.perf_counter()
    for verify_key, message, signature in items:
        verify_key.verify(message, signature)
    return len(summaries) / (time.perf_counter() - start)


def admission_rate(incoming: list[bytes]) -> float:
    known: set[bytes] = set()
    graph = TrustGraph()
    start = time.perf_counter()
    for wire in incoming:
        summary = open_summary(wire, now_ms=NOW, known=known.__contains__).summary
        known.add(summary.agreement_id)
        graph.add(summary)
    return len(incoming) / (time.perf_counter() - start)


def scores_ms(summaries: list[ReceiptSummary], me: bytes) -> tuple[float, int, int]:
    graph = TrustGraph()
    for s in summaries:
        graph.add(s)
    start = time.perf_counter()
    result = propagate(me, graph.links())
    return (time.perf_counter() - start) * 1000, len(graph.credit), len(result)


def main() -> None:
    rng = random.Random(9)
    keys = [PrivateKey.from_seed(rng.randbytes(32)) for _ in range(KEYS)]
    by_key = {k.public_key.raw: k for k in keys}
    incoming_summaries = make_summaries(INCOMING, keys, rng)
    incoming = wires(incoming_summaries, by_key)
    raws, admissions = [], []
    for _ in range(5):  # interleaved, so a burst of load on the shared machine hits both
        raws.append(raw_rate(incoming_summaries, by_key))
        admissions.append(admission_rate(incoming))
    raw, admitted = max(raws), max(admissions)
    ratio = admitted / raw
    print(f"summaries: {INCOMING} incoming, mean {sum(map(len, incoming)) / INCOMING:.0f} bytes")
    print(f"{'measure':<44}{'per second':>12}{'vs raw':>9}")
    print(f"{'raw: two Ed25519 verifies (PyNaCl)':<44}{raw:>12,.0f}{1.0:>9.2f}")
    print(f"{'admission (open_summary + TrustGraph.add)':<44}{admitted:>12,.0f}{ratio:>9.2f}")
    print(f"goal ratio >= 0.50: {'met' if ratio >= 0.5 else 'NOT met'}")
    figures: dict[str, object] = {
        "bench": "reputation",
        "raw_pairs_per_s": round(raw),
        "admission_per_s": round(admitted),
        "ratio": round(ratio, 3),
    }
    print(f"{'summaries':>10}{'edges':>9}{'scored':>8}{'propagate ms':>14}")
    graphs = []
    for count in GRAPHS:
        summaries = make_summaries(count, keys, rng)
        ms, edges, scored = min(scores_ms(summaries, keys[0].public_key.raw) for _ in range(2))
        print(f"{count:>10,}{edges:>9,}{scored:>8}{ms:>14.1f}")
        graphs.append({"summaries": count, "edges": edges, "scored": scored, "ms": round(ms, 1)})
    figures["propagate"] = graphs
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
