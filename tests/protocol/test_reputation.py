"""Receipt summaries and the reputation formula (protocol/reputation.py), with no event loop.

The vectors (spec/vectors/reputation/) pin the numbers; these tests state the properties
the formula is for: a node trusts by what it paid, faults cost, and a sybil ring cannot
trade itself a reputation.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from factories import HOUR_MS, T0, Nonces, bid, key, offer
from hypothesis import given
from hypothesis import strategies as st

from protocol.buying import Buying
from protocol.encoding import encode
from protocol.errors import InvalidMessage, LocalProtocolError, Reason
from protocol.messages import ExitReason, JobState, Usage
from protocol.reputation import (
    OUTCOME_OF,
    TOTAL,
    Outcome,
    ReceiptSummary,
    SignedSummary,
    TrustGraph,
    _round,
    open_summary,
    propagate,
    scores,
    sign_summary,
    summarize,
)
from protocol.selling import Selling
from protocol.trader import Trader

ME = key("me").public_key.raw
ALICE, BOB = key("alice").public_key.raw, key("bob").public_key.raw


def receipt(
    payer: bytes, payee: bytes, amount: int, *, outcome: Outcome = Outcome.COMPLETED, n: int = 0
) -> ReceiptSummary:
    return ReceiptSummary(
        agreement_id=n.to_bytes(32, "big"),
        payer=payer,
        payee=payee,
        amount=amount,
        stake=max(amount, 1_000),
        outcome=outcome,
        at_ms=T0,
    )


def sybils(count: int) -> list[bytes]:
    return [key(f"sybil-{i}").public_key.raw for i in range(count)]


def ring(members: list[bytes], volume: int, first: int) -> list[ReceiptSummary]:
    """Every member pays the next ``volume`` for completed work, round the ring."""
    pairs = zip(members, members[1:] + members[:1], strict=True)
    return [receipt(a, b, volume, n=first + i) for i, (a, b) in enumerate(pairs)]


def test_a_summary_is_what_both_parties_derive_from_the_receipt_they_settled() -> None:
    buyer, provider, nonce = Buying(Trader(key("buyer"))), Selling(Trader(key("seller"))), Nonces()
    posted = provider.post_offer(offer(), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    buyer.trader.receive_order(posted.wire, now_ms=T0 + 1)
    _, [match] = buyer.trader.post(bid(), nonce=nonce(), now_ms=T0 + 2, ttl_ms=HOUR_MS)
    proposal = buyer.propose(match, nonce=nonce(), attestation_nonce=nonce(32), now_ms=T0 + 3)
    provider.receive_proposal(proposal.wire, now_ms=T0 + 4)
    reply = provider.accept(proposal.id, evidence=None, nonce=nonce(), now_ms=T0 + 5)
    buyer.receive_reply(reply.wire, now_ms=T0 + 6)
    agreement = buyer.agree(proposal.id)
    provider.receive_agreement(agreement.to_wire())
    for state in (JobState.TRANSFERRING, JobState.RUNNING):
        status = provider.status(agreement.id, state, nonce=nonce(), now_ms=T0 + 7)
        buyer.receive_status(status.wire, now_ms=T0 + 8)
    issued = provider.issue_receipt(
        agreement.id,
        usage=Usage(wall_ms=1000, cpu_us=1000),
        exit_reason=ExitReason.OOM,
        exit_code=137,
        nonce=nonce(),
        now_ms=T0 + 9,
    )
    countersigned = buyer.receive_receipt(issued.wire, now_ms=T0 + 10)

    summary = summarize(agreement, countersigned)
    assert summary == ReceiptSummary(
        agreement_id=agreement.id,
        payer=key("buyer").public_key.raw,
        payee=key("seller").public_key.raw,
        amount=issued.payload.cost,
        stake=agreement.terms.max_cost,
        outcome=Outcome.JOB_FAULT,
        at_ms=T0 + 9,
    )
    signed = SignedSummary.by_both(summary, key("buyer"), key("seller"))
    assert open_summary(signed.to_wire(), now_ms=T0 + 11).summary == summary
    # The summary carries nothing of the job: not its image, command, outputs or logs.
    assert agreement.terms.job.image.encode() not in signed.to_wire()
    with pytest.raises(LocalProtocolError) as info:
        sign_summary(key("stranger"), summary)
    assert info.value.reason is Reason.WRONG_PARTY


def test_every_exit_reason_has_an_outcome_class() -> None:
    assert set(OUTCOME_OF) == set(ExitReason)


def _wire(summary: ReceiptSummary, payer_sig: bytes, payee_sig: bytes) -> bytes:
    return SignedSummary(
        summary=summary, payer_signature=payer_sig, payee_signature=payee_sig
    ).to_wire()


SUMMARY = receipt(ALICE, BOB, 500)
GOOD = (sign_summary(key("alice"), SUMMARY), sign_summary(key("bob"), SUMMARY))
SELF = replace(SUMMARY, payee=ALICE)
REFUSED = {
    "forged: a signature with one bit flipped": (
        _wire(SUMMARY, GOOD[0], bytes([GOOD[1][0] ^ 1]) + GOOD[1][1:]),
        Reason.BAD_SIGNATURE,
    ),
    "forged: the payer signed another amount": (
        _wire(SUMMARY, sign_summary(key("alice"), replace(SUMMARY, amount=499)), GOOD[1]),
        Reason.BAD_SIGNATURE,
    ),
    "one signature": (
        encode({"summary": SUMMARY.to_bytes(), "payee_sig": GOOD[1]}),
        Reason.MISSING_FIELD,
    ),
    "self-dealing": (
        _wire(SELF, sign_summary(key("alice"), SELF), sign_summary(key("alice"), SELF)),
        Reason.SELF_DEALING,
    ),
    "replayed": (_wire(SUMMARY, *GOOD), Reason.REPLAYED),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_refusals_name_their_reason(name: str) -> None:
    wire, reason = REFUSED[name]
    known = {SUMMARY.agreement_id} if name == "replayed" else set()
    assert open_summary(_wire(SUMMARY, *GOOD), now_ms=T0).summary == SUMMARY
    with pytest.raises(InvalidMessage) as info:
        open_summary(wire, now_ms=T0, known=known.__contains__)
    assert info.value.reason is reason, info.value


def test_a_node_with_no_receipts_trusts_no_one_and_faults_alone_earn_nothing() -> None:
    assert scores(ME, []) == {}
    assert scores(ME, [receipt(ME, ALICE, 0, outcome=Outcome.PROVIDER_FAULT)]) == {}


def test_provider_faults_lower_a_score_whoever_reports_them() -> None:
    history = [receipt(ME, ALICE, 1_000, n=1), receipt(BOB, ALICE, 1_000, n=2)]
    history += [receipt(ME, BOB, 1_000, n=3)]
    before = scores(ME, history)[ALICE]
    mine = scores(ME, [*history, receipt(ME, ALICE, 0, outcome=Outcome.PROVIDER_FAULT, n=4)])
    theirs = scores(ME, [*history, receipt(BOB, ALICE, 0, outcome=Outcome.PROVIDER_FAULT, n=4)])
    assert mine[ALICE] < before
    assert theirs[ALICE] < before


def test_a_job_fault_is_neutral_for_the_provider() -> None:
    history = [receipt(ME, ALICE, 1_000, n=1), receipt(ME, BOB, 1_000, n=2)]
    failed = receipt(ME, ALICE, 400, outcome=Outcome.JOB_FAULT, n=3)
    assert scores(ME, [*history, failed])[ALICE] == scores(ME, history)[ALICE]


def test_a_sybil_ring_trading_with_itself_gains_nothing_without_paying_honest_nodes() -> None:
    ring_keys = sybils(4)
    honest = [receipt(ME, ALICE, 1_000, n=1), receipt(BOB, ALICE, 1_000, n=2)]
    alone = scores(ME, honest + ring(ring_keys, 10**15, first=10))
    assert not set(alone) & set(ring_keys)


def test_a_sybil_ring_gets_only_what_it_paid_for_however_much_it_trades_inside() -> None:
    ring_keys = sybils(4)
    honest = [receipt(ME, ALICE, 10_000, n=1), receipt(BOB, ALICE, 10_000, n=2)]
    entry = receipt(ring_keys[0], ALICE, 100, n=3)  # the ring pays an honest provider a little

    def ring_total(volume: int) -> int:
        result = scores(ME, [*honest, entry, *ring(ring_keys, volume, first=10)])
        return sum(result.get(k, 0) for k in ring_keys)

    # Trading more inside keeps what flows in a little longer, but a thousand times more
    # volume buys (next to) nothing: the ring holds at most what its payment let in, times
    # the 1 / (1 - 4/5) a closed cycle keeps (spec/reputation.md, "Sybils").
    large, huge = ring_total(10**12), ring_total(10**15)
    assert huge - large <= len(ring_keys)
    assert huge < scores(ME, [*honest, entry])[ALICE] // 10  # and it stays small
    paid_more = receipt(ring_keys[0], ALICE, 1_000, n=3)
    more = scores(ME, [*honest, paid_more, *ring(ring_keys, 10**15, first=10)])
    assert sum(more.get(k, 0) for k in ring_keys) > huge  # reputation is bought by paying


summaries = st.lists(
    st.builds(
        receipt,
        st.sampled_from([ME, ALICE, BOB, *sybils(2)]),
        st.sampled_from([ALICE, BOB, *sybils(2)]),
        st.integers(0, 10**12),
        outcome=st.sampled_from(list(Outcome)),
        n=st.integers(0, 10**6),
    ).filter(lambda s: s.payer != s.payee),
    max_size=30,
)


@given(summaries)
def test_scores_ignore_order_and_never_create_trust(history: list[ReceiptSummary]) -> None:
    shuffled = list(history)
    random.Random(0).shuffle(shuffled)
    result = scores(ME, history)
    assert result == scores(ME, shuffled)
    assert sum(result.values()) <= 1_000_000
    assert all(v > 0 for v in result.values())


def test_a_round_conserves_the_trust_it_distributes() -> None:
    out = {ME: [(ALICE, 3)], ALICE: [(ME, 1), (BOB, 1)]}
    volume = {ME: 7, ALICE: 3}
    trust = _round(ME, {ME: TOTAL // 2, ALICE: TOTAL // 2}, out, volume)
    assert sum(trust.values()) == TOTAL


@given(summaries, summaries)
def test_a_graph_kept_up_to_date_scores_as_one_built_at_once(
    kept: list[ReceiptSummary], dropped: list[ReceiptSummary]
) -> None:
    graph = TrustGraph()
    for summary in [*kept, *dropped]:
        graph.add(summary)
    for summary in dropped:
        graph.remove(summary)
    assert propagate(ME, graph.links()) == scores(ME, kept)
    for summary in kept:
        graph.remove(summary)
    assert graph == TrustGraph()  # nothing left behind
