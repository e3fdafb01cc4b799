"""``why_not``: what a user reads when a bid does not match."""

from __future__ import annotations

from factories import GIB, HOUR_MS, T0, Nonces, bid, key, offer

from protocol.book import OrderBook
from protocol.envelope import seal
from protocol.explain import why_not
from protocol.messages import Arch, Constraints


def _book(*offers):
    book = OrderBook()
    nonce = Nonces()
    for i, o in enumerate(offers):
        signed = seal(key(f"p{i}"), o, nonce=nonce(), issued_ms=T0, expires_ms=T0 + HOUR_MS)
        book.add_offer(signed, now_ms=T0)
    return book


def _why(book, b):
    return why_not(book.explain(b, now_ms=T0), b)


def test_price_is_compared_per_unit_naming_the_resource():
    """A memory price limit below every ask is named as memory, per GiB-hour, not as a
    comparison of totals."""
    book = _book(offer(cpu_price=90_000, mem_price=9_000_000), offer(mem_price=12_000_000))
    text = _why(book, bid(cpu_limit=1_500_000, mem_limit=1_500_000))
    assert text == (
        "none of 2 offers fits (price rules out 2): memory costs at least 9.00 credits per "
        "GiB-hour, your limit is 1.50"
    )


def test_capacity_names_the_largest_free():
    book = _book(offer(cpu_milli=4000), offer(cpu_milli=2000))
    text = _why(book, bid(cpu_milli=64_000))
    assert text == (
        "none of 2 offers fits (capacity rules out 2): CPU: 64 cores asked, 4 cores free at most"
    )


def test_a_constraint_no_offer_meets_is_named():
    book = _book(offer(region="us"), offer(region="ap"))
    text = _why(book, bid(constraints=Constraints(regions=("eu", "sa"))))
    assert text == "none of 2 offers fits (region rules out 2): no offer is in eu or sa"
    text = _why(book, bid(constraints=Constraints(arch=Arch.ARM64)))
    assert text == "none of 2 offers fits (arch rules out 2): no offer runs arm64"


def test_constraints_that_only_exclude_together_say_so():
    book = _book(offer(region="us"), offer(region="eu", arch=Arch.ARM64))
    text = _why(book, bid(constraints=Constraints(regions=("eu",), arch=Arch.AMD64)))
    assert text == (
        "none of 2 offers fits (arch rules out 1, region rules out 1): "
        "no offer passes all of them together"
    )


def test_no_offers_and_fitting_offers():
    assert _why(OrderBook(), bid()).startswith("no offers are known to this node yet")
    assert _why(_book(offer()), bid()) == (
        "1 of 1 offers fit; negotiation is under way or they refused"
    )


def test_memory_and_cpu_short_together():
    book = _book(offer(cpu_milli=1000, memory=GIB))
    text = _why(book, bid(cpu_milli=2000, memory=2 * GIB))
    assert text.endswith(
        "CPU: 2 cores asked, 1 core free at most; memory: 2 GiB asked, 1 GiB free at most"
    )
