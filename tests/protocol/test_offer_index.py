"""Our own bid's search through the CPU-price index finds exactly what scanning every offer
finds (protocol/offer_index.py), however offers came, went and tied."""

from __future__ import annotations

from dataclasses import replace

from factories import GIB, HOUR_MS, T0, Nonces, bid, key, offer
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.book import OrderBook, _fits
from protocol.envelope import seal
from protocol.messages import Constraints
from protocol.settlement import quote, quote_by_cpu_price

nonce = Nonces("index")

offers = st.lists(
    st.tuples(
        st.integers(1, 20).map(lambda n: n * 10_000),  # cpu price: ties are common
        st.integers(0, 30_000),  # memory price
        st.integers(1, 8),  # cores
        st.sampled_from(["eu", "us"]),
        st.integers(0, 3),  # issued, in ms after T0
        st.booleans(),  # cancelled before the bid comes
    ),
    max_size=40,
)
bids = st.tuples(
    st.integers(1, 8).map(lambda n: n * 500),  # millicores
    st.integers(5, 25).map(lambda n: n * 10_000),  # cpu limit
    st.integers(0, 30_000),  # memory limit
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


@settings(max_examples=120, deadline=None)
@given(offers, st.lists(bids, min_size=1, max_size=4))
def test_the_index_finds_what_a_full_scan_finds(resting, asks):
    book = OrderBook()
    for cpu_price, mem_price, cores, region, issued, cancelled in resting:
        payload = offer(cpu_milli=1000 * cores, cpu_price=cpu_price, mem_price=mem_price)
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
    for cpu_milli, cpu_limit, mem_limit, regions in asks:
        payload = bid(
            cpu_milli=cpu_milli,
            memory=GIB,
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


def test_the_lowest_quote_at_a_cpu_price_is_the_quote():
    payload = bid(cpu_milli=1500, memory=3 * GIB)
    at = offer(cpu_price=123_457, mem_price=777).prices
    lowest = quote_by_cpu_price(at, payload.resources, payload.job.wall_ms)
    assert lowest(123_457) == quote(at, payload.resources, payload.job.wall_ms)


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
