"""An elastic job's limits, grown while it runs (protocol/elastic.py decides, this applies).

Rules:
- Every ``POLL_S`` the watch reads what memory the job holds (anonymous and tmpfs pages,
  node/exec/cgroups.py) and its request file; it raises the cgroup's memory limit or CPU
  quota in place, without a restart, when protocol.elastic says so and the provider's free
  capacity (``free``) allows. What it grants is taken from that capacity (``take``) and
  recorded as a Grant (time since the job started, the new limits) for the receipt.
- The request file: the container sees a small writable directory ``/cx``; the job writes
  ``cpu N`` (cores, ``2.5``, or millicores, ``2500m``: the total it wants) to
  ``/cx/request``, and reads its limits in force from ``/cx/granted`` (``cpu_milli N`` and
  ``memory_bytes M`` lines), rewritten after every change. An unreadable request is
  ignored (and logged); asking again with another figure is a new request.
- When memory cannot grow (ceiling reached or no capacity) and the job is at its limit,
  ``exhausted`` is called once: the executor preempts a job that has a checkpoint contract.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

import trio

from node.exec.cgroups import JobCgroup, raise_memory_limit, read_memory_held, set_cpu_limit
from protocol.elastic import ceiling, cpu_grant, memory_step
from protocol.messages import Elastic, Grant, Resources

__all__ = ["IN_CONTAINER", "POLL_S", "ElasticWatch", "parse_request"]

log = logging.getLogger(__name__)

IN_CONTAINER = "/cx"
POLL_S = 0.05
_REQUEST = re.compile(r"\s*cpu\s+(\d+(?:\.\d{1,3})?|\d+m)\s*")


def parse_request(text: str) -> int | None:
    """Millicores from ``cpu 4``, ``cpu 2.5`` or ``cpu 2500m``; None for anything else."""
    m = _REQUEST.fullmatch(text)
    if m is None:
        return None
    value = m.group(1)
    if value.endswith("m"):
        return int(value[:-1])
    whole, _, frac = value.partition(".")
    return int(whole) * 1000 + int(frac.ljust(3, "0") or 0)


class ElasticWatch:
    """Grows one running job's limits; ``grants`` and ``extra`` say what it gave."""

    def __init__(
        self,
        *,
        cgroup: JobCgroup,
        area: Path,
        resources: Resources,
        elastic: Elastic,
        swap_accounting: bool,
        free: Callable[[], Resources],
        take: Callable[[Resources], None],
        exhausted: Callable[[], None],
        grants: list[Grant] | None = None,
    ) -> None:
        self.cgroup = cgroup
        self.area = area
        self.elastic = elastic
        self.top = ceiling(resources, elastic)
        self.swap_accounting = swap_accounting
        self.free = free
        self.take = take
        self.exhausted = exhausted
        self.cpu_milli = resources.cpu_milli
        self.memory_bytes = resources.memory_bytes
        self.reserved = resources
        self.grants: list[Grant] = [] if grants is None else grants  # appended to
        self._asked: str | None = None
        self._told_exhausted = False
        self._t0 = time.monotonic()
        self.write_granted()

    @property
    def extra(self) -> Resources:
        """What the job holds beyond its reservation."""
        return Resources(
            cpu_milli=self.cpu_milli - self.reserved.cpu_milli,
            memory_bytes=self.memory_bytes - self.reserved.memory_bytes,
        )

    def write_granted(self) -> None:
        text = f"cpu_milli {self.cpu_milli}\nmemory_bytes {self.memory_bytes}\n"
        tmp = self.area / ".granted"
        tmp.write_text(text)
        tmp.rename(self.area / "granted")

    async def run(self) -> None:
        """Watch until cancelled (when the job has exited)."""
        self._t0 = time.monotonic()
        while True:
            await trio.sleep(POLL_S)  # a sampling period, not a synchronisation
            self.step()

    def step(self) -> None:
        """One look at the job: grow what protocol.elastic says to grow."""
        changed = self._memory() if self.elastic.memory_bytes else False
        if self.elastic.cpu_milli:
            changed = self._cpu() or changed
        if changed:
            at = int((time.monotonic() - self._t0) * 1000)
            self.grants.append(
                Grant(at_ms=at, cpu_milli=self.cpu_milli, memory_bytes=self.memory_bytes)
            )
            self.write_granted()

    def _memory(self) -> bool:
        held = read_memory_held(self.cgroup)
        step = memory_step(
            limit=self.memory_bytes,
            used=held,
            top=self.top.memory_bytes,
            free=self.free().memory_bytes,
        )
        if step.exhausted:
            if not self._told_exhausted:
                self._told_exhausted = True
                log.info("elastic job at its memory limit %d, no room to grow", self.memory_bytes)
                self.exhausted()
            return False
        if step.limit <= self.memory_bytes:
            return False
        raise_memory_limit(self.cgroup, step.limit, swap_accounting=self.swap_accounting)
        self.take(Resources(cpu_milli=0, memory_bytes=step.limit - self.memory_bytes))
        self.memory_bytes = step.limit
        return True

    def _cpu(self) -> bool:
        try:
            text = (self.area / "request").read_text()
        except FileNotFoundError:
            return False
        if text == self._asked:
            return False
        self._asked = text
        asked = parse_request(text)
        if asked is None:
            log.info("elastic job: unreadable request %r", text[:80])
            return False
        grant = cpu_grant(
            asked=asked, current=self.cpu_milli, top=self.top.cpu_milli, free=self.free().cpu_milli
        )
        if grant <= self.cpu_milli:
            self.write_granted()  # the answer is "what you have"
            return False
        set_cpu_limit(self.cgroup, grant)
        self.take(Resources(cpu_milli=grant - self.cpu_milli, memory_bytes=0))
        self.cpu_milli = grant
        return True
