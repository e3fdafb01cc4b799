"""Our own bid's search through the price grid finds exactly what scanning every offer finds
(protocol/offer_index.py), however offers came, went and tied, and whatever the bid weighs."""

from __future__ import annotations

from dataclasses import replace

from factories import GIB, HOUR_MS, T0, Nonces, bid, key, offer
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.book import OrderBook, _fits
from protocol.envelope import seal
from protocol.messages import Constraints
from protocol.offer_index import _bucket
from protocol.settlement import quote, quote_by_cpu_and_memory_price

nonce = Nonces("index")

prices = st.one_of(
    st.integers(1, 20).map(lambda n: n * 10_000),  # ties are common
    st.integers(0, 40),  # one bucket per price
    st.integers(0, 1 << 24),  # many buckets
    st.integers(5, 24).map(lambda n: (1 << n) - 1),  # either side of a power of two
    st.integers(5, 24).map(lambda n: 1 << n),
)
offers = st.lists(
    st.tuples(
        prices,  # cpu price
        prices,  # memory price
        st.integers(1, 8),  # cores
        st.sampled_from([GIB, 8 * GIB, 512 * GIB]),  # memory
        st.sampled_from(["eu", "us"]),
        st.integers(0, 3),  # issued, in ms after T0
        st.booleans(),  # cancelled before the bid comes
    ),
    max_size=60,
)
bids = st.tuples(
    st.integers(1, 8).map(lambda n: n * 500),  # millicores
    st.sampled_from([0, GIB // 2, GIB, 16 * GIB, 256 * GIB]),  # memory: none to dominant
    prices,  # cpu limit
    prices,  # memory limit
    st.sampled_from([(), ("eu",), ("us",)]),
)


def scan(book: OrderBook, payload, now_ms: int):
    """The reference: every offer quoted, the least (quote, issued, id) that fits."""
    return min(
        (
            (quote(o.offer.prices, payload.resources, payload.job.wall_ms), o.order.issued_ms, k)
            for k, o in book.offers.items()
            if o.order.expires_ms > now_ms and _fits(payload, o, {})
        ),
        default=None,
    )


@settings(max_examples=300, deadline=None)
@given(offers, st.lists(bids, min_size=1, max_size=4))
def test_the_index_finds_what_a_full_scan_finds(resting, asks):
    book = OrderBook()
    for cpu_price, mem_price, cores, memory, region, issued, cancelled in resting:
        payload = offer(
            cpu_milli=1000 * cores, memory=memory, cpu_price=cpu_price, mem_price=mem_price
        )
        signer = key(f"p{cpu_price}{mem_price}{issued}")
        order = seal(
            signer,
            replace(payload, region=region),
            nonce=nonce(),
            issued_ms=T0 + issued,
            expires_ms=T0 + HOUR_MS,
        )
        book.add_offer(order, now_ms=T0)
        if cancelled:
            assert book.cancel(order.id, signer.public_key.raw)
    for cpu_milli, memory, cpu_limit, mem_limit, regions in asks:
        payload = bid(
            cpu_milli=cpu_milli,
            memory=memory,
            cpu_limit=cpu_limit,
            mem_limit=mem_limit,
            constraints=Constraints(regions=regions),
        )
        expected = scan(book, payload, T0 + 5)
        order = seal(key("buyer"), payload, nonce=nonce(), issued_ms=T0, expires_ms=T0 + HOUR_MS)
        matches = book.add_bid(order, now_ms=T0 + 5, active=True)
        if expected is None:
            assert matches == []
        else:
            [match] = matches
            assert match.offer.id == expected[2]
            assert match.max_cost == expected[0]


def test_the_lowest_quote_at_a_cpu_and_memory_price_is_the_quote():
    payload = bid(cpu_milli=1500, memory=3 * GIB)
    at = offer(cpu_price=123_457, mem_price=777).prices
    lowest = quote_by_cpu_and_memory_price(at, payload.resources, payload.job.wall_ms)
    assert lowest(123_457, 777) == quote(at, payload.resources, payload.job.wall_ms)


@given(st.integers(0, 1 << 40), st.integers(0, 1 << 40))
def test_a_dearer_price_never_falls_in_a_lower_bucket(a, b):
    low, high = sorted((a, b))
    assert _bucket(low) <= _bucket(high)


def _resting(who: str, payload):
    return seal(key(who), payload, nonce=nonce(), issued_ms=T0, expires_ms=T0 + HOUR_MS)


def test_an_offer_dearer_in_cpu_can_still_be_the_cheapest_and_the_search_goes_on_to_it():
    book = OrderBook()
    cheap_cpu = _resting("a", offer(cpu_price=10_000, mem_price=30_000))
    cheap_overall = _resting("b", offer(cpu_price=20_000, mem_price=0))
    too_dear = _resting("c", offer(cpu_price=900_000, mem_price=0))
    for order in (too_dear, cheap_cpu, cheap_overall):
        book.add_offer(order, now_ms=T0)
    payload = bid(cpu_milli=1000, memory=GIB, cpu_limit=1_000_000, mem_limit=30_000)
    [match] = book.add_bid(_resting("buyer", payload), now_ms=T0, active=True)
    assert match.offer.id == cheap_overall.id


def test_a_row_dearer_in_cpu_is_searched_before_a_dear_cell_of_a_cheaper_row_ends_it():
    """The cheapest CPU row's best cell does not fit; its next cells fit but are dear; an
    offer of a dearer CPU row is cheaper overall, and the search must reach it first."""
    book = OrderBook()
    unfit = _resting("a", replace(offer(cpu_price=10_000, mem_price=0), region="us"))
    dear = _resting("b", offer(cpu_price=10_000, mem_price=400_000))
    dearer = _resting("c", offer(cpu_price=10_000, mem_price=900_000))
    cheaper = _resting("d", offer(cpu_price=40_000, mem_price=0))
    for order in (unfit, dear, dearer, cheaper):
        book.add_offer(order, now_ms=T0)
    payload = bid(
        cpu_milli=1000,
        memory=GIB,
        cpu_limit=1_000_000,
        mem_limit=1_000_000,
        constraints=Constraints(regions=("eu",)),
    )
    [match] = book.add_bid(_resting("buyer", payload), now_ms=T0, active=True)
    assert match.offer.id == cheaper.id
