"""Fairness between buyers on one provider (protocol/selling.py): a cap on the share one
buyer may hold, and invitations that favour the highest limit, then the buyer with the
least recent usage; and the buyer's side of an invitation (protocol/buying.py)."""

from __future__ import annotations

import pytest
from factories import HOUR_MS, T0, Nonces, bid, end_job, key, offer

from protocol.buying import Buying
from protocol.envelope import seal
from protocol.errors import InvalidMessage, Reason
from protocol.messages import (
    Accept,
    Invitation,
    Reject,
    RejectReason,
)
from protocol.selling import Selling
from protocol.trader import Trader

PROVIDER = key("provider")


def _provider(**fields: int) -> tuple[Selling, Nonces]:
    selling, nonce = Selling(Trader(PROVIDER), **fields), Nonces()
    selling.post_offer(offer(cpu_milli=4000), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    return selling, nonce


def _buyer(name: str, selling: Selling) -> Buying:
    buying = Buying(Trader(key(name)))
    assert selling.offer is not None
    buying.trader.receive_order(selling.offer.wire, now_ms=T0)
    return buying


def _agree(buying: Buying, selling: Selling, nonce: Nonces, *, cpu_milli: int, at: int = T0):
    """Bid, propose, and answer; returns the provider's reply."""
    _, [match] = buying.trader.post(
        bid(cpu_milli=cpu_milli), nonce=nonce(), now_ms=at, ttl_ms=HOUR_MS
    )
    proposal = buying.propose(match, nonce=nonce(), attestation_nonce=nonce(32), now_ms=at)
    selling.receive_proposal(proposal.wire, now_ms=at)
    reply = selling.accept(proposal.id, evidence=None, nonce=nonce(), now_ms=at)
    if isinstance(reply.payload, Accept):
        buying.receive_reply(reply.wire, now_ms=at)
        selling.receive_agreement(buying.agree(proposal.id).to_wire())
    return reply


def test_one_buyer_may_not_hold_more_than_its_share():
    selling, nonce = _provider(max_share_ppm=500_000)  # half of 4 cores each
    alice, bob = _buyer("alice", selling), _buyer("bob", selling)
    assert isinstance(_agree(alice, selling, nonce, cpu_milli=1500).payload, Accept)
    refused = _agree(alice, selling, nonce, cpu_milli=1000).payload
    assert isinstance(refused, Reject)
    assert refused.reason is RejectReason.NO_CAPACITY
    assert refused.detail == "fair share: one buyer may hold 50 % at most"
    assert isinstance(_agree(bob, selling, nonce, cpu_milli=2000).payload, Accept)


def test_without_a_cap_one_buyer_may_take_everything():
    selling, nonce = _provider()
    alice = _buyer("alice", selling)
    assert isinstance(_agree(alice, selling, nonce, cpu_milli=4000).payload, Accept)


def _rest(buying: Buying, selling: Selling, nonce: Nonces, *, cpu_milli: int, limit: int):
    """A bid of ``buying`` that rests in the provider's book (gossiped to it)."""
    order, _ = buying.trader.post(
        bid(cpu_milli=cpu_milli, cpu_limit=limit), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS
    )
    selling.trader.receive_order(order.wire, now_ms=T0)
    return order


def test_invitations_favour_the_highest_limit_then_the_least_recent_usage():
    selling, nonce = _provider()
    heavy, light, rich = (_buyer(n, selling) for n in ("heavy", "light", "rich"))
    _agree(heavy, selling, nonce, cpu_milli=2000)  # heavy used this provider recently
    # the rest is free for 2 cores: three bids of one core each compete for it
    from_heavy = _rest(heavy, selling, nonce, cpu_milli=1000, limit=150_000)
    from_light = _rest(light, selling, nonce, cpu_milli=1000, limit=150_000)
    from_rich = _rest(rich, selling, nonce, cpu_milli=1000, limit=190_000)
    invited = selling.invitations(now_ms=T0)
    assert [o.id for o in invited] == [from_rich.id, from_light.id]
    assert from_heavy.id not in {o.id for o in invited}
    # each bid once per offer: later calls never invite rich or light again
    assert [o.id for o in selling.invitations(now_ms=T0)] == [from_heavy.id]
    assert selling.invitations(now_ms=T0) == []


def test_an_invited_buyer_proposes_to_the_offer_that_once_refused_it():
    selling, nonce = _provider()
    alice, bob = _buyer("alice", selling), _buyer("bob", selling)
    _agree(alice, selling, nonce, cpu_milli=4000)
    # bob's proposal is refused for capacity: its bid rests, that offer excluded
    _, [match] = bob.trader.post(bid(cpu_milli=2000), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    proposal = bob.propose(match, nonce=nonce(), attestation_nonce=nonce(32), now_ms=T0)
    selling.receive_proposal(proposal.wire, now_ms=T0)
    reply = selling.accept(proposal.id, evidence=None, nonce=nonce(), now_ms=T0)
    assert isinstance(reply.payload, Reject)
    bob.receive_reply(reply.wire, now_ms=T0)
    assert bob.next_match(match.bid.id, now_ms=T0) == []
    # alice's job ends and frees the capacity; the provider invites bob's resting bid
    selling.trader.receive_order(match.bid.wire, now_ms=T0)
    [agreement_id] = selling.agreements
    end_job(selling, nonce, agreement_id)
    [invited] = selling.invitations(now_ms=T0)
    invitation = selling.invite(invited, nonce=nonce(), now_ms=T0)
    again = bob.receive_invitation(invitation.wire, now_ms=T0)
    assert again is not None
    assert again.offer.id == selling.offer.id


def test_an_invitation_from_another_key_is_refused():
    selling, nonce = _provider()
    bob = _buyer("bob", selling)
    order, _ = bob.trader.post(bid(cpu_milli=8000), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    assert selling.offer is not None
    wire = seal(
        key("mallory"),
        Invitation(offer_id=selling.offer.id, bid_id=order.id),
        nonce=nonce(),
        issued_ms=T0,
        expires_ms=T0 + 60_000,
    ).wire
    with pytest.raises(InvalidMessage) as info:
        bob.receive_invitation(wire, now_ms=T0)
    assert info.value.reason is Reason.WRONG_PARTY
