"""A provider's prices on the move: the pricing policies of protocol/pricing.py applied to
what the node sees (its committed capacity, the tape), and a fresh offer gossiped when a
price moved enough (spec/pricing.md).

The loop wakes when something changed on the node (a hold taken or given back, a print on
the tape) and at least once per ``min_interval_ms``; it evaluates at most ten times per
interval, however busy gossip is, and re-posts only as :func:`~protocol.pricing.should_repost`
allows.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from node.market.gossip import Market
from protocol.messages import Offer, Prices, Resources
from protocol.pricing import PRICE_FIELDS, Pricing, asking, should_repost
from protocol.selling import Selling
from protocol.tape import resource_class

__all__ = ["asking_now", "follow_prices"]

log = logging.getLogger(__name__)


def asking_now(
    pricing: Pricing, market: Market, selling: Selling, offer: Offer, capacity: Resources
) -> Prices:
    """The prices ``pricing`` asks now for ``offer``'s class and ``capacity``."""
    since = market.now_ms() - pricing.window_ms
    prints = list(market.tape.prints(since_ms=since, resource_class=resource_class(offer)))
    by_field = {f: [getattr(t.prices, f) for t in prints] for f, _ in PRICE_FIELDS}
    return asking(pricing, held=selling.held(), capacity=capacity, prints=by_field)


async def follow_prices(
    pricing: Pricing,
    market: Market,
    current: Callable[[], tuple[Prices, int]],
    ask: Callable[[], Prices],
    post: Callable[[Prices], Awaitable[None]],
) -> None:
    """Re-post at :func:`asking_now`'s prices whenever they moved enough; runs until
    cancelled. ``current`` gives the posted prices and when they were posted."""
    interval_s = pricing.min_interval_ms / 1000
    while True:
        with trio.move_on_after(interval_s):
            await market.changed()
        posted, posted_ms = current()
        new = ask()
        if should_repost(
            posted,
            new,
            step_ppm=pricing.step_ppm,
            posted_ms=posted_ms,
            now_ms=market.now_ms(),
            min_interval_ms=pricing.min_interval_ms,
        ):
            log.info(
                "prices move: CPU %d -> %d per core-hour", posted.cpu_core_hour, new.cpu_core_hour
            )
            await post(new)
        await trio.sleep(interval_s / 10)
