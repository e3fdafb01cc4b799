"""Bids per unit of work (protocol/work.py) in the order book: the per-work limit picks
the offer whose cores do the most work for its price, not the lowest core-hour price."""

from __future__ import annotations

from dataclasses import replace

from factories import HOUR_MS, T0, Nonces, bid, key, offer

from protocol.book import OrderBook
from protocol.envelope import seal


def _offer(name: str, nonce: Nonces, *, price: int, score: int | None):
    payload = replace(offer(cpu_price=price), work_score=score)
    return seal(key(name), payload, nonce=nonce(), issued_ms=T0, expires_ms=T0 + HOUR_MS)


def test_a_per_work_bid_takes_the_cheaper_work_not_the_cheaper_core_hour():
    book, nonce = OrderBook(), Nonces()
    old = _offer("old-xeon", nonce, price=100_000, score=100)  # 1000 per unit
    new = _offer("new-epyc", nonce, price=150_000, score=300)  # 500 per unit
    unscored = _offer("unknown", nonce, price=50_000, score=None)
    for o in (old, new, unscored):
        book.add_offer(o, now_ms=T0)
    per_work = replace(bid(cpu_limit=200_000), max_work_price=600)
    order = seal(key("buyer"), per_work, nonce=nonce(), issued_ms=T0, expires_ms=T0 + HOUR_MS)
    [match] = book.add_bid(order, now_ms=T0, active=True)
    assert match.offer.id == new.id
    why = book.explain(per_work, now_ms=T0)
    assert why.ruled_out["price"] == 2  # the old one costs too much per unit; one has no score
