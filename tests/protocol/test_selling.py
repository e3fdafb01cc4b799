"""The provider's decisions, as pure functions of its state: what to refuse, what to
preempt, and where held capacity lives when the offer is replaced."""

from __future__ import annotations

from dataclasses import replace

import pytest
from factories import GIB, HOUR_MS, T0, Nonces, bid, key, offer

from protocol.book import Match
from protocol.buying import Buying
from protocol.messages import (
    Accept,
    Constraints,
    ExitReason,
    JobState,
    Prices,
    Reject,
    RejectReason,
    Resources,
    TrustLevel,
    TrustRequirement,
    Usage,
)
from protocol.negotiation import terms_from_match
from protocol.selling import Refusal, Selling, choose_preemption
from protocol.trader import Trader


@pytest.fixture
def market():
    return Buying(Trader(key("buyer"))), Selling(Trader(key("provider"))), Nonces()


def _propose(buyer, provider, nonce, **bid_fields):
    """A fresh bid of the buyer, matched against the provider's current offer, proposed."""
    _, [match] = buyer.trader.post(bid(**bid_fields), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    proposal = buyer.propose(match, nonce=nonce(), attestation_nonce=nonce(32), now_ms=T0)
    return provider.receive_proposal(proposal.wire, now_ms=T0).id


def _offer(buyer, provider, nonce, **fields):
    posted = provider.post_offer(offer(**fields), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    buyer.trader.receive_order(posted.wire, now_ms=T0)
    return posted


def _agree(buyer, provider, nonce, proposal_id):
    reply = provider.accept(proposal_id, evidence=None, nonce=nonce(), now_ms=T0)
    assert isinstance(reply.payload, Accept)
    buyer.receive_reply(reply.wire, now_ms=T0)
    agreement = buyer.agree(reply.payload.proposal_id)
    return provider.receive_agreement(agreement.to_wire())


def _remaining(provider):
    return provider.trader.book.offers[provider.offer.id].remaining


def test_a_proposal_for_a_replaced_offer_is_refused(market):
    buyer, provider, nonce = market
    _offer(buyer, provider, nonce)
    proposal_id = _propose(buyer, provider, nonce)
    provider.post_offer(offer(), nonce=nonce(), now_ms=T0 + 1, ttl_ms=HOUR_MS)
    assert provider.screen(proposal_id) == Refusal(
        reason=RejectReason.UNKNOWN_ORDER, detail="that offer was replaced by a newer one"
    )
    reply = provider.accept(proposal_id, evidence=None, nonce=nonce(), now_ms=T0)
    assert isinstance(reply.payload, Reject)
    assert reply.payload.reason is RejectReason.UNKNOWN_ORDER


def test_trust_the_offer_does_not_state_is_refused(market):
    """A buyer whose book let a TPM bid match an offer without TPM (a buggy or hostile
    buyer) is refused before anything is held or preempted."""
    buyer, provider, nonce = market
    posted = _offer(buyer, provider, nonce)
    needs_tpm = Constraints(trust=TrustRequirement(level=TrustLevel.TPM))
    order, _ = buyer.trader.post(
        bid(constraints=needs_tpm), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS
    )
    match = Match(
        bid=order,
        offer=posted,
        prices=posted.payload.prices,
        resources=order.payload.resources,
        max_cost=10**9,
    )
    proposal = buyer.propose(match, nonce=nonce(), attestation_nonce=nonce(32), now_ms=T0)
    proposal_id = provider.receive_proposal(proposal.wire, now_ms=T0).id
    assert provider.screen(proposal_id) == Refusal(
        reason=RejectReason.TRUST_UNAVAILABLE, detail="this provider cannot attest tpm"
    )
    assert _remaining(provider) == posted.payload.capacity


@pytest.mark.parametrize(
    ("seal_key", "refusal"),
    [
        (
            None,
            Refusal(reason=RejectReason.BAD_TERMS, detail="this provider takes no sealed secrets"),
        ),
        (bytes(32), None),
    ],
)
def test_a_job_with_secrets_needs_an_offer_with_a_seal_key(market, seal_key, refusal):
    buyer, provider, nonce = market
    posted = provider.post_offer(
        replace(offer(), seal_key=seal_key), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS
    )
    buyer.trader.receive_order(posted.wire, now_ms=T0)
    with_secrets = replace(bid(), job=replace(bid().job, secrets=("s3",)))
    _, [match] = buyer.trader.post(with_secrets, nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    proposal = buyer.propose(match, nonce=nonce(), attestation_nonce=nonce(32), now_ms=T0)
    assert provider.screen(provider.receive_proposal(proposal.wire, now_ms=T0).id) == refusal


def test_held_capacity_moves_to_the_new_offer_and_comes_back_with_the_receipt(market):
    buyer, provider, nonce = market
    _offer(buyer, provider, nonce, cpu_milli=2000)
    agreement = _agree(buyer, provider, nonce, _propose(buyer, provider, nonce, cpu_milli=1500))
    assert _remaining(provider).cpu_milli == 500
    provider.post_offer(offer(cpu_milli=2000), nonce=nonce(), now_ms=T0 + 1, ttl_ms=HOUR_MS)
    assert _remaining(provider).cpu_milli == 500  # the running job holds the new offer too
    for state in (JobState.TRANSFERRING, JobState.RUNNING):
        provider.status(agreement.id, state, nonce=nonce(), now_ms=T0 + 2)
    provider.issue_receipt(
        agreement.id,
        usage=Usage(wall_ms=1000, cpu_us=1000),
        exit_reason=ExitReason.SUCCESS,
        exit_code=0,
        nonce=nonce(),
        now_ms=T0 + 2,
    )
    assert _remaining(provider).cpu_milli == 2000


def test_an_accept_without_agreement_gives_its_capacity_back(market):
    buyer, provider, nonce = market
    _offer(buyer, provider, nonce, cpu_milli=1000)
    proposal_id = _propose(buyer, provider, nonce)
    assert isinstance(
        provider.accept(proposal_id, evidence=None, nonce=nonce(), now_ms=T0).payload, Accept
    )
    assert _remaining(provider).cpu_milli == 0
    provider.timed_out(proposal_id)
    assert _remaining(provider).cpu_milli == 1000
    assert proposal_id not in provider.deals


def test_preemption_goes_for_the_cheapest_preemptible_jobs_that_free_enough(market):
    buyer, provider, nonce = market
    _offer(buyer, provider, nonce, cpu_milli=3000, memory=8 * GIB)
    running = {}
    for price, preemptible in ((100_000, True), (90_000, True), (80_000, False)):
        terms = _terms(buyer, nonce, cpu_limit=price, preemptible=preemptible)
        running[bytes([price // 10_000])] = replace(
            terms, prices=replace(terms.prices, cpu_core_hour=price)
        )
    urgent = _terms(buyer, nonce, cpu_limit=150_000)
    urgent = replace(urgent, prices=replace(urgent.prices, cpu_core_hour=150_000))
    full = Resources(cpu_milli=0, memory_bytes=5 * GIB)
    # the 90_000 job is the cheapest one allowed to go, and it frees enough
    assert choose_preemption(urgent, full, running) == [bytes([9])]
    # nothing to preempt when the job fits; no choice when the preemptible ones pay more
    assert choose_preemption(urgent, Resources(cpu_milli=1000, memory_bytes=GIB), running) == []
    cheap = replace(urgent, prices=replace(urgent.prices, cpu_core_hour=85_000))
    assert choose_preemption(cheap, full, running) is None
    # and none when even every allowed victim together does not free enough
    big = replace(urgent, resources=Resources(cpu_milli=3000, memory_bytes=GIB))
    assert choose_preemption(big, full, running) is None


def _terms(buyer, nonce, *, cpu_limit, preemptible=False):
    b = replace(bid(cpu_limit=cpu_limit), preemptible=preemptible)
    order, _ = buyer.trader.post(b, nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    match = Match(
        bid=order,
        offer=order,  # unused by the decision: only the terms' prices and resources count
        prices=Prices(cpu_core_hour=cpu_limit),
        resources=b.resources,
        max_cost=0,
    )
    return terms_from_match(match, attestation_nonce=bytes(32), created_ms=T0)


def test_preemption_for_a_proposal_considers_only_live_jobs(market):
    buyer, provider, nonce = market
    # the cheap preemptible bid trades at the provider's ask of then, 50_000
    cheap_bid = replace(bid(cpu_limit=60_000), preemptible=True)
    buyer.trader.post(cheap_bid, nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    posted = provider.post_offer(
        offer(cpu_milli=1000, cpu_price=50_000), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS
    )
    _, [match] = buyer.trader.receive_order(posted.wire, now_ms=T0)
    proposal = buyer.propose(match, nonce=nonce(), attestation_nonce=nonce(32), now_ms=T0)
    cheap = _agree(buyer, provider, nonce, provider.receive_proposal(proposal.wire, now_ms=T0).id)
    assert cheap.terms.prices.cpu_core_hour == 50_000
    # demand rose: the provider asks 150_000 now, and a dear bid takes that
    _offer(buyer, provider, nonce, cpu_milli=1000, cpu_price=150_000)
    assert _remaining(provider).cpu_milli == 0
    dear = _propose(buyer, provider, nonce, cpu_limit=200_000)
    assert provider.preemption_for(dear) == [cheap.id]
    provider.issue_receipt(
        cheap.id,
        usage=Usage(wall_ms=1, cpu_us=1),
        exit_reason=ExitReason.PROVIDER_FAULT,
        exit_code=-1,
        nonce=nonce(),
        now_ms=T0,
    )
    assert provider.preemption_for(dear) == []
