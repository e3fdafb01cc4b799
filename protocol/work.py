"""Comparable units of work (spec/work.md): hardware differs, so a provider states how
much work one of its cores does in an hour, measured by a standard kernel every provider
runs in its own executor, and prices become comparable per unit of work.

Rules:
- One *work unit* is one GiB hashed with MD5 by busybox's ``md5sum`` on one core.
- A provider runs :data:`BENCHMARK_COMMAND` (hashing :data:`BENCHMARK_BYTES` of zeros) as
  a job of one core in its own executor at start-up; its ``work_score`` is the units done
  per core-hour of CPU time, the time CPU prices are charged by:
  ``bytes * 3 600 000 000 // (cpu_us * GiB)`` (:func:`score_of`). CPU time, not wall
  time, so a busy machine measures its cores and not its load.
- The price of a unit on an offer is its CPU price per core-hour over its score, rounded
  up (:func:`work_price`); a bid's ``max_work_price`` caps it: the offer fits only if it
  states a score and ``cpu_core_hour <= max_work_price * work_score`` (:func:`work_fits`).
- Work per kWh, for an offer stating its ``watts`` at full load: ``work_score * cpu_milli
  // watts`` (:func:`work_per_kwh`: units per core-hour x cores x 1000 / watts).
"""

from __future__ import annotations

from protocol.messages import Offer

__all__ = [
    "BENCHMARK_BYTES",
    "BENCHMARK_COMMAND",
    "WORK_UNIT_BYTES",
    "score_of",
    "work_fits",
    "work_per_kwh",
    "work_price",
]

WORK_UNIT_BYTES = 1 << 30
BENCHMARK_BYTES = 256 << 20
BENCHMARK_COMMAND = (
    "sh",
    "-c",
    f"dd if=/dev/zero bs=1048576 count={BENCHMARK_BYTES >> 20} 2>/dev/null | md5sum",
)


def score_of(hashed_bytes: int, cpu_us: int) -> int:
    """Work units per core-hour, from a run that hashed ``hashed_bytes`` in ``cpu_us``
    microseconds of CPU time."""
    if cpu_us <= 0:
        raise ValueError("a benchmark that used no CPU measured nothing")
    return hashed_bytes * 3_600_000_000 // (cpu_us * WORK_UNIT_BYTES)


def work_price(offer: Offer) -> int | None:
    """Micro-credits per work unit on ``offer``, rounded up; None without a score."""
    if not offer.work_score:
        return None
    return -(-offer.prices.cpu_core_hour // offer.work_score)


def work_fits(offer: Offer, max_work_price: int | None) -> bool:
    """Does the offer's CPU price stay within a per-work limit (None: no such limit)?"""
    if max_work_price is None:
        return True
    if not offer.work_score:
        return False
    return offer.prices.cpu_core_hour <= max_work_price * offer.work_score


def work_per_kwh(offer: Offer) -> int | None:
    """Work units per kWh at full load; None unless the offer states score and watts."""
    if not offer.work_score or not offer.watts:
        return None
    return offer.work_score * offer.capacity.cpu_milli // offer.watts
