"""What moving a job's data to a provider costs, and which blobs a provider holds
(spec/matching.md, "Transfer cost").

Rules:
- A provider states the blobs it holds as ``Offer.holds``: the first 4 bytes of each
  blob's sha256, sorted and distinct, at most 1024 of them (4 KiB). A lookup is a binary
  search; two digests share a prefix by chance with odds 1 in 2^32 per held blob, so a
  full list errs (says "held" for a blob that is not) about once in 4 million lookups.
- A bid states where its data lives (``Bid.data``: region, bytes, the region's egress price,
  the outputs expected back, a budget). The bytes the provider must bring in are the
  bid's bytes less what it holds: each input whose digest it holds counts its
  ``DataRef.size``; the image, if held, counts the rest of ``bytes``.
- The cost, in micro-credits, each part rounded up on its own: the bytes brought in at the
  provider's ``ingress_gib``; the same bytes at the bid's ``egress_gib`` when the offer's
  region is not the data's; the outputs at the provider's ``egress_gib``. A bid without
  ``data`` costs nothing to move (revision 6 keeps the earlier matching for it).
- Over the bid's ``budget`` the offer does not fit (constraint ``transfer``).
Pure: integers only, the same inputs give the same figures on every node.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass

from protocol.messages import HOLD_PREFIX_BYTES, MAX_HOLDS, Bid, Offer

__all__ = [
    "GIB",
    "NO_TRANSFER",
    "TransferCost",
    "held_in",
    "holds",
    "holds_filter",
    "transfer_cost",
    "within_budget",
]

GIB = 1 << 30


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferCost:
    """Moving a bid's data to one offer's provider: what moves and what it costs."""

    moved_bytes: int  # the job's data the provider does not hold
    held_bytes: int  # the job's data it holds already
    cross_region: bool  # the data lives in another region than the offer
    ingress: int  # micro-credits: moved bytes at the provider's ingress price
    egress: int  # moved bytes at the data region's egress price, across regions
    outputs: int  # the outputs expected back, at the provider's egress price

    @property
    def total(self) -> int:
        return self.ingress + self.egress + self.outputs


NO_TRANSFER = TransferCost(
    moved_bytes=0, held_bytes=0, cross_region=False, ingress=0, egress=0, outputs=0
)


def _prefix(digest: str) -> bytes:
    return bytes.fromhex(digest[len("sha256:") :][: 2 * HOLD_PREFIX_BYTES])


def holds_filter(digests: Iterable[str]) -> bytes | None:
    """The ``holds`` of an offer from ``digests`` (``sha256:<hex>``), most wanted first:
    the first ``MAX_HOLDS`` distinct prefixes, sorted. None when there are none."""
    chosen: dict[bytes, None] = {}
    for digest in digests:
        if len(chosen) == MAX_HOLDS:
            break
        chosen[_prefix(digest)] = None
    return b"".join(sorted(chosen)) or None


def holds(offer: Offer, digest: str) -> bool:
    """Does ``offer`` say its provider holds ``digest``? (False positives: see above.)"""
    return held_in(offer.holds, digest)


def held_in(table: bytes | None, digest: str) -> bool:
    """Is ``digest`` in ``table``, an offer's ``holds``?"""
    if not table:
        return False
    n = HOLD_PREFIX_BYTES
    want = _prefix(digest)
    lo = bisect_left(range(len(table) // n), want, key=lambda i: table[i * n : i * n + n])
    return table[lo * n : lo * n + n] == want


def _ceil_gib(n_bytes: int, price_gib: int) -> int:
    return -(-n_bytes * price_gib // GIB)


def transfer_cost(bid: Bid, offer: Offer) -> TransferCost:
    """What moving ``bid``'s data to ``offer``'s provider costs (rules above)."""
    data = bid.data
    if data is None:
        return NO_TRANSFER
    inputs = bid.job.inputs
    held = sum(ref.size for ref in inputs if holds(offer, ref.digest))
    if holds(offer, bid.job.image):
        held += max(0, data.bytes - sum(ref.size for ref in inputs))
    held = min(held, data.bytes)
    moved = data.bytes - held
    cross = offer.region != data.region
    return TransferCost(
        moved_bytes=moved,
        held_bytes=held,
        cross_region=cross,
        ingress=_ceil_gib(moved, offer.ingress_gib or 0),
        egress=_ceil_gib(moved, data.egress_gib) if cross else 0,
        outputs=_ceil_gib(data.output_bytes, offer.egress_gib or 0),
    )


def within_budget(bid: Bid, offer: Offer) -> bool:
    """The ``transfer`` constraint: no budget, or the cost is within it."""
    data = bid.data
    return data is None or data.budget is None or transfer_cost(bid, offer).total <= data.budget
