"""Order book and matching (spec/matching.md).

Rules:
- Offers are divisible capacity; bids are indivisible jobs. A match reserves the bid's
  resources from the offer's remaining capacity, so the book never overcommits a provider.
  A released match (negotiation failed) gives the capacity back and the bid rests again.
- Price-time priority. Against an incoming bid, the offer with the lowest quote plus the cost
  of moving the bid's data there (protocol/transfer.py) wins, then the one that must bring
  in fewer bytes; against an incoming offer, the bid with the highest budget wins. Ties
  break by the signed issue time, then by order id, so every node ranks the same book the
  same way.
- A trade happens at the offer's unit prices, whichever order came first (the bid's limits
  are caps), and only if every unit price the bid pays is within the bid's limit. The
  agreement's cap is the quote at those prices.
- Only active orders (this node's own, or ones it chose to take) start matches; a passive
  order from gossip only rests, and is matched when an active counter-order meets it.
- Every constraint of the bid is respected. ``explain`` says, per constraint, how many offers
  it ruled out, in the spirit of HTCondor's ``condor_q -better-analyze``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import TypeVar

from protocol.elastic import ceiling
from protocol.envelope import MessageId, Signed
from protocol.errors import LocalProtocolError, Reason
from protocol.hardware import hardware_fits
from protocol.messages import Bid, Offer, Prices, Resources, TrustLevel
from protocol.offer_index import OfferIndex
from protocol.settlement import quote, quote_by_cpu_and_memory_price
from protocol.transfer import NO_TRANSFER, TransferCost, transfer_cost, within_budget
from protocol.work import work_fits

__all__ = [
    "CONSTRAINTS",
    "Explanation",
    "Match",
    "OrderBook",
    "Ranked",
    "RestingBid",
    "RestingOffer",
]

Reputation = Mapping[bytes, int]
_F = TypeVar("_F", Resources, Prices)
_NO_REPUTATION: Reputation = MappingProxyType({})


@dataclass(slots=True)
class RestingOffer:
    order: Signed[Offer]
    remaining: Resources
    active: bool

    @property
    def offer(self) -> Offer:
        return self.order.payload


@dataclass(slots=True)
class RestingBid:
    order: Signed[Bid]
    active: bool
    budget: int  # the bid's quote at its own price limits

    @property
    def bid(self) -> Bid:
        return self.order.payload


@dataclass(frozen=True, slots=True, kw_only=True)
class Match:
    bid: Signed[Bid]
    offer: Signed[Offer]
    prices: Prices
    resources: Resources
    max_cost: int
    transfer: TransferCost = NO_TRANSFER  # moving the bid's data there (not billed)

    @property
    def buyer(self) -> bytes:
        return self.bid.signer.raw

    @property
    def provider(self) -> bytes:
        return self.offer.signer.raw


def _gpu_models_fit(bid: Bid, offer: Offer) -> bool:
    model = bid.constraints.gpu_model
    if bid.resources.gpus == 0 or model is None:
        return True
    return sum(1 for gpu in offer.gpus if gpu.model == model) >= bid.resources.gpus


def _region_fits(bid: Bid, offer: Offer) -> bool:
    return not bid.constraints.regions or offer.region in bid.constraints.regions


def _trust_fits(bid: Bid, offer: Offer) -> bool:
    level = bid.constraints.trust.level
    return level is TrustLevel.NONE or level in offer.trust


# Each constraint: (name, rules-in predicate). The order is the order ``explain`` lists.
_Check = Callable[[Bid, RestingOffer, Reputation], bool]
CONSTRAINTS: tuple[tuple[str, _Check], ...] = (
    ("arch", lambda b, o, r: b.constraints.arch in (None, o.offer.arch)),
    ("region", lambda b, o, r: _region_fits(b, o.offer)),
    ("trust", lambda b, o, r: _trust_fits(b, o.offer)),
    (
        "reputation",
        lambda b, o, r: r.get(o.order.signer.raw, 0) >= b.constraints.min_reputation,
    ),
    ("gpu-model", lambda b, o, r: _gpu_models_fit(b, o.offer)),
    ("hardware", lambda b, o, r: hardware_fits(b.constraints.hardware, o.offer.hardware)),
    ("network", lambda b, o, r: o.offer.network or not b.job.network),
    ("wall-time", lambda b, o, r: b.job.wall_ms <= o.offer.max_wall_ms),
    ("capacity", lambda b, o, r: b.resources.fits_in(o.remaining)),
    ("provider", lambda b, o, r: b.constraints.provider in (None, o.order.signer.raw)),
    (
        "price",
        lambda b, o, r: (
            o.offer.prices.all_at_most(b.max_prices, b.resources)
            and work_fits(o.offer, b.max_work_price)
        ),
    ),
    ("transfer", lambda b, o, r: within_budget(b, o.offer)),
)


def _budget(bid: Bid) -> int:
    """A bid's quote at its own price limits: the most it can pay."""
    return quote(bid.max_prices, ceiling(bid.resources, bid.elastic), bid.job.wall_ms)


def _fieldwise(pick: Callable[[int, int], int], a: _F | None, b: _F) -> _F:
    """``b``, or ``pick`` of ``a``'s and ``b``'s value in every field (Resources, Prices)."""
    if a is None:
        return b
    return replace(b, **{f.name: pick(getattr(a, f.name), getattr(b, f.name)) for f in fields(b)})


def _fits(bid: Bid, offer: RestingOffer, reputation: Reputation) -> bool:
    # A plain loop, not all() over a generator: every gossiped order comes through here.
    for _, check in CONSTRAINTS:  # noqa: SIM110
        if not check(bid, offer, reputation):
            return False
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class Explanation:
    """Why a bid matches no offer: per constraint, how many offers it ruled out."""

    offers: int
    matching: int
    ruled_out: dict[str, int]
    only_reason: dict[str, int]  # offers ruled out by this constraint alone
    best_quote: int | None  # cheapest offer that passes every constraint but price
    budget: int  # the bid's quote at its own limits
    # Per resource, the most capacity free on any offer that passes every constraint but
    # capacity and price, and the lowest unit price of any that passes all but price.
    largest_free: Resources | None = None
    cheapest: Prices | None = None
    # The cheapest move of the bid's data among offers that fail only on its budget.
    least_transfer: TransferCost | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Ranked:
    """An offer as a bid's matching ranks it: its quote and the cost of moving the data."""

    offer: Signed[Offer]
    quote: int
    transfer: TransferCost
    within_budget: bool

    @property
    def total(self) -> int:
        return self.quote + self.transfer.total


_Rank = tuple[int, int, int, MessageId]  # (quote + transfer, bytes moved, iat, id)


def _rank(bid: Bid, offer: RestingOffer) -> _Rank:
    moving = transfer_cost(bid, offer.offer)
    price = quote(offer.offer.prices, bid.resources, bid.job.wall_ms)
    return (price + moving.total, moving.moved_bytes, offer.order.issued_ms, offer.order.id)


@dataclass(slots=True)
class OrderBook:
    """Resting offers and bids of one node. Time comes in as ``now_ms``."""

    offers: dict[MessageId, RestingOffer] = field(default_factory=dict)
    bids: dict[MessageId, RestingBid] = field(default_factory=dict)
    _pending: dict[MessageId, RestingBid] = field(default_factory=dict)  # matched bids
    # Active orders are few (this node's own); indexing them keeps a gossip ingest O(active).
    _active: set[MessageId] = field(default_factory=set)
    _expiry: list[tuple[int, MessageId]] = field(default_factory=list)
    _by_price: OfferIndex = field(default_factory=OfferIndex)  # our own bids' search

    def __len__(self) -> int:
        return len(self.offers) + len(self.bids)

    # -- adding orders ---------------------------------------------------------------

    def add_offer(
        self,
        order: Signed[Offer],
        *,
        now_ms: int,
        active: bool = False,
        reputation: Reputation = _NO_REPUTATION,
    ) -> list[Match]:
        """Rest ``order`` and match it against resting bids; returns the matches made."""
        self._check_new(order.id)
        resting = RestingOffer(order=order, remaining=order.payload.capacity, active=active)
        self.offers[order.id] = resting
        self._by_price.add(order.id, order.payload.prices)
        self._rest(order.id, order.expires_ms, active)
        bids = self.bids.values() if active else (self.bids[k] for k in self._active_bids())
        candidates = sorted(
            (b for b in bids if b.order.expires_ms > now_ms),
            key=lambda b: (-b.budget, b.order.issued_ms, b.order.id),
        )
        # Every bid trades at the offer's prices; capacity shrinks as we go.
        return [self._fill(b, resting) for b in candidates if _fits(b.bid, resting, reputation)]

    def add_bid(
        self,
        order: Signed[Bid],
        *,
        now_ms: int,
        active: bool = False,
        reputation: Reputation = _NO_REPUTATION,
    ) -> list[Match]:
        """Rest ``order`` or match it at once against the best resting offer."""
        self._check_new(order.id)
        bid = order.payload
        resting_bid = RestingBid(
            order=order,
            active=active,
            budget=_budget(bid),
        )
        self.bids[order.id] = resting_bid
        self._rest(order.id, order.expires_ms, active)
        return self.rematch(order.id, now_ms=now_ms, reputation=reputation)

    def fits(
        self, bid_id: MessageId, offer_id: MessageId, *, reputation: Reputation = _NO_REPUTATION
    ) -> bool:
        """Could the resting bid trade on the offer now (every constraint, capacity and
        price included)?"""
        bid, offer = self.bids.get(bid_id), self.offers.get(offer_id)
        return bid is not None and offer is not None and _fits(bid.bid, offer, reputation)

    def match_invited(
        self,
        bid_id: MessageId,
        offer_id: MessageId,
        *,
        now_ms: int,
        reputation: Reputation = _NO_REPUTATION,
    ) -> Match | None:
        """Match our resting bid with the offer whose provider invited it, if it fits."""
        offer = self.offers.get(offer_id)
        if offer is None or offer.order.expires_ms <= now_ms:
            return None
        if not self.fits(bid_id, offer_id, reputation=reputation):
            return None
        return self._fill(self.bids[bid_id], offer)

    def rematch(
        self,
        bid_id: MessageId,
        *,
        now_ms: int,
        exclude: frozenset[MessageId] = frozenset(),
        reputation: Reputation = _NO_REPUTATION,
    ) -> list[Match]:
        """Match a resting bid against the best offer not in ``exclude`` (offers that
        already refused it). A passive bid is only matched against active offers; a bid
        that left the book meanwhile (expired, cancelled, re-posted) has none."""
        resting_bid = self.bids.get(bid_id)
        if resting_bid is None:
            return []
        bid = resting_bid.bid
        if resting_bid.active:
            best = self._cheapest(bid, now_ms, exclude, reputation)
        else:
            best = min(
                (
                    _rank(bid, o)
                    for k in self._active_offers()
                    if k not in exclude
                    and (o := self.offers[k]).order.expires_ms > now_ms
                    and _fits(bid, o, reputation)
                ),
                default=None,
            )
        if best is None:
            return []
        return [self._fill(resting_bid, self.offers[best[-1]])]

    def _cheapest(
        self, bid: Bid, now_ms: int, exclude: frozenset[MessageId], reputation: Reputation
    ) -> _Rank | None:
        """The best rank of every offer that fits ``bid``, searched by price cell, cheapest
        first, until no offer left can cost less (protocol/offer_index.py): moving data
        costs nothing or more, so a cell whose lowest quote is above the best total cannot
        hold the winner."""
        index = self._by_price
        if index.floor is None:
            return None
        lowest = quote_by_cpu_and_memory_price(index.floor, bid.resources, bid.job.wall_ms)
        memory_limit = bid.max_prices.memory_gib_hour if bid.resources.memory_bytes else None
        best: _Rank | None = None
        for bound, keys in index.cheapest_first(
            lowest, cpu_limit=bid.max_prices.cpu_core_hour, memory_limit=memory_limit
        ):
            if best is not None and bound > best[0]:
                break
            for key in keys:
                offer = self.offers[MessageId(key)]
                if key in exclude or offer.order.expires_ms <= now_ms:
                    continue
                if _fits(bid, offer, reputation):
                    candidate = _rank(bid, offer)
                    best = candidate if best is None else min(best, candidate)
        return best

    def _rest(self, order_id: MessageId, expires_ms: int, active: bool) -> None:
        heapq.heappush(self._expiry, (expires_ms, order_id))
        if active:
            self._active.add(order_id)

    def _active_offers(self) -> list[MessageId]:
        return [k for k in self._active if k in self.offers]

    def _active_bids(self) -> list[MessageId]:
        return [k for k in self._active if k in self.bids]

    def _check_new(self, order_id: MessageId) -> None:
        if order_id in self.offers or order_id in self.bids or order_id in self._pending:
            raise LocalProtocolError(Reason.REPLAYED, "order is already in the book")

    def reserve(self, offer_id: MessageId, need: Resources) -> None:
        """Take ``need`` from an offer's remaining capacity (a provider accepting).

        Raises:
            LocalProtocolError(TERMS_MISMATCH) if it does not fit.
        """
        offer = self.offers.get(offer_id)
        if offer is None or not need.fits_in(offer.remaining):
            raise LocalProtocolError(Reason.TERMS_MISMATCH, "the offer has no such capacity left")
        offer.remaining = offer.remaining.minus(need)

    def give_back(self, offer_id: MessageId, need: Resources) -> None:
        """Return reserved capacity to an offer (if it is still in the book)."""
        offer = self.offers.get(offer_id)
        if offer is not None:
            offer.remaining = offer.remaining.plus(need)

    def _fill(self, bid: RestingBid, offer: RestingOffer) -> Match:
        prices = offer.offer.prices
        need = bid.bid.resources
        self.reserve(offer.order.id, need)
        self._pending[bid.order.id] = self.bids.pop(bid.order.id)
        return Match(
            bid=bid.order,
            offer=offer.order,
            prices=prices,
            resources=need,
            max_cost=quote(prices, ceiling(need, bid.bid.elastic), bid.bid.job.wall_ms),
            transfer=transfer_cost(bid.bid, offer.offer),
        )

    # -- removing orders -------------------------------------------------------------

    def release(self, match: Match, *, rest_bid: bool) -> None:
        """End ``match``: the offer gets its capacity back. With ``rest_bid`` (negotiation
        failed) the bid rests again as it was; without (the job is over) it is gone."""
        self.give_back(match.offer.id, match.resources)
        pending = self._pending.pop(match.bid.id, None)
        if rest_bid and pending is not None:
            self.bids[match.bid.id] = pending
        else:
            self._active.discard(match.bid.id)

    def cancel(self, order_id: bytes, signer: bytes) -> bool:
        """Remove an order on its signer's request; False if absent or not theirs."""
        key = MessageId(order_id)
        resting: RestingOffer | RestingBid | None = self.offers.get(key) or self.bids.get(key)
        if resting is None or resting.order.signer.raw != signer:
            return False
        self._forget(key)
        return True

    def expire(self, now_ms: int) -> list[MessageId]:
        """Drop orders that expired at or before ``now_ms``; returns their ids."""
        gone = []
        while self._expiry and self._expiry[0][0] <= now_ms:
            _, key = heapq.heappop(self._expiry)
            if key in self.offers or key in self.bids:
                self._forget(key)
                gone.append(key)
        return gone

    def _forget(self, key: MessageId) -> None:
        offer = self.offers.pop(key, None)
        if offer is not None:
            self._by_price.discard(key, offer.offer.prices)
        self.bids.pop(key, None)
        self._active.discard(key)

    # -- questions -------------------------------------------------------------------

    def explain(
        self, bid: Bid, *, now_ms: int, reputation: Reputation = _NO_REPUTATION
    ) -> Explanation:
        """Per-constraint counts of what rules each live offer out for ``bid``."""
        ruled_out = dict.fromkeys((name for name, _ in CONSTRAINTS), 0)
        only = dict(ruled_out)
        matching = 0
        best: int | None = None
        largest: Resources | None = None
        cheapest: Prices | None = None
        least_transfer: TransferCost | None = None
        live = list(self.live_offers(now_ms))
        for offer in live:
            failed = [name for name, check in CONSTRAINTS if not check(bid, offer, reputation)]
            for name in failed:
                ruled_out[name] += 1
            if len(failed) == 1:
                only[failed[0]] += 1
            if not failed:
                matching += 1
            if set(failed) <= {"capacity", "price"}:
                largest = _fieldwise(max, largest, offer.remaining)
            if not failed or failed == ["price"]:
                price = quote(offer.offer.prices, bid.resources, bid.job.wall_ms)
                best = price if best is None else min(best, price)
                cheapest = _fieldwise(min, cheapest, offer.offer.prices)
            if failed == ["transfer"]:
                moving = transfer_cost(bid, offer.offer)
                if least_transfer is None or moving.total < least_transfer.total:
                    least_transfer = moving
        return Explanation(
            offers=len(live),
            matching=matching,
            ruled_out=ruled_out,
            only_reason=only,
            best_quote=best,
            budget=_budget(bid),
            largest_free=largest,
            cheapest=cheapest,
            least_transfer=least_transfer,
        )

    def ranking(
        self, bid: Bid, *, now_ms: int, reputation: Reputation = _NO_REPUTATION
    ) -> list[Ranked]:
        """The live offers ``bid`` could trade on but for capacity (a matched bid holds
        some) and its transfer budget, best first, as matching ranks them."""
        out = []
        for offer in self.live_offers(now_ms):
            failed = {name for name, check in CONSTRAINTS if not check(bid, offer, reputation)}
            if failed <= {"capacity", "transfer"}:
                ranked = Ranked(
                    offer=offer.order,
                    quote=quote(offer.offer.prices, bid.resources, bid.job.wall_ms),
                    transfer=transfer_cost(bid, offer.offer),
                    within_budget="transfer" not in failed,
                )
                out.append(ranked)
        return sorted(
            out,
            key=lambda r: (r.total, r.transfer.moved_bytes, r.offer.issued_ms, r.offer.id),
        )

    def live_offers(self, now_ms: int) -> Iterator[RestingOffer]:
        return (o for o in self.offers.values() if o.order.expires_ms > now_ms)
