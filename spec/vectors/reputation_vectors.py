"""The reputation vectors (spec/reputation.md#test-vectors), written by generate.py into
spec/vectors/reputation/: receipt summaries to admit or refuse, outcome classes, scores."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

from protocol.encoding import encode
from protocol.errors import DecodeError, InvalidMessage
from protocol.identity import PrivateKey
from protocol.messages import ExitReason
from protocol.reputation import (
    HORIZON_MS,
    OUTCOME_OF,
    Outcome,
    ReceiptSummary,
    SignedSummary,
    open_summary,
    scores,
    sign_summary,
)
from protocol.schema import to_value

OUT = Path(__file__).resolve().parent / "reputation"
NOW = 1_800_000_000_000
NAMES = ("me", "alice", "bob", "carol", "dave", "sybil-1", "sybil-2", "sybil-3")


def key(name: str) -> PrivateKey:
    return PrivateKey.from_seed(hashlib.sha256(f"reputation/{name}".encode()).digest())


def agreement(label: str) -> bytes:
    return hashlib.sha256(f"agreement/{label}".encode()).digest()


def _write(name: str, kind: str, cases: list[dict[str, object]]) -> None:
    OUT.mkdir(exist_ok=True)
    body = {"kind": kind, "format": "spec/reputation.md#test-vectors", "cases": cases}
    (OUT / f"{name}.json").write_text(json.dumps(body, indent=1) + "\n")


def _wire(summary: ReceiptSummary, payer: PrivateKey, payee: PrivateKey) -> bytes:
    return SignedSummary.by_both(summary, payer, payee).to_wire()


def summaries() -> None:
    alice, bob = key("alice"), key("bob")
    base = ReceiptSummary(
        agreement_id=agreement("1"),
        payer=alice.public_key.raw,
        payee=bob.public_key.raw,
        amount=1_250_000,
        stake=2_000_000,
        outcome=Outcome.COMPLETED,
        at_ms=NOW - 60_000,
    )
    fault = replace(base, agreement_id=agreement("2"), amount=0, outcome=Outcome.PROVIDER_FAULT)
    other_amount = sign_summary(alice, replace(base, amount=1))
    bare = {"summary": base.to_bytes(), "payee_sig": sign_summary(bob, base)}
    alone = replace(base, payee=alice.public_key.raw)
    cases: list[tuple[str, bytes, tuple[bytes, ...]]] = [
        ("completed", _wire(base, alice, bob), ()),
        ("provider fault, paid nothing", _wire(fault, alice, bob), ()),
        ("issued at the edge of the clock skew", _wire(replace(base, at_ms=NOW + 30_000),
                                                       alice, bob), ()),
        ("forged: the payer signed another amount", SignedSummary(
            summary=base, payer_signature=other_amount,
            payee_signature=sign_summary(bob, base)).to_wire(), ()),
        ("signed by the payer for both parties", SignedSummary(
            summary=base, payer_signature=sign_summary(alice, base),
            payee_signature=sign_summary(alice, base)).to_wire(), ()),
        ("one signature", encode(bare), ()),
        ("self-dealing", _wire(alone, alice, alice), ()),
        ("replayed: agreement summarised already", _wire(base, alice, bob), (agreement("1"),)),
        ("from the future", _wire(replace(base, at_ms=NOW + 30_001), alice, bob), ()),
        ("older than the horizon", _wire(replace(base, at_ms=NOW - HORIZON_MS - 1), alice,
                                         bob), ()),
        ("pays more than was at stake", _wire(replace(base, amount=2_000_001), alice, bob), ()),
        ("a provider fault that was paid", _wire(replace(fault, amount=1), alice, bob), ()),
        ("agreement id not a hash", _wire(replace(base, agreement_id=b"1"), alice, bob), ()),
        ("not a map", encode([base.to_bytes()]), ()),
    ]  # fmt: skip
    out: list[dict[str, object]] = []
    for name, wire, known in cases:
        case: dict[str, object] = {
            "name": name,
            "wire": wire.hex(),
            "now_ms": NOW,
            "known": [k.hex() for k in known],
        }
        try:
            signed = open_summary(wire, now_ms=NOW, known=lambda a, k=known: a in k)  # type: ignore[misc]
        except (DecodeError, InvalidMessage) as exc:
            case.update(valid=False, error=exc.reason.value)
        else:
            value = to_value(signed.summary)
            case.update(valid=True, summary={k: _hex(v) for k, v in value.items()})
        out.append(case)
    _write("summaries", "summaries", out)


def _hex(value: object) -> object:
    return value.hex() if isinstance(value, bytes) else value


def outcomes() -> None:
    cases = [{"name": r.value, "exit_reason": r.value, "outcome": OUTCOME_OF[r].value}
             for r in ExitReason]  # fmt: skip
    _write("outcomes", "outcomes", cases)


# Each receipt: (payer, payee, amount, stake, outcome); agreement ids are their positions.
Receipt = tuple[str, str, int, int, Outcome]
_C, _J, _F, _A = Outcome.COMPLETED, Outcome.JOB_FAULT, Outcome.PROVIDER_FAULT, Outcome.ABANDONED
GRAPHS: list[tuple[str, list[Receipt]]] = [
    ("no receipts: no one has a score", []),
    ("one completed receipt", [("me", "alice", 1_000, 1_000, _C)]),
    ("a provider fault lowers the score", [("me", "alice", 1_000, 1_000, _C),
                                           ("me", "alice", 0, 500, _F)]),
    ("a job fault is neutral for the provider", [("me", "alice", 1_000, 1_000, _C),
                                                 ("me", "alice", 300, 500, _J)]),
    ("abandoned counts against the provider for what was left undone",
     [("me", "alice", 1_000, 1_000, _C), ("me", "alice", 200, 1_000, _A)]),
    ("faults only: no trust", [("me", "alice", 0, 500, _F)]),
    ("trust is shared by amount paid", [("me", "alice", 3_000, 3_000, _C),
                                        ("me", "bob", 1_000, 1_000, _C)]),
    ("trust flows on through receipts others signed", [("me", "alice", 1_000, 1_000, _C),
                                                       ("bob", "alice", 1_000, 1_000, _C),
                                                       ("bob", "carol", 1_000, 1_000, _C)]),
    ("a sybil ring with no receipt from trusted nodes has nothing",
     [("me", "alice", 1_000, 1_000, _C), ("sybil-1", "sybil-2", 10**12, 10**12, _C),
      ("sybil-2", "sybil-1", 10**12, 10**12, _C)]),
    ("a sybil ring gets what it paid into the trusted graph, whatever it trades inside",
     [("me", "alice", 1_000, 1_000, _C), ("sybil-1", "alice", 10, 10, _C),
      ("sybil-1", "sybil-2", 10**12, 10**12, _C), ("sybil-2", "sybil-3", 10**12, 10**12, _C),
      ("sybil-3", "sybil-1", 10**12, 10**12, _C)]),
    ("the same ring trading a million times less", [
      ("me", "alice", 1_000, 1_000, _C), ("sybil-1", "alice", 10, 10, _C),
      ("sybil-1", "sybil-2", 10**6, 10**6, _C), ("sybil-2", "sybil-3", 10**6, 10**6, _C),
      ("sybil-3", "sybil-1", 10**6, 10**6, _C)]),
]  # fmt: skip


def graph_summaries(receipts: list[Receipt]) -> list[ReceiptSummary]:
    return [
        ReceiptSummary(
            agreement_id=agreement(f"graph/{i}"),
            payer=key(payer).public_key.raw,
            payee=key(payee).public_key.raw,
            amount=amount,
            stake=stake,
            outcome=outcome,
            at_ms=NOW,
        )
        for i, (payer, payee, amount, stake, outcome) in enumerate(receipts)
    ]


def graph_scores() -> None:
    by_key = {key(n).public_key.raw: n for n in NAMES}
    cases = []
    for name, receipts in GRAPHS:
        result = scores(key("me").public_key.raw, graph_summaries(receipts))
        cases.append(
            {
                "name": name,
                "me": "me",
                "receipts": [[p, q, a, s, o.value] for p, q, a, s, o in receipts],
                "scores": {by_key[k]: v for k, v in result.items()},
            }
        )
    _write("scores", "scores", cases)


def reputation() -> None:
    summaries()
    outcomes()
    graph_scores()
