"""Settlement arithmetic: what a job costs and who owes whom (spec/settlement.md).

Rules:
- All money is integer micro-credits. Cost is one exact rational sum floored once:
  CPU time used at the CPU price per core-hour, plus reserved memory, disk and GPUs for the
  wall time at their hourly prices (memory and disk per GiB). An elastic job's memory is
  the limit in force over time: the reservation until its first grant, then each grant's
  until the next (``usage.grants``, protocol/elastic.py).
- A quote is the worst case: every reserved core busy for the whole wall-time limit.
- The amount charged for a receipt depends on why the job ended: a provider fault costs
  nothing; preemption costs the usage up to the last checkpoint (nothing without one); any
  other end (success, the job's own failure, timeout) costs the usage. It never exceeds the
  agreement's ``max_cost``.
- A ledger is built from countersigned receipts only; each agreement settles once; the
  balances of all parties sum to zero.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from protocol.errors import LocalProtocolError, Reason
from protocol.messages import ExitReason, Prices, Resources, Usage

__all__ = [
    "Ledger",
    "LedgerEntry",
    "charge",
    "cost",
    "memory_byte_us",
    "quote",
    "quote_by_cpu_and_memory_price",
]

_GIB = 1 << 30
_US_PER_HOUR = 3_600_000_000
_MS_PER_HOUR = 3_600_000
# cost = numerator / (_GIB * _US_PER_HOUR); each term below is scaled to that denominator.
_DENOMINATOR = _GIB * _US_PER_HOUR


def cost(prices: Prices, reserved: Resources, usage: Usage) -> int:
    """Cost of ``usage`` of ``reserved`` resources at ``prices``, floored once."""
    if not usage.grants:
        return _cost(prices, reserved, usage.wall_ms, usage.cpu_us)
    # An elastic job: its memory is the limit in force over time, not the reservation.
    flat = _numerator(prices, replace(reserved, memory_bytes=0), usage.wall_ms, usage.cpu_us)
    return (flat + memory_byte_us(reserved.memory_bytes, usage) * prices.memory_gib_hour) // (
        _DENOMINATOR
    )


def memory_byte_us(reserved: int, usage: Usage) -> int:
    """Memory held over the job's wall time, in byte-microseconds: the reservation, or the
    limits its grants set from their times on (a grant past the wall time counts for 0)."""
    held, since, total = reserved, 0, 0
    for grant in usage.grants or ():
        at = min(grant.at_ms, usage.wall_ms)
        total += held * (at - since)
        held, since = grant.memory_bytes, at
    return (total + held * (usage.wall_ms - since)) * 1000


def quote(prices: Prices, reserved: Resources, wall_ms: int) -> int:
    """Worst-case cost: all reserved CPU busy for the whole ``wall_ms``."""
    # millicores x ms = microseconds of CPU time
    return _cost(prices, reserved, wall_ms, reserved.cpu_milli * wall_ms)


def quote_by_cpu_and_memory_price(
    others: Prices, reserved: Resources, wall_ms: int
) -> Callable[[int, int], int]:
    """The quote as a function of the CPU and memory prices alone, the other unit prices
    those of ``others``: the same arithmetic as :func:`quote`, so the same integers."""
    rest = _numerator(
        replace(others, cpu_core_hour=0, memory_gib_hour=0),
        reserved,
        wall_ms,
        reserved.cpu_milli * wall_ms,
    )
    per_cpu_unit = reserved.cpu_milli * wall_ms * _GIB
    per_memory_unit = reserved.memory_bytes * wall_ms * 1000
    return lambda cpu, memory: (
        (per_cpu_unit * cpu + per_memory_unit * memory + rest) // _DENOMINATOR
    )


def _cost(prices: Prices, reserved: Resources, wall_ms: int, cpu_us: int) -> int:
    # No Usage built here: matching quotes every candidate offer, so this is a hot path.
    return _numerator(prices, reserved, wall_ms, cpu_us) // _DENOMINATOR


def _numerator(prices: Prices, reserved: Resources, wall_ms: int, cpu_us: int) -> int:
    wall_us = wall_ms * 1000
    return (
        cpu_us * prices.cpu_core_hour * _GIB
        + reserved.memory_bytes * wall_us * prices.memory_gib_hour
        + reserved.disk_bytes * wall_us * prices.disk_gib_hour
        + reserved.gpus * wall_us * prices.gpu_hour * _GIB
    )


def charge(
    prices: Prices, reserved: Resources, max_cost: int, usage: Usage, exit_reason: ExitReason
) -> int:
    """What the buyer pays for a job that ended for ``exit_reason``."""
    if exit_reason is ExitReason.PROVIDER_FAULT:
        return 0
    if exit_reason is ExitReason.PREEMPTED:
        if usage.checkpoint_ms == 0 or usage.wall_ms == 0:
            return 0
        until = min(usage.checkpoint_ms, usage.wall_ms)
        usage = Usage(
            wall_ms=until, cpu_us=usage.cpu_us * until // usage.wall_ms, grants=usage.grants
        )
    return min(cost(prices, reserved, usage), max_cost)


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerEntry:
    agreement_id: bytes
    payer: bytes
    payee: bytes
    amount: int


@dataclass(slots=True)
class Ledger:
    """Bilateral balances from settled receipts. Positive balance: owed to that party."""

    entries: list[LedgerEntry] = field(default_factory=list)
    _settled: set[bytes] = field(default_factory=set)

    def record(self, entry: LedgerEntry) -> None:
        """Raises LocalProtocolError if the agreement was already settled."""
        if entry.agreement_id in self._settled:
            raise LocalProtocolError(Reason.REPLAYED, "this agreement is already settled")
        if entry.amount < 0:
            raise LocalProtocolError(Reason.BAD_FIELD, "a ledger amount is never negative")
        self._settled.add(entry.agreement_id)
        self.entries.append(entry)

    def balances(self) -> dict[bytes, int]:
        totals: dict[bytes, int] = defaultdict(int)
        for entry in self.entries:
            totals[entry.payee] += entry.amount
            totals[entry.payer] -= entry.amount
        return dict(totals)

    def between(self, a: bytes, b: bytes) -> int:
        """What ``b`` owes ``a`` (negative: what ``a`` owes ``b``)."""
        total = 0
        for entry in self.entries:
            if (entry.payee, entry.payer) == (a, b):
                total += entry.amount
            elif (entry.payee, entry.payer) == (b, a):
                total -= entry.amount
        return total
