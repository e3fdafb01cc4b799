"""Reputation from receipts: receipt summaries and the local trust formula (spec/reputation.md).

Rules:
- A :class:`ReceiptSummary` states what a countersigned receipt settled and nothing of the
  job: agreement id, payer (the buyer), payee (the provider), amount paid, what was at
  stake (the agreement's ``max_cost``), the outcome class and the receipt's time. Both
  parties derive the same summary from the receipt they both hold (:func:`summarize`), and
  each signs its canonical encoding under ``cx/receipt-summary/v1``. The wire form is
  ``{"summary": bytes, "payer_sig": bytes, "payee_sig": bytes}``. New signatures are needed:
  the parties' existing signatures cover the whole receipt, whose outputs and logs are job
  content (their digests fetch the blobs from the provider).
- A summary is refused when a signature is missing (``missing-field``), either signature
  does not verify (``bad-signature``), payer and payee are one key (``self-dealing``), the
  amounts are impossible (``bad-field``), it is from the future or older than the horizon
  (``not-yet-valid``, ``expired``), or its agreement is summarised already (``replayed``).
- The outcome class comes from the receipt's exit reason (:data:`OUTCOME_OF`).
- Scores are personalised and computed in integers: trust starts at this node and flows
  along edges weighted by amounts paid, for a fixed number of rounds (:func:`scores`).

Pure: no clock, no I/O; ``now_ms`` and the set of known agreements come in as arguments.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from protocol.encoding import decode, encode
from protocol.errors import InvalidMessage, LocalProtocolError, Reason
from protocol.identity import PrivateKey, PublicKey
from protocol.messages import ExitReason
from protocol.negotiation import Agreement
from protocol.receipts import CountersignedReceipt
from protocol.schema import bytes_fields, from_value, to_value

__all__ = [
    "HORIZON_MS",
    "OUTCOME_OF",
    "ROUNDS",
    "SUMMARY_DOMAIN",
    "Links",
    "Outcome",
    "ReceiptSummary",
    "SignedSummary",
    "TrustGraph",
    "edges",
    "open_summary",
    "propagate",
    "scores",
    "sign_summary",
    "summarize",
    "wire_of",
]

SUMMARY_DOMAIN = b"cx/receipt-summary/v1"
HORIZON_MS = 90 * 24 * 3_600_000  # summaries older than this are refused and forgotten
MAX_SKEW_MS = 30_000  # as protocol.admission: a summary may be this far in the future
ROUNDS = 20  # trust propagation rounds: paths longer than this carry nothing
PASS_ON = (4, 5)  # the share of its trust a node passes on each round; the rest comes home
TOTAL = 10**12  # the trust this node distributes, in integer units
SCORE_UNIT = 10**6  # a score is trust in parts per million of TOTAL
_KEYS = ("summary", "payer_sig", "payee_sig")
_K = TypeVar("_K")


class Outcome(enum.StrEnum):
    COMPLETED = "completed"
    JOB_FAULT = "job-fault"  # the job's own failure or bad input: neutral for the provider
    PROVIDER_FAULT = "provider-fault"
    ABANDONED = "abandoned"  # the provider stopped the job for another (preemption)


OUTCOME_OF: Mapping[ExitReason, Outcome] = MappingProxyType(
    {
        ExitReason.SUCCESS: Outcome.COMPLETED,
        ExitReason.NONZERO_EXIT: Outcome.JOB_FAULT,
        ExitReason.OOM: Outcome.JOB_FAULT,
        ExitReason.TIMEOUT: Outcome.JOB_FAULT,
        ExitReason.PIDS_EXHAUSTED: Outcome.JOB_FAULT,
        ExitReason.OUTPUT_TOO_LARGE: Outcome.JOB_FAULT,
        ExitReason.BAD_INPUT: Outcome.JOB_FAULT,
        ExitReason.STOPPED: Outcome.JOB_FAULT,  # its buyer had it stopped: neutral too
        ExitReason.PROVIDER_FAULT: Outcome.PROVIDER_FAULT,
        ExitReason.PREEMPTED: Outcome.ABANDONED,
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiptSummary:
    agreement_id: bytes
    payer: bytes
    payee: bytes
    amount: int  # micro-credits paid
    stake: int  # the agreement's max_cost: what a fault or abandonment put at risk
    outcome: Outcome
    at_ms: int  # when the provider issued the receipt

    def to_bytes(self) -> bytes:
        """The canonical bytes both parties sign."""
        return encode(to_value(self))


@dataclass(frozen=True, slots=True, kw_only=True)
class SignedSummary:
    summary: ReceiptSummary
    payer_signature: bytes
    payee_signature: bytes

    @classmethod
    def by_both(
        cls, summary: ReceiptSummary, payer: PrivateKey, payee: PrivateKey
    ) -> SignedSummary:
        """Signed with both keys at hand (vectors, tests, benchmarks; nodes sign one each)."""
        return cls(
            summary=summary,
            payer_signature=sign_summary(payer, summary),
            payee_signature=sign_summary(payee, summary),
        )

    def to_wire(self) -> bytes:
        return wire_of(self.summary.to_bytes(), self.payer_signature, self.payee_signature)


def wire_of(summary: bytes, payer_sig: bytes, payee_sig: bytes) -> bytes:
    """The wire form of a summary's canonical bytes and its two signatures."""
    return encode({"summary": summary, "payer_sig": payer_sig, "payee_sig": payee_sig})


def summarize(agreement: Agreement, receipt: CountersignedReceipt) -> ReceiptSummary:
    """The summary of a settled receipt, as both of its parties derive it."""
    payload = receipt.receipt.payload
    return ReceiptSummary(
        agreement_id=agreement.id,
        payer=agreement.terms.buyer,
        payee=agreement.terms.provider,
        amount=payload.cost,
        stake=agreement.terms.max_cost,
        outcome=OUTCOME_OF[payload.exit_reason],
        at_ms=receipt.receipt.issued_ms,
    )


def sign_summary(key: PrivateKey, summary: ReceiptSummary) -> bytes:
    """Our signature over ``summary``; we must be its payer or payee.

    Raises:
        LocalProtocolError(WRONG_PARTY): ``key`` is neither party.
    """
    if key.public_key.raw not in (summary.payer, summary.payee):
        raise LocalProtocolError(Reason.WRONG_PARTY, "only a party to a receipt signs its summary")
    return key.sign(SUMMARY_DOMAIN, summary.to_bytes())


def open_summary(
    wire: bytes, *, now_ms: int, known: Callable[[bytes], bool] = lambda _: False
) -> SignedSummary:
    """Decode and verify a gossiped summary; ``known(agreement_id)`` says whether this
    node holds a summary of that agreement already.

    Raises:
        DecodeError: not one canonical value.
        InvalidMessage: MISSING_FIELD (one signature), BAD_FIELD, SELF_DEALING,
            BAD_SIGNATURE, BAD_KEY, NOT_YET_VALID, EXPIRED or REPLAYED.
    """
    value = decode(wire)
    if not isinstance(value, dict) or not set(value) <= set(_KEYS) or "summary" not in value:
        raise InvalidMessage(Reason.BAD_FIELD, f"a summary is a map of {', '.join(_KEYS)}")
    missing = [k for k in _KEYS if k not in value]
    if missing:
        raise InvalidMessage(
            Reason.MISSING_FIELD, f"{missing[0]} is missing: both parties must sign a summary"
        )
    raw, payer_sig, payee_sig = bytes_fields(value, _KEYS, "summary")
    summary = from_value(ReceiptSummary, decode(raw))
    _check(summary, now_ms=now_ms)
    for who, signature in ((summary.payer, payer_sig), (summary.payee, payee_sig)):
        PublicKey(who).verify(SUMMARY_DOMAIN, raw, signature)
    if known(summary.agreement_id):
        raise InvalidMessage(Reason.REPLAYED, "this agreement is summarised already")
    return SignedSummary(summary=summary, payer_signature=payer_sig, payee_signature=payee_sig)


def _check(s: ReceiptSummary, *, now_ms: int) -> None:
    if len(s.agreement_id) != 32:
        raise InvalidMessage(Reason.BAD_FIELD, "agreement_id is a 32-byte hash")
    if s.payer == s.payee:
        raise InvalidMessage(Reason.SELF_DEALING, "payer and payee are the same key")
    if s.amount > s.stake:
        raise InvalidMessage(Reason.BAD_FIELD, "amount paid exceeds what was at stake")
    if s.outcome is Outcome.PROVIDER_FAULT and s.amount != 0:
        raise InvalidMessage(Reason.BAD_FIELD, "a provider fault is paid nothing")
    if s.at_ms > now_ms + MAX_SKEW_MS:
        raise InvalidMessage(Reason.NOT_YET_VALID, "summary of a receipt from the future")
    if s.at_ms < now_ms - HORIZON_MS:
        raise InvalidMessage(Reason.EXPIRED, "summary older than the reputation horizon")


# -- the formula -----------------------------------------------------------------------


def edges(summary: ReceiptSummary) -> list[tuple[bytes, bytes, int]]:
    """What one summary adds to the trust graph: ``(from, to, weight)``, a negative weight
    counting against ``to`` (spec/reputation.md, "Edges")."""
    payer, payee, paid, stake = summary.payer, summary.payee, summary.amount, summary.stake
    match summary.outcome:
        case Outcome.COMPLETED:
            return [(payer, payee, paid), (payee, payer, paid)]
        case Outcome.JOB_FAULT:
            return [(payee, payer, paid)]
        case Outcome.PROVIDER_FAULT:
            return [(payer, payee, -stake)]
        case Outcome.ABANDONED:  # the part paid for was delivered; the rest was left undone
            return [(payer, payee, paid), (payer, payee, paid - stake), (payee, payer, paid)]


@dataclass(frozen=True, slots=True)
class Links:
    """The trust graph as propagation reads it: per key, its positive net edges (sorted)
    and its whole volume."""

    out: Mapping[bytes, tuple[tuple[bytes, int], ...]]
    volume: Mapping[bytes, int]


@dataclass(slots=True)
class TrustGraph:
    """The edges of every summary taken, summed per ordered pair of keys. Taking or
    dropping a summary costs O(1), so a node can keep one up to date as gossip arrives."""

    credit: dict[tuple[bytes, bytes], int] = field(default_factory=dict)
    debit: dict[tuple[bytes, bytes], int] = field(default_factory=dict)
    volume: dict[bytes, int] = field(default_factory=dict)

    def add(self, summary: ReceiptSummary, sign: int = 1) -> None:
        """Count ``summary``'s edges (``sign=-1``: take them back out)."""
        for source, target, weight in edges(summary):
            sums = self.credit if weight >= 0 else self.debit
            _bump(sums, (source, target), sign * abs(weight))
            _bump(self.volume, source, sign * abs(weight))

    def remove(self, summary: ReceiptSummary) -> None:
        self.add(summary, -1)

    def links(self) -> Links:
        out: dict[bytes, list[tuple[bytes, int]]] = defaultdict(list)
        for (source, target), amount in sorted(self.credit.items()):
            if (net := amount - self.debit.get((source, target), 0)) > 0:
                out[source].append((target, net))
        return Links(
            out={k: tuple(v) for k, v in out.items()}, volume=MappingProxyType(dict(self.volume))
        )


def _bump(sums: dict[_K, int], key: _K, by: int) -> None:
    total = sums.get(key, 0) + by
    if total:
        sums[key] = total
    else:
        sums.pop(key, None)


def scores(me: bytes, summaries: Iterable[ReceiptSummary]) -> dict[bytes, int]:
    """Every other key's score as this node (``me``) sees it, in parts per million of its
    trust; keys that no trust reaches are left out (their score is 0)."""
    graph = TrustGraph()
    for summary in summaries:
        graph.add(summary)
    return propagate(me, graph.links())


def propagate(me: bytes, links: Links) -> dict[bytes, int]:
    """:func:`scores` from the graph's links: ``ROUNDS`` rounds from ``me``."""
    trust = {me: TOTAL}
    for _ in range(ROUNDS):
        trust = _round(me, trust, links.out, links.volume)
    return {k: t // SCORE_UNIT for k, t in sorted(trust.items()) if k != me and t >= SCORE_UNIT}


def _round(
    me: bytes,
    trust: dict[bytes, int],
    out: Mapping[bytes, Sequence[tuple[bytes, int]]],
    volume: Mapping[bytes, int],
) -> dict[bytes, int]:
    """One round: each node passes PASS_ON of its trust along its edges, each edge taking
    its net weight over the node's whole volume (faults and neutral volume included);
    what is not passed on, and what flooring leaves, goes back to ``me``."""
    nxt: dict[bytes, int] = defaultdict(int)
    for node, held in trust.items():
        passed = held * PASS_ON[0] // PASS_ON[1]
        given = 0
        for target, weight in out.get(node, ()):
            share = passed * weight // volume[node]
            nxt[target] += share
            given += share
        nxt[me] += held - given
    return {k: v for k, v in nxt.items() if v > 0}
