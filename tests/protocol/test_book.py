from __future__ import annotations

from dataclasses import replace

from factories import GIB, HOUR_MS, T0, Nonces, bid, key, offer
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.book import OrderBook
from protocol.envelope import seal
from protocol.messages import Arch, Constraints, Resources, TrustLevel, TrustRequirement
from protocol.settlement import quote

nonce = Nonces("book")


def signed(payload, who="p", at=T0):
    return seal(key(who), payload, nonce=nonce(), issued_ms=at, expires_ms=at + HOUR_MS)


def test_best_price_wins_then_earliest_then_id():
    book = OrderBook()
    cheap_late = signed(offer(cpu_price=50_000), "a", T0 + 5)
    cheap_early = signed(offer(cpu_price=50_000), "b", T0 + 1)
    dear = signed(offer(cpu_price=40_000, mem_price=99_000), "c", T0)
    for o in (cheap_late, dear, cheap_early):
        book.add_offer(o, now_ms=T0 + 10)
    [match] = book.add_bid(signed(bid(), "buyer"), now_ms=T0 + 10, active=True)
    assert match.offer.id == cheap_early.id


def test_a_bid_that_waited_pays_the_offers_prices_not_its_limit():
    """spec/matching.md revision 2 (issue 17): a bid resting when an offer arrives trades at
    the offer's prices, as one that arrives after the offer does; before, it paid its own
    limit, and a job bid again after a provider fault cost ten times its first run."""
    book = OrderBook()
    resting = signed(bid(cpu_limit=1_000_000, mem_limit=100_000), "buyer")
    book.add_bid(resting, now_ms=T0, active=True)
    arriving = signed(offer(cpu_price=100_000, mem_price=10_000))
    [match] = book.add_offer(arriving, now_ms=T0)
    assert match.prices == arriving.payload.prices
    assert match.max_cost == quote(arriving.payload.prices, match.resources, HOUR_MS)


def test_bids_waiting_for_capacity_are_served_highest_limit_first():
    book = OrderBook()
    thrifty = signed(bid(cpu_limit=200_000, cpu_milli=3000), "thrifty")
    eager = signed(bid(cpu_limit=900_000, cpu_milli=3000), "eager")
    for order in (thrifty, eager):
        book.add_bid(order, now_ms=T0, active=True)
    [match] = book.add_offer(signed(offer(cpu_milli=4000)), now_ms=T0)
    assert match.bid.id == eager.id  # priority by what a bid would pay, price by the ask


def test_passive_orders_only_rest():
    book = OrderBook()
    book.add_offer(signed(offer()), now_ms=T0)
    assert book.add_bid(signed(bid(), "someone"), now_ms=T0) == []
    assert len(book) == 2


def test_explain_counts_each_constraint():
    book = OrderBook()
    book.add_offer(signed(offer(arch=Arch.ARM64), "arm"), now_ms=T0)
    book.add_offer(signed(offer(region="us"), "us"), now_ms=T0)
    book.add_offer(signed(offer(cpu_price=10**6), "dear"), now_ms=T0)
    book.add_offer(signed(offer(cpu_milli=500), "small"), now_ms=T0)
    wanted = bid(constraints=Constraints(arch=Arch.AMD64, regions=("eu",)))
    why = book.explain(wanted, now_ms=T0)
    assert why.offers == 4
    assert why.matching == 0
    assert why.ruled_out["arch"] == 1
    assert why.ruled_out["region"] == 1
    assert why.ruled_out["price"] == 1
    assert why.ruled_out["capacity"] == 1
    assert why.only_reason == {
        **dict.fromkeys(why.ruled_out, 0),
        "arch": 1,
        "region": 1,
        "price": 1,
        "capacity": 1,
    }
    assert why.best_quote is not None
    assert why.best_quote > why.budget


def test_trust_requirement_rules_out_offers_that_cannot_prove_it():
    book = OrderBook()
    book.add_offer(signed(offer(), "plain"), now_ms=T0)
    tpm = signed(offer(trust=(TrustLevel.NONE, TrustLevel.TPM)), "tpm")
    book.add_offer(tpm, now_ms=T0)
    needs = bid(constraints=Constraints(trust=TrustRequirement(level=TrustLevel.TPM)))
    [match] = book.add_bid(signed(needs, "buyer"), now_ms=T0, active=True)
    assert match.offer.id == tpm.id


def test_expired_orders_leave():
    book = OrderBook()
    o = signed(offer())
    book.add_offer(o, now_ms=T0)
    assert book.expire(T0 + HOUR_MS) == [o.id]
    assert len(book) == 0


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 16),
    asks=st.lists(st.tuples(st.integers(1, 6), st.booleans()), min_size=1, max_size=25),
)
def test_matching_never_overcommits_and_release_conserves(capacity, asks):
    book = OrderBook()
    provider_offer = signed(offer(cpu_milli=capacity * 1000, memory=capacity * GIB))
    book.add_offer(provider_offer, now_ms=T0)
    held = []
    for i, (cores, release_later) in enumerate(asks):
        need = bid(cpu_milli=cores * 1000, memory=cores * GIB)
        held += [
            (m, release_later) for m in book.add_bid(signed(need, f"b{i}"), now_ms=T0, active=True)
        ]
        used = sum(m.resources.cpu_milli for m, _ in held)
        assert used <= capacity * 1000
        assert book.offers[provider_offer.id].remaining.cpu_milli == capacity * 1000 - used
    for m, _ in held:
        book.release(m, rest_bid=False)
    assert book.offers[provider_offer.id].remaining == provider_offer.payload.capacity
    assert replace(provider_offer.payload.capacity) == Resources(
        cpu_milli=capacity * 1000, memory_bytes=capacity * GIB, disk_bytes=20 * GIB
    )
