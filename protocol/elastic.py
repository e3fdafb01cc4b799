"""Elastic jobs: when a running job's limits grow, and what a buyer accepts of the growth
(spec/workloads.md, "Elastic jobs").

Rules:
- A bid's ``elastic`` ceilings are at least its reserved resources and within
  protocol.limits' bounds (:func:`check_elastic`); a match reserves the ceiling's worth of
  money (``max_cost`` is the quote of :func:`ceiling`) but only the reserved resources.
- Memory: when the job uses ``GROW_AT`` (90 %) of its limit or more, the provider raises
  the limit by half (at least ``MIN_STEP``), capped by the ceiling and by what it has free
  (:func:`memory_step`). At its ceiling a job meets its limit as any job does. Below it,
  when the provider has no room to raise it, the job is ``exhausted``: a job with a
  checkpoint contract is stopped as preempted (it resumes from its checkpoint on a provider
  with more room); one without meets its limit.
- CPU: a job asks for a total (``cpu N`` in its request file); it gets the least of that,
  the ceiling and what is free, never less than it has (:func:`cpu_grant`).
- Every change is a :class:`~protocol.messages.Grant` in the receipt's usage; memory is
  billed for the limit in force over time (protocol/settlement.py), CPU by the time used as
  always. A buyer refuses grants out of order, past the job's wall time, below the
  reservation or above the ceiling [``terms-mismatch``] (:func:`check_grants`).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from protocol.errors import InvalidMessage, Reason
from protocol.limits import LIMITS, OutOfBounds
from protocol.messages import Elastic, Grant, Resources, Usage

__all__ = [
    "GROW_AT",
    "MIN_STEP",
    "MemoryStep",
    "ceiling",
    "check_elastic",
    "check_grants",
    "cpu_grant",
    "elastic_of",
    "memory_step",
]

GROW_AT = Fraction(9, 10)
GROW_BY = Fraction(1, 2)
MIN_STEP = 16 << 20


def ceiling(resources: Resources, elastic: Elastic | None) -> Resources:
    """The most a job may hold: its reservation raised to its elastic ceilings."""
    if elastic is None:
        return resources
    return Resources(
        cpu_milli=max(resources.cpu_milli, elastic.cpu_milli),
        memory_bytes=max(resources.memory_bytes, elastic.memory_bytes),
        disk_bytes=resources.disk_bytes,
        gpus=resources.gpus,
    )


def elastic_of(memory_bytes: int, cpu_milli: int) -> Elastic | None:
    """The ``elastic`` of a bid with these ceilings (None when neither is set)."""
    if not memory_bytes and not cpu_milli:
        return None
    return Elastic(memory_bytes=memory_bytes, cpu_milli=cpu_milli)


def check_elastic(resources: Resources, elastic: Elastic | None) -> None:
    """Raises OutOfBounds (``elastic.memory_bytes`` / ``elastic.cpu_milli``) for a
    ceiling below the reservation or outside the bounds of its resource."""
    if elastic is None:
        return
    for name, top, reserved in (
        ("memory_bytes", elastic.memory_bytes, resources.memory_bytes),
        ("cpu_milli", elastic.cpu_milli, resources.cpu_milli),
    ):
        if top == 0:
            continue
        bounds = LIMITS[f"resources.{name}"]
        if not max(reserved, bounds.minimum) <= top <= bounds.maximum:
            raise OutOfBounds(
                f"elastic.{name}",
                f"{top} {bounds.unit} is outside {reserved}..{bounds.maximum} {bounds.unit} "
                "(a ceiling is at least what the job reserves)",
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryStep:
    """``limit``: the new limit (the old one: hold); ``exhausted``: the job is at its
    limit and cannot be given more."""

    limit: int
    exhausted: bool = False


def memory_step(*, limit: int, used: int, top: int, free: int) -> MemoryStep:
    """What to do about a job using ``used`` of its ``limit`` with a ceiling ``top`` and
    ``free`` bytes of the provider's capacity left."""
    if used < limit * GROW_AT or top <= limit:
        return MemoryStep(limit=limit)
    want = limit + max(MIN_STEP, int(limit * GROW_BY))
    new = min(want, top, limit + max(0, free))
    return MemoryStep(limit=new, exhausted=new == limit)


def cpu_grant(*, asked: int, current: int, top: int, free: int) -> int:
    """The CPU limit (millicores) a job that asked for ``asked`` in all gets."""
    return max(current, min(asked, top, current + max(0, free)))


def check_grants(resources: Resources, elastic: Elastic | None, usage: Usage) -> None:
    """Raises InvalidMessage (TERMS_MISMATCH) unless the receipt's grants are ones the
    terms allow."""
    grants: tuple[Grant, ...] = usage.grants or ()
    if grants and elastic is None:
        raise InvalidMessage(Reason.TERMS_MISMATCH, "grants for a job that is not elastic")
    top = ceiling(resources, elastic)
    last = 0
    for g in grants:
        if not last <= g.at_ms <= usage.wall_ms:
            raise InvalidMessage(Reason.TERMS_MISMATCH, f"grant at {g.at_ms} ms out of order")
        if not resources.memory_bytes <= g.memory_bytes <= top.memory_bytes:
            raise InvalidMessage(Reason.TERMS_MISMATCH, "granted memory beyond the terms")
        if not resources.cpu_milli <= g.cpu_milli <= top.cpu_milli:
            raise InvalidMessage(Reason.TERMS_MISMATCH, "granted CPU beyond the terms")
        last = g.at_ms
