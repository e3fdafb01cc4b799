"""The sans-IO market participant's shared part: one per node, buyer and provider alike.

A :class:`Trader` holds what both roles share: the node's key, its order book, its ledger,
the reputation it has formed of others and the replay guard. It admits gossiped orders and
signs the node's own. The roles build on it, one object each over the same Trader:
:class:`protocol.buying.Buying` (bids, proposals, agreements, countersigned receipts) and
:class:`protocol.selling.Selling` (offers, accepts, job statuses, usage receipts).

It never touches a socket, a clock or a random source: ``now_ms`` and nonces are arguments.
The trio node wraps it; tests drive two of them against each other with no event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from protocol.admission import AdmissionPolicy, ReplayGuard, admit
from protocol.book import Match, OrderBook
from protocol.envelope import MessageId, Signed, open_signed, seal
from protocol.errors import InvalidMessage, LocalProtocolError, Reason
from protocol.identity import PrivateKey, PublicKey
from protocol.messages import Bid, Cancel, Offer
from protocol.negotiation import Agreement
from protocol.receipts import CountersignedReceipt
from protocol.settlement import Ledger, LedgerEntry

__all__ = ["NEGOTIATION_TTL_MS", "Trader"]

T = TypeVar("T")
NEGOTIATION_TTL_MS = 60_000  # lifetime of proposals, replies, statuses and cancels


@dataclass(slots=True)
class Trader:
    key: PrivateKey
    policy: AdmissionPolicy = field(default_factory=AdmissionPolicy)
    book: OrderBook = field(default_factory=OrderBook)
    ledger: Ledger = field(default_factory=Ledger)
    reputation: dict[bytes, int] = field(default_factory=dict)
    guard: ReplayGuard = field(default_factory=ReplayGuard)

    @property
    def me(self) -> PublicKey:
        return self.key.public_key

    def seal(self, payload: T, nonce: bytes, now_ms: int, ttl_ms: int) -> Signed[T]:
        """Sign one of our messages, valid from ``now_ms`` for ``ttl_ms``."""
        return seal(self.key, payload, nonce=nonce, issued_ms=now_ms, expires_ms=now_ms + ttl_ms)

    def open(self, wire: bytes, expect: type[T], now_ms: int) -> Signed[T]:
        """Open and admit a message sent to us directly.

        Raises:
            DecodeError, InvalidMessage: not a fresh, well-signed ``expect``.
        """
        msg = open_signed(wire, expect)
        self.admit(msg, now_ms)
        return msg

    def admit(self, msg: Signed[Any], now_ms: int) -> None:
        """Check an opened message's time and that it is not a replay.

        Raises:
            InvalidMessage: EXPIRED, NOT_YET_VALID, TTL_TOO_LONG or REPLAYED.
        """
        admit(msg, now_ms, self.guard, self.policy)

    # -- orders ----------------------------------------------------------------------

    def post(
        self, payload: Offer | Bid, *, nonce: bytes, now_ms: int, ttl_ms: int
    ) -> tuple[Signed[Any], list[Match]]:
        """Sign one of our own orders, rest it actively; returns it (to gossip) and matches."""
        order: Signed[Any] = self.seal(payload, nonce, now_ms, ttl_ms)
        return order, self._add(order, now_ms=now_ms, active=True)

    def receive_order(self, wire: bytes, *, now_ms: int) -> tuple[Signed[Any], list[Match]]:
        """Admit a gossiped offer, bid or cancel (the topic validator's work).

        Raises:
            DecodeError, InvalidMessage: the message must not be forwarded.
        """
        return self.take_order(open_signed(wire), now_ms=now_ms)

    def take_order(self, order: Signed[Any], *, now_ms: int) -> tuple[Signed[Any], list[Match]]:
        """Admit a gossiped order already opened (decoded, signature verified): what
        :meth:`receive_order` does past decoding. A simulator that opens each message once
        hands the same opened order to every receiving node.

        Raises:
            InvalidMessage: the message must not be forwarded.
        """
        if order.type not in ("offer", "bid", "cancel"):
            raise InvalidMessage(Reason.WRONG_TYPE, f"{order.type} is not gossiped")
        self.admit(order, now_ms)
        if isinstance(order.payload, Cancel):
            self.book.cancel(order.payload.order_id, order.signer.raw)
            return order, []
        matches = self._add(order, now_ms=now_ms, active=False)
        for match in matches:
            if match.provider == self.me.raw:
                # A bid our offer could serve: the buyer proposes, and accept() reserves
                # then; holding capacity now would count it twice.
                self.book.release(match, rest_bid=True)
        return order, matches

    def repost(self, order: Signed[Any], *, now_ms: int) -> list[Match]:
        """Rest one of our own signed orders again after a restart; returns its matches."""
        return self._add(order, now_ms=now_ms, active=True)

    def _add(self, order: Signed[Any], *, now_ms: int, active: bool) -> list[Match]:
        add = self.book.add_offer if isinstance(order.payload, Offer) else self.book.add_bid
        return add(order, now_ms=now_ms, active=active, reputation=self.reputation)

    def cancel(self, order_id: MessageId, *, nonce: bytes, now_ms: int) -> Signed[Cancel]:
        """Take one of our orders out of the book; returns the cancel to gossip.

        Raises:
            LocalProtocolError(WRONG_PARTY): no such order of ours in the book.
        """
        if not self.book.cancel(order_id, self.me.raw):
            raise LocalProtocolError(Reason.WRONG_PARTY, "no such order of ours in the book")
        return self.seal(Cancel(order_id=order_id), nonce, now_ms, NEGOTIATION_TTL_MS)

    def live_orders(self, now_ms: int, *, mine: bool = False) -> list[Signed[Any]]:
        """The unexpired orders resting in the book (only our own with ``mine``)."""
        orders: list[Signed[Any]] = [o.order for o in self.book.live_offers(now_ms)]
        orders += [b.order for b in self.book.bids.values() if b.order.expires_ms > now_ms]
        return [o for o in orders if o.signer == self.me] if mine else orders

    # -- settlement ----------------------------------------------------------------------

    def settle(self, agreement: Agreement, receipt: CountersignedReceipt) -> LedgerEntry:
        """Record a countersigned receipt in the ledger.

        Raises:
            LocalProtocolError(REPLAYED): the agreement was settled before.
        """
        entry = receipt.ledger_entry(agreement)
        self.ledger.record(entry)
        return entry
