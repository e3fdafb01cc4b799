"""The book's offers on a grid of CPU price by memory price, so that a bid's search for the
cheapest offer that fits looks at the few cells that could hold it, however large the book
(spec/matching.md's ranking, unchanged: the caller quotes and ranks the offers).

Rules:
- Each price falls in a bucket, in price order: 16 buckets per power of two
  (:func:`_bucket`). A cell is one CPU bucket by one memory bucket; it keeps the lowest
  CPU and memory price of any offer ever put in it, a lower bound on what its offers ask
  even after some left. A row is a CPU bucket's cells.
- :meth:`OfferIndex.cheapest_first` yields the cells in ascending ``bound(cpu, memory)``
  of those lowest prices, ``bound`` being the bid's quote at those prices (every other
  price at the lowest any indexed offer asks), which never falls as a price rises. No
  offer in a cell can quote below its bound, and each cell yielded bounds all that follow:
  a caller that stops at the first cell whose bound is above the best quote it found gets
  exactly what a scan of every offer gets.
- Rows join the search in ascending CPU price, only once their own lowest possible bound
  is no more than the cells waiting; a row above the bid's CPU limit, or the rest of a row
  above its memory limit, is never looked at.
- Adding and removing are dictionary operations, plus an insertion into a short sorted
  list of bucket numbers when a cell or row is new or empties: ingest stays flat.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from protocol.messages import Prices

__all__ = ["OfferIndex"]

_SUB_BITS = 4  # 2**4 buckets per power of two of price


def _bucket(price: int) -> int:
    """A bucket number that never falls as ``price`` rises (prices are non-negative)."""
    bits = price.bit_length()
    if bits <= _SUB_BITS + 1:
        return price  # below 32: one bucket per price
    mantissa = (price >> (bits - _SUB_BITS - 1)) & ((1 << _SUB_BITS) - 1)
    return (bits << _SUB_BITS) | mantissa


@dataclass(slots=True)
class _Cell:
    cpu: int  # the lowest CPU price of any offer ever put in this cell
    memory: int  # likewise memory
    offers: set[bytes] = field(default_factory=set)


@dataclass(slots=True)
class _Row:
    cpu: int  # the lowest CPU price of any offer ever put in this row
    cells: dict[int, _Cell] = field(default_factory=dict)  # memory bucket -> cell
    order: list[int] = field(default_factory=list)  # the cells' memory buckets, ascending


@dataclass(slots=True)
class OfferIndex:
    _rows: dict[int, _Row] = field(default_factory=dict)  # CPU bucket -> row
    _order: list[int] = field(default_factory=list)  # the rows' CPU buckets, ascending
    _size: int = 0
    # The lowest price of each kind any offer ever indexed asks: a lower bound on what
    # every offer in the index asks, even after offers left.
    floor: Prices | None = None

    def __len__(self) -> int:
        return self._size

    def add(self, offer_id: bytes, prices: Prices) -> None:
        cpu, memory = prices.cpu_core_hour, prices.memory_gib_hour
        row_key, cell_key = _bucket(cpu), _bucket(memory)
        row = self._rows.get(row_key)
        if row is None:
            row = self._rows[row_key] = _Row(cpu=cpu)
            bisect.insort(self._order, row_key)
        row.cpu = min(row.cpu, cpu)
        cell = row.cells.get(cell_key)
        if cell is None:
            cell = row.cells[cell_key] = _Cell(cpu=cpu, memory=memory)
            bisect.insort(row.order, cell_key)
        cell.cpu, cell.memory = min(cell.cpu, cpu), min(cell.memory, memory)
        if offer_id not in cell.offers:
            cell.offers.add(offer_id)
            self._size += 1
        self._lower_floor(prices)

    def _lower_floor(self, prices: Prices) -> None:
        floor = self.floor
        if floor is None:
            self.floor = prices
        elif (
            prices.cpu_core_hour < floor.cpu_core_hour
            or prices.memory_gib_hour < floor.memory_gib_hour
            or prices.disk_gib_hour < floor.disk_gib_hour
            or prices.gpu_hour < floor.gpu_hour
        ):
            self.floor = Prices(
                cpu_core_hour=min(floor.cpu_core_hour, prices.cpu_core_hour),
                memory_gib_hour=min(floor.memory_gib_hour, prices.memory_gib_hour),
                disk_gib_hour=min(floor.disk_gib_hour, prices.disk_gib_hour),
                gpu_hour=min(floor.gpu_hour, prices.gpu_hour),
            )

    def discard(self, offer_id: bytes, prices: Prices) -> None:
        row_key, cell_key = _bucket(prices.cpu_core_hour), _bucket(prices.memory_gib_hour)
        row = self._rows.get(row_key)
        cell = row.cells.get(cell_key) if row is not None else None
        if row is None or cell is None or offer_id not in cell.offers:
            return
        cell.offers.discard(offer_id)
        self._size -= 1
        if not cell.offers:
            del row.cells[cell_key]
            del row.order[bisect.bisect_left(row.order, cell_key)]
            if not row.cells:
                del self._rows[row_key]
                del self._order[bisect.bisect_left(self._order, row_key)]

    def cheapest_first(
        self, bound: Callable[[int, int], int], *, cpu_limit: int, memory_limit: int | None
    ) -> Iterator[tuple[int, list[bytes]]]:
        """``(bound, offer ids)`` per cell, ascending in bound: ``bound(cpu, memory)`` is
        the least any offer at those prices can quote and never falls as either rises.
        Cells above ``cpu_limit`` or ``memory_limit`` (None: any) are left out. The index
        must not change while the iterator is in use."""
        floor = self.floor
        if floor is None:
            return
        # (key, refined, row bucket, position in the row): an unrefined key bounds the
        # cell with its row's lowest CPU price, so the keys along a row never fall; once
        # popped it comes back with the cell's own lowest CPU price, which may be higher.
        waiting: list[tuple[int, bool, int, int]] = []
        rows, next_row = self._order, 0

        def push_cell(row_key: int, at: int) -> None:
            row = self._rows[row_key]
            if at < len(row.order):
                cell = row.cells[row.order[at]]
                if memory_limit is None or cell.memory <= memory_limit:
                    heapq.heappush(waiting, (bound(row.cpu, cell.memory), False, row_key, at))

        while True:
            while next_row < len(rows):
                row = self._rows[rows[next_row]]
                if row.cpu > cpu_limit:
                    next_row = len(rows)  # every later row asks more still
                    break
                if waiting and bound(row.cpu, floor.memory_gib_hour) > waiting[0][0]:
                    break
                push_cell(rows[next_row], 0)
                next_row += 1
            if not waiting:
                return
            key, refined, row_key, at = heapq.heappop(waiting)
            row = self._rows[row_key]
            cell = row.cells[row.order[at]]
            if not refined:
                push_cell(row_key, at + 1)
                own = bound(cell.cpu, cell.memory)
                if own > key:
                    heapq.heappush(waiting, (own, True, row_key, at))
                    continue
            yield key, list(cell.offers)
