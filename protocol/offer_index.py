"""The book's offers in ascending CPU price, so a bid's search for the cheapest offer that
fits stops early instead of scanning the whole book (spec/matching.md's ranking, unchanged).

Rules:
- Offers come out in ascending ``cpu_core_hour``; ties in any order (the caller ranks).
- A bid can pay no offer above its CPU price limit, and no offer after one whose lowest
  possible quote (its CPU price, every other price at the lowest any indexed offer asks)
  is above the best quote found so far: both end the search, exactly.
- Adding is O(1): new offers wait in a list and are sorted in when a search needs them,
  so gossip ingest pays nothing for the index; a search pays O(log n) for each.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sortedcontainers import SortedList

from protocol.messages import Prices

__all__ = ["OfferIndex"]


@dataclass(slots=True)
class OfferIndex:
    _sorted: Any = field(default_factory=SortedList)  # (cpu_core_hour, offer id)
    _pending: dict[bytes, int] = field(default_factory=dict)  # offer id -> cpu_core_hour
    # The lowest price of each other kind any offer ever indexed asks: a lower bound on
    # what every offer in the index asks, even after offers left.
    floor: Prices | None = None

    def __len__(self) -> int:
        return len(self._sorted) + len(self._pending)

    def add(self, offer_id: bytes, prices: Prices) -> None:
        self._pending[offer_id] = prices.cpu_core_hour
        floor = self.floor
        if floor is None:
            self.floor = prices
        elif (
            prices.memory_gib_hour < floor.memory_gib_hour
            or prices.disk_gib_hour < floor.disk_gib_hour
            or prices.gpu_hour < floor.gpu_hour
        ):
            self.floor = Prices(
                cpu_core_hour=0,
                memory_gib_hour=min(floor.memory_gib_hour, prices.memory_gib_hour),
                disk_gib_hour=min(floor.disk_gib_hour, prices.disk_gib_hour),
                gpu_hour=min(floor.gpu_hour, prices.gpu_hour),
            )

    def discard(self, offer_id: bytes, prices: Prices) -> None:
        if self._pending.pop(offer_id, None) is None:
            self._sorted.discard((prices.cpu_core_hour, offer_id))

    def ascending(self) -> Iterator[tuple[int, bytes]]:
        """(cpu_core_hour, offer id), cheapest CPU first."""
        if self._pending:
            self._sorted.update((price, key) for key, price in self._pending.items())
            self._pending.clear()
        return iter(self._sorted)
