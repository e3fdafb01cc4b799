"""Staying in touch with the market: bootstrap peers kept, new peers greeted, offers found.

:func:`keep_in_touch` runs three things beside a node's :class:`~node.market.gossip.Market`:

- Bootstrap peers are dialled at start and again, with backoff, whenever they are gone
  (``node/net/links.py``): a restarted bootstrap node is found again without help.
- Every peer a connection comes up with, inbound or outbound, first or again after a
  restart, is greeted (:meth:`Market.greet`: hello, book, our orders again), so both sides
  learn where the other is now and what it offers.
- DHT discovery: a node announces a provider record for the resource classes of its live
  offers (:func:`offer_keys`) and looks up the class of each of its live bids
  (:func:`bid_key`); a provider found whose offer this node's book lacks is dialled
  (directly, else through a relay) and its book taken. So a node that joined late or was
  cut off by a partition finds offers it never saw gossiped.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from node.market.gossip import Market
from node.net.links import keep_connected, watch_peers
from node.net.transport import NetworkError, PeerId
from protocol.messages import Bid, Offer

if TYPE_CHECKING:
    from trio_typing import TaskStatus  # see node/net/memnet.py: trio-stubs shadow trio

__all__ = ["DISCOVERY_S", "bid_key", "discover", "keep_in_touch", "offer_keys", "reach"]

log = logging.getLogger(__name__)

DISCOVERY_S = 10.0  # between two rounds of DHT look-ups for our bids
REANNOUNCE_S = 300.0  # provider records are announced again this often (they expire)
_ROOT = "cx/offers/1"


def offer_keys(offer: Offer) -> list[str]:
    """The DHT keys an offer is announced under: its class and each prefix of it."""
    kind = f"gpu:{offer.gpus[0].model}" if offer.gpus else "cpu"
    parts = [offer.arch.value, kind, offer.region or "any"]
    return [_ROOT] + ["/".join([_ROOT, *parts[:n]]) for n in range(1, len(parts) + 1)]


def bid_key(bid: Bid) -> str:
    """The most specific key of :func:`offer_keys` that every offer the bid fits has."""
    c = bid.constraints
    if c.arch is None:
        return _ROOT
    if c.gpu_model is None:
        return f"{_ROOT}/{c.arch.value}"
    key = f"{_ROOT}/{c.arch.value}/gpu:{c.gpu_model}"
    return f"{key}/{c.regions[0]}" if len(c.regions) == 1 else key


async def keep_in_touch(
    market: Market,
    bootstrap: Sequence[str],
    *,
    task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the three until cancelled; started once each bootstrap peer was dialled once."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_peers, market.net, market.greet, market.forget)
        await nursery.start(keep_connected, market.net, bootstrap)
        nursery.start_soon(discover, market)
        task_status.started()


async def reach(market: Market, peer: PeerId) -> None:
    """Connect to ``peer`` before a stream is opened to it, if we can.

    A peer known only from its gossip (an offer relayed by others) has no address here: it
    may have greeted our bootstrap peer after we did. Dial it where hello told us it is,
    else hello our peers again, which dials the peers they learned of since; what fails is
    left to the stream's own dial to report.
    """
    net = market.net
    if peer in net.peers():
        return
    if (addr := market.addresses.get(peer)) is not None:
        with contextlib.suppress(NetworkError):
            await net.connect(addr)
            return
    for other in sorted(net.peers()):
        await market.hello(other)
        if peer in net.peers():
            return


async def discover(market: Market, *, interval_s: float = DISCOVERY_S) -> None:
    """Announce our offers' classes and find providers for our bids' classes, for ever."""
    announced: set[str] = set()
    announced_at = -REANNOUNCE_S
    while True:
        now = market.now_ms()
        mine = market.trader.me
        book = market.trader.book
        keys = {
            key
            for o in book.live_offers(now)
            if o.order.signer == mine
            for key in offer_keys(o.offer)
        }
        stale = trio.current_time() - announced_at >= REANNOUNCE_S
        if keys and market.net.peers() and (keys != announced or stale):
            for key in sorted(keys):
                await market.net.provide(key)
            announced, announced_at = keys, trio.current_time()
        wanted = {
            bid_key(b.bid)
            for b in book.bids.values()
            if b.order.signer == mine and b.order.expires_ms > now
        }
        for key in sorted(wanted):
            for peer, addrs in (await market.net.find_providers(key)).items():
                await _take_offers(market, peer, addrs)
        await trio.sleep(interval_s)


async def _take_offers(market: Market, peer: PeerId, addrs: list[str]) -> None:
    """Get ``peer``'s offers into our book, dialling it first if need be."""
    now = market.now_ms()
    if any(o.order.signer.peer_id == peer for o in market.trader.book.live_offers(now)):
        return
    if peer in market.net.peers():
        await market.sync_book(peer)
        return
    for addr in [a for a in [market.addresses.get(peer)] if a] + addrs:
        try:
            await market.join(addr)
        except NetworkError as exc:
            log.info("provider %s not reachable at %s: %s", peer, addr, exc)
            continue
        log.info("found provider %s through the DHT at %s", peer, addr)
        return
