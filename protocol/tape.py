"""The tape: signed prints of the trades the market made, kept by every node, with no
exchange operator (spec/tape.md).

Rules:
- Each agreement yields one :class:`TradePrint`: its resource class, unit prices,
  quantity (the reserved resources) and time (the terms' ``created_ms``), the two parties'
  keys, and a ``trade_id`` derived from the agreement id that names the trade without
  revealing its terms. No job content.
- Both parties sign the same print bytes under ``cx/trade-print/v1``: the provider in its
  Accept (``print_signature``, derived from the terms and its own offer, so no extra round
  trip), the buyer when it agrees. The buyer publishes the signed print on the tape topic.
- A node admits a print only with both signatures valid under the keys it names, from two
  different keys, not seen before (by ``trade_id``), and inside its time window; anything
  else is refused with a reason: ``bad-signature`` (forged, or one signature), ``self-dealing``
  (buyer and provider the same key), ``replayed``, ``expired``, ``not-yet-valid``.
- :class:`Tape` keeps the admitted prints of the last ``retention_ms``; :func:`candles`
  turns prints into OHLC candles per interval.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from protocol.encoding import decode, encode
from protocol.errors import InvalidMessage, Reason
from protocol.identity import PrivateKey, PublicKey
from protocol.messages import Offer, Prices, Resources, Terms
from protocol.schema import bytes_fields, from_value, to_value

__all__ = [
    "TRADE_PRINT_DOMAIN",
    "Candle",
    "SignedPrint",
    "Tape",
    "TradePrint",
    "candles",
    "print_of",
    "resource_class",
    "sign_print",
]

TRADE_PRINT_DOMAIN = b"cx/trade-print/v1"
_TRADE_ID_DOMAIN = b"cx/trade-id/v1\x00"
_DAY_MS = 86_400_000


def resource_class(offer: Offer) -> str:
    """How trades and offers are grouped: architecture, GPUs or not, region."""
    kind = f"gpu:{offer.gpus[0].model}" if offer.gpus else "cpu"
    return f"{offer.arch.value}/{kind}/{offer.region or 'any'}"


@dataclass(frozen=True, slots=True, kw_only=True)
class TradePrint:
    trade_id: bytes
    resource_class: str
    prices: Prices
    resources: Resources
    at_ms: int
    buyer: bytes
    provider: bytes


def print_of(terms: Terms, offer: Offer) -> TradePrint:
    """The print of the trade these terms make on ``offer`` (the offer they name)."""
    agreement_id = hashlib.sha256(encode(to_value(terms))).digest()
    return TradePrint(
        trade_id=hashlib.sha256(_TRADE_ID_DOMAIN + agreement_id).digest(),
        resource_class=resource_class(offer),
        prices=terms.prices,
        resources=terms.resources,
        at_ms=terms.created_ms,
        buyer=terms.buyer,
        provider=terms.provider,
    )


def _bytes(trade: TradePrint) -> bytes:
    return encode(to_value(trade))


def sign_print(key: PrivateKey, trade: TradePrint) -> bytes:
    return key.sign(TRADE_PRINT_DOMAIN, _bytes(trade))


@dataclass(frozen=True, slots=True, kw_only=True)
class SignedPrint:
    """A trade print with both parties' signatures over the same bytes."""

    trade: TradePrint
    wire: bytes

    @classmethod
    def assemble(
        cls, trade: TradePrint, buyer_signature: bytes, provider_signature: bytes
    ) -> SignedPrint:
        """Raises InvalidMessage (BAD_SIGNATURE, BAD_KEY, SELF_DEALING)."""
        raw = _bytes(trade)
        _verify(trade, raw, buyer_signature, provider_signature)
        wire = encode(
            {"print": raw, "buyer_sig": buyer_signature, "provider_sig": provider_signature}
        )
        return cls(trade=trade, wire=wire)

    @classmethod
    def from_wire(cls, data: bytes) -> SignedPrint:
        """Decode and verify both signatures.

        Raises:
            DecodeError, InvalidMessage: BAD_SIGNATURE (forged, or one signature missing),
            SELF_DEALING (one key on both sides), or a schema reason.
        """
        raw, buyer_sig, provider_sig = bytes_fields(
            decode(data), ("print", "buyer_sig", "provider_sig"), "trade print"
        )
        trade = from_value(TradePrint, decode(raw))
        _verify(trade, raw, buyer_sig, provider_sig)
        return cls(trade=trade, wire=bytes(data))


def _verify(trade: TradePrint, raw: bytes, buyer_sig: bytes, provider_sig: bytes) -> None:
    if trade.buyer == trade.provider:
        raise InvalidMessage(Reason.SELF_DEALING, "a trade needs two parties")
    PublicKey(trade.buyer).verify(TRADE_PRINT_DOMAIN, raw, buyer_sig)
    PublicKey(trade.provider).verify(TRADE_PRINT_DOMAIN, raw, provider_sig)


@dataclass(slots=True)
class Tape:
    """The prints a node admitted, in time order, for ``retention_ms``."""

    retention_ms: int = _DAY_MS
    max_skew_ms: int = 30_000
    _prints: list[tuple[int, bytes, TradePrint]] = field(default_factory=list)  # sorted
    _seen: set[bytes] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self._prints)

    def admit(self, wire: bytes, *, now_ms: int) -> SignedPrint:
        """Verify and keep a gossiped print.

        Raises:
            DecodeError, InvalidMessage: see :meth:`SignedPrint.from_wire`; EXPIRED for a
            print older than the retention, NOT_YET_VALID for one from the future,
            REPLAYED for one already kept.
        """
        signed = SignedPrint.from_wire(wire)
        self.keep(signed, now_ms=now_ms)
        return signed

    def keep(self, signed: SignedPrint, *, now_ms: int) -> None:
        """Keep a verified print (one this node signed, or :meth:`admit`'s)."""
        trade = signed.trade
        if trade.at_ms < now_ms - self.retention_ms:
            raise InvalidMessage(Reason.EXPIRED, "the print is older than the tape keeps")
        if trade.at_ms > now_ms + self.max_skew_ms:
            raise InvalidMessage(Reason.NOT_YET_VALID, "the print is from the future")
        if trade.trade_id in self._seen:
            raise InvalidMessage(Reason.REPLAYED, "this trade is on the tape already")
        self._seen.add(trade.trade_id)
        bisect.insort(self._prints, (trade.at_ms, trade.trade_id, trade))

    def forget_before(self, at_ms: int) -> None:
        cut = bisect.bisect_left(self._prints, (at_ms, b""))
        for _, trade_id, _ in self._prints[:cut]:
            self._seen.discard(trade_id)
        del self._prints[:cut]

    def prints(
        self, *, since_ms: int = 0, resource_class: str | None = None
    ) -> Iterator[TradePrint]:
        """Prints at or after ``since_ms``, oldest first, of one class or all."""
        start = bisect.bisect_left(self._prints, (since_ms, b""))
        for _, _, trade in self._prints[start:]:
            if resource_class is None or trade.resource_class == resource_class:
                yield trade


@dataclass(frozen=True, slots=True, kw_only=True)
class Candle:
    """One interval of one class's trades: unit prices of one field, and the volume."""

    start_ms: int
    open: int
    high: int
    low: int
    close: int
    trades: int
    cpu_milli: int  # the CPU reserved by the interval's trades, summed


def candles(
    prints: Iterable[TradePrint], interval_ms: int, price_field: str = "cpu_core_hour"
) -> list[Candle]:
    """OHLC candles of ``prints`` (oldest first) per ``interval_ms``, from the first
    interval with a trade to the last; intervals without trades are left out."""
    if interval_ms <= 0:
        raise ValueError("interval_ms must be positive")
    out: list[Candle] = []
    for trade in prints:
        price = getattr(trade.prices, price_field)
        start = trade.at_ms - trade.at_ms % interval_ms
        last = out[-1] if out else None
        if last is not None and last.start_ms == start:
            out[-1] = Candle(
                start_ms=start,
                open=last.open,
                high=max(last.high, price),
                low=min(last.low, price),
                close=price,
                trades=last.trades + 1,
                cpu_milli=last.cpu_milli + trade.resources.cpu_milli,
            )
        else:
            out.append(
                Candle(
                    start_ms=start,
                    open=price,
                    high=price,
                    low=price,
                    close=price,
                    trades=1,
                    cpu_milli=trade.resources.cpu_milli,
                )
            )
    return out
