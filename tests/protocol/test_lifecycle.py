"""The whole life of a trade between a sans-IO buyer and provider, with no event loop."""

from __future__ import annotations

import pytest
from factories import HOUR_MS, T0, Nonces, bid, key, offer

from protocol.buying import Buying
from protocol.errors import InvalidMessage, Reason
from protocol.messages import (
    LOG_CAP_BYTES,
    Accept,
    DataRef,
    ExitReason,
    JobState,
    Reject,
    RejectReason,
    Usage,
)
from protocol.negotiation import Agreement
from protocol.selling import Selling
from protocol.settlement import charge
from protocol.trader import Trader


@pytest.fixture
def pair():
    return Buying(Trader(key("buyer"))), Selling(Trader(key("provider"))), Nonces()


def _trade_until_agreed(buyer, provider, nonce):
    posted_offer = provider.post_offer(offer(), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    buyer.trader.receive_order(posted_offer.wire, now_ms=T0 + 1)
    posted_bid, matches = buyer.trader.post(bid(), nonce=nonce(), now_ms=T0 + 2, ttl_ms=HOUR_MS)
    provider.trader.receive_order(posted_bid.wire, now_ms=T0 + 3)
    [match] = matches
    assert match.offer.id == posted_offer.id
    proposal = buyer.propose(match, nonce=nonce(), attestation_nonce=nonce(32), now_ms=T0 + 4)
    provider.receive_proposal(proposal.wire, now_ms=T0 + 5)
    reply = provider.accept(proposal.id, evidence=None, nonce=nonce(), now_ms=T0 + 6)
    assert isinstance(reply.payload, Accept)
    buyer.receive_reply(reply.wire, now_ms=T0 + 7)
    agreement = buyer.agree(proposal.id)
    assert provider.receive_agreement(agreement.to_wire()) == agreement
    return agreement


def _run(buyer, provider, agreement, nonce):
    for state in (JobState.TRANSFERRING, JobState.RUNNING):
        status = provider.status(agreement.id, state, nonce=nonce(), now_ms=T0 + 10)
        buyer.receive_status(status.wire, now_ms=T0 + 11)


def _successful_receipt(provider, agreement, nonce, **fields):
    return provider.issue_receipt(
        agreement.id,
        usage=Usage(wall_ms=1000, cpu_us=1000),
        exit_reason=ExitReason.SUCCESS,
        exit_code=0,
        nonce=nonce(),
        now_ms=T0 + 9,
        **fields,
    )


def test_offer_bid_match_agreement_receipt_settled(pair):
    buyer, provider, nonce = pair
    agreement = _trade_until_agreed(buyer, provider, nonce)
    terms = agreement.terms
    # trades at the resting offer's prices, capped at the quote for the wall-time limit
    assert terms.prices.cpu_core_hour == 100_000
    assert terms.max_cost == 100_000 + 10_000  # 1 core and 1 GiB for one hour

    _run(buyer, provider, agreement, nonce)

    usage = Usage(wall_ms=1_800_000, cpu_us=900_000_000, memory_peak_bytes=1 << 20)
    output = DataRef(digest="sha256:" + "cd" * 32, path="/out/greeting", size=6)
    stdout = DataRef(digest="sha256:" + "ef" * 32, path="/dev/stdout", size=12)
    receipt = provider.issue_receipt(
        agreement.id,
        usage=usage,
        exit_reason=ExitReason.SUCCESS,
        exit_code=0,
        outputs=(output,),
        logs=(stdout,),
        nonce=nonce(),
        now_ms=T0 + 20,
    )
    # 0.25 core-hour of CPU at 100_000 + 1 GiB for half an hour at 10_000
    assert receipt.payload.cost == 25_000 + 5_000
    countersigned = buyer.receive_receipt(receipt.wire, now_ms=T0 + 21)
    # the buyer learns where its logs are from the receipt it countersigned
    assert countersigned.receipt.payload.logs == (stdout,)
    settled, entry = provider.receive_countersigned(countersigned.to_wire())
    assert settled.to_wire() == countersigned.to_wire()

    assert entry.amount == 30_000
    for side in (buyer, provider):
        assert side.jobs[agreement.id].state is JobState.SETTLED
        balances = side.trader.ledger.balances()
        assert balances == {provider.trader.me.raw: 30_000, buyer.trader.me.raw: -30_000}
        assert sum(balances.values()) == 0
    # the provider's capacity is whole again
    resting = provider.trader.book.offers[agreement.terms.offer_id]
    assert resting.remaining == resting.offer.capacity


def test_reject_moves_to_next_candidate(pair):
    buyer, provider, nonce = pair
    other = Selling(Trader(key("other provider")))
    for seller, price in ((provider, 90_000), (other, 95_000)):
        posted = seller.post_offer(offer(cpu_price=price), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
        buyer.trader.receive_order(posted.wire, now_ms=T0)
    posted_bid, [first] = buyer.trader.post(bid(), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    assert first.provider == provider.trader.me.raw  # cheapest first
    proposal = buyer.propose(first, nonce=nonce(), attestation_nonce=nonce(32), now_ms=T0)
    provider.receive_proposal(proposal.wire, now_ms=T0)
    reply = provider.reject(proposal.id, RejectReason.POLICY, nonce=nonce(), now_ms=T0)
    assert isinstance(buyer.receive_reply(reply.wire, now_ms=T0).payload, Reject)
    [second] = buyer.next_match(posted_bid.id, now_ms=T0)
    assert second.provider == other.trader.me.raw


def test_provider_rejects_when_capacity_is_gone(pair):
    buyer, provider, nonce = pair
    posted = provider.post_offer(offer(cpu_milli=1000), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    buyer.trader.receive_order(posted.wire, now_ms=T0)
    proposals = []
    for _ in range(2):  # the buyer's book thinks capacity is there each time it is released
        _, [match] = buyer.trader.post(bid(), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
        buyer.trader.book.release(match, rest_bid=False)
        proposal = buyer.propose(match, nonce=nonce(), attestation_nonce=nonce(32), now_ms=T0)
        provider.receive_proposal(proposal.wire, now_ms=T0)
        proposals.append(proposal)
    first = provider.accept(proposals[0].id, evidence=None, nonce=nonce(), now_ms=T0)
    second = provider.accept(proposals[1].id, evidence=None, nonce=nonce(), now_ms=T0)
    assert isinstance(first.payload, Accept)
    assert isinstance(second.payload, Reject)
    assert second.payload.reason is RejectReason.NO_CAPACITY


def test_receipt_with_inflated_cost_is_refused(pair):
    buyer, provider, nonce = pair
    agreement = _trade_until_agreed(buyer, provider, nonce)
    _run(buyer, provider, agreement, nonce)
    honest = _successful_receipt(provider, agreement, nonce)
    from dataclasses import replace

    from protocol.envelope import seal

    inflated = seal(
        provider.trader.key,
        replace(honest.payload, cost=honest.payload.cost + 1),
        nonce=nonce(),
        issued_ms=T0 + 9,
        expires_ms=T0 + HOUR_MS,
    )
    with pytest.raises(InvalidMessage) as info:
        buyer.receive_receipt(inflated.wire, now_ms=T0 + 10)
    assert info.value.reason is Reason.TERMS_MISMATCH


def test_agreement_with_a_forged_signature_is_refused(pair):
    buyer, provider, nonce = pair
    agreement = _trade_until_agreed(buyer, provider, nonce)
    forged = Agreement(
        terms=agreement.terms,
        terms_bytes=agreement.terms_bytes,
        buyer_signature=agreement.buyer_signature,
        provider_signature=bytes(64),
    )
    with pytest.raises(InvalidMessage) as info:
        Agreement.from_wire(forged.to_wire())
    assert info.value.reason is Reason.BAD_SIGNATURE


def test_provider_fault_costs_nothing():
    from factories import GIB

    from protocol.messages import Prices, Resources

    prices = Prices(cpu_core_hour=100_000, memory_gib_hour=10_000)
    reserved = Resources(cpu_milli=1000, memory_bytes=GIB)
    usage = Usage(wall_ms=HOUR_MS, cpu_us=3_600_000_000, checkpoint_ms=HOUR_MS // 2)
    assert charge(prices, reserved, 10**9, usage, ExitReason.PROVIDER_FAULT) == 0
    assert charge(prices, reserved, 10**9, usage, ExitReason.NONZERO_EXIT) == 110_000
    assert charge(prices, reserved, 10**9, usage, ExitReason.PREEMPTED) == 55_000
    assert charge(prices, reserved, 1_000, usage, ExitReason.SUCCESS) == 1_000


@pytest.mark.parametrize(
    "paths",
    [("/out/log",), ("/dev/stdout", "/dev/stdout"), ("/dev/stderr", "/dev/tty")],
)
def test_receipt_logs_are_stdout_and_stderr_at_most_once(pair, paths):
    buyer, provider, nonce = pair
    agreement = _trade_until_agreed(buyer, provider, nonce)
    _run(buyer, provider, agreement, nonce)
    logs = tuple(DataRef(digest="sha256:" + "ef" * 32, path=p, size=1) for p in paths)
    with pytest.raises(ValueError, match="log paths"):
        _successful_receipt(provider, agreement, nonce, logs=logs)


def test_a_cut_log_is_marked_in_the_receipt_the_buyer_countersigns(pair):
    buyer, provider, nonce = pair
    agreement = _trade_until_agreed(buyer, provider, nonce)
    _run(buyer, provider, agreement, nonce)
    stdout = DataRef(digest="sha256:" + "ef" * 32, path="/dev/stdout", size=LOG_CAP_BYTES)
    stderr = DataRef(digest="sha256:" + "0f" * 32, path="/dev/stderr", size=5)
    receipt = _successful_receipt(
        provider, agreement, nonce, logs=(stdout, stderr), truncated_logs=("/dev/stdout",)
    )
    countersigned = buyer.receive_receipt(receipt.wire, now_ms=T0 + 10)
    assert countersigned.receipt.payload.truncated_logs == ("/dev/stdout",)


@pytest.mark.parametrize("cut", [("/dev/stderr",), ("/dev/stdout", "/dev/stdout")])
def test_only_a_log_the_receipt_carries_can_be_marked_cut_once(pair, cut):
    buyer, provider, nonce = pair
    agreement = _trade_until_agreed(buyer, provider, nonce)
    _run(buyer, provider, agreement, nonce)
    stdout = DataRef(digest="sha256:" + "ef" * 32, path="/dev/stdout", size=1)
    with pytest.raises(ValueError, match="truncated_logs"):
        _successful_receipt(provider, agreement, nonce, logs=(stdout,), truncated_logs=cut)
