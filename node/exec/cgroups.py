"""Place a job's cgroup, read its usage counters and remove it, on cgroup v1, hybrid and v2.

Rules:
- The host's mode is decided once from /proc/self/mountinfo: ``v2`` when /sys/fs/cgroup is
  cgroup2, ``hybrid`` when v1 controllers sit beside a cgroup2 mount (ours), else ``v1``.
  Where each hierarchy is mounted is read at the same time (:class:`Hierarchies`).
- A job's cgroup path is absolute (``/cx/<job>``), which crun and runc place alike, at the
  root of every hierarchy (a relative path they place differently, PLATFORM.md); so where
  its counters are, and what to remove, follows from the path alone.
- Removal does not depend on how far the job got: every hierarchy is swept for the path,
  deepest directories first, and processes still inside are killed (a runtime that failed
  half-way through ``create`` leaves its cgroups behind).
- Counters, v1 / v2 (see PLATFORM.md): ``cpuacct.usage`` / ``cpu.stat usage_usec``;
  ``memory.max_usage_in_bytes`` / ``memory.peak``; ``memory.oom_control oom_kill`` /
  ``memory.events oom_kill``; ``pids.peak`` and ``pids.events max`` on both;
  ``blkio.throttle.io_service_bytes_recursive`` / ``io.stat``. A counter the kernel lacks
  reads as 0. The parsers are pure functions of the file text.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CgroupMode",
    "Counters",
    "Hierarchies",
    "JobCgroup",
    "detect_hierarchies",
    "parse_hierarchies",
    "raise_memory_limit",
    "read_counters",
    "read_memory_held",
    "read_pids",
    "set_cpu_limit",
]

log = logging.getLogger(__name__)


class CgroupMode(enum.StrEnum):
    V1 = "v1"
    HYBRID = "hybrid"
    V2 = "v2"


@dataclass(frozen=True, slots=True, kw_only=True)
class JobCgroup:
    """Where one job's counters live: ``dirs`` maps controller to directory (v1), or has the
    single key ``""`` for the unified hierarchy (v2)."""

    mode: CgroupMode
    dirs: dict[str, Path]

    def file(self, controller: str, name: str) -> Path | None:
        d = self.dirs.get("" if self.mode is CgroupMode.V2 else controller)
        return d / name if d is not None else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Hierarchies:
    """This host's cgroup mode and mount points: ``v1`` maps each v1 controller to its
    hierarchy, ``unified`` is the cgroup2 mount (if any), ``roots`` every hierarchy."""

    mode: CgroupMode
    v1: dict[str, Path]
    unified: Path | None
    roots: tuple[Path, ...]

    def job(self, path: str) -> JobCgroup:
        """The cgroup at absolute ``path`` (e.g. ``/cx/<job>``) in every hierarchy."""
        rel = path.lstrip("/")
        if self.mode is CgroupMode.V2:
            assert self.unified is not None
            return JobCgroup(mode=self.mode, dirs={"": self.unified / rel})
        return JobCgroup(mode=self.mode, dirs={c: m / rel for c, m in self.v1.items()})

    def remove(self, path: str) -> list[Path]:
        """Remove the cgroup at absolute ``path`` and everything under it from every
        hierarchy, killing processes still inside; return what could not be removed."""
        rel = path.lstrip("/")
        left = []
        for root in self.roots:
            top = root / rel
            if not top.is_dir():
                continue
            below = sorted((d for d, _, _ in os.walk(top)), key=len, reverse=True)
            left += [Path(d) for d in below if not _rmdir_cgroup(Path(d))]
        return left


def parse_hierarchies(mountinfo: str) -> Hierarchies:
    """The cgroup mode and mount points from the text of /proc/self/mountinfo."""
    v1: dict[str, Path] = {}
    roots: list[Path] = []
    unified: Path | None = None
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or not rfields:
            continue
        point = Path(fields[4])
        if rfields[0] == "cgroup2":
            unified = unified if unified == Path("/sys/fs/cgroup") else point
            roots.append(point)
        elif rfields[0] == "cgroup" and len(rfields) >= 3:
            roots.append(point)
            for opt in rfields[2].split(","):
                if opt not in ("rw", "ro"):
                    v1.setdefault(opt.removeprefix("name="), point)
    if unified == Path("/sys/fs/cgroup"):
        mode = CgroupMode.V2
    else:
        mode = CgroupMode.HYBRID if v1 and unified else CgroupMode.V1
    return Hierarchies(mode=mode, v1=v1, unified=unified, roots=tuple(dict.fromkeys(roots)))


def detect_hierarchies() -> Hierarchies:
    return parse_hierarchies(Path("/proc/self/mountinfo").read_text())


def _rmdir_cgroup(d: Path, attempts: int = 50) -> bool:
    """rmdir one cgroup; on EBUSY kill what is still inside and try again for a while
    (killed processes leave the cgroup a moment after the signal)."""
    for _ in range(attempts):
        try:
            d.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                log.warning("cannot remove cgroup %s: %s", d, exc)
                return False
        with contextlib.suppress(OSError):
            for pid in (d / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.01)
    log.warning("cgroup %s still busy after killing its processes", d)
    return False


@dataclass(frozen=True, slots=True, kw_only=True)
class Counters:
    cpu_us: int = 0
    memory_peak_bytes: int = 0
    oom_kills: int = 0
    pids_peak: int = 0
    pids_limit_hits: int = 0
    io_read_bytes: int = 0
    io_write_bytes: int = 0


def parse_keyed(text: str) -> dict[str, int]:
    """``key value`` lines (memory.events, cpu.stat, pids.events, memory.oom_control)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def parse_blkio(text: str) -> tuple[int, int]:
    """(read, write) bytes from v1 ``blkio.throttle.io_service_bytes_recursive``."""
    read = write = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit():
            if parts[1] == "Read":
                read += int(parts[2])
            elif parts[1] == "Write":
                write += int(parts[2])
    return read, write


def parse_io_stat(text: str) -> tuple[int, int]:
    """(read, write) bytes from v2 ``io.stat``, summed over devices."""
    read = write = 0
    for line in text.splitlines():
        for kv in line.split()[1:]:
            key, _, value = kv.partition("=")
            if key == "rbytes" and value.isdigit():
                read += int(value)
            elif key == "wbytes" and value.isdigit():
                write += int(value)
    return read, write


def _read(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return path.read_text()
    except OSError:
        return ""


def _int(path: Path | None) -> int:
    text = _read(path).strip()
    return int(text) if text.isdigit() else 0


def read_counters(cg: JobCgroup) -> Counters:
    """Everything the receipt needs, read before the runtime deletes the cgroup."""
    pids_events = parse_keyed(_read(cg.file("pids", "pids.events")))
    if cg.mode is CgroupMode.V2:
        io = parse_io_stat(_read(cg.file("io", "io.stat")))
        return Counters(
            cpu_us=parse_keyed(_read(cg.file("cpu", "cpu.stat"))).get("usage_usec", 0),
            memory_peak_bytes=_int(cg.file("memory", "memory.peak")),
            oom_kills=parse_keyed(_read(cg.file("memory", "memory.events"))).get("oom_kill", 0),
            pids_peak=_int(cg.file("pids", "pids.peak")),
            pids_limit_hits=pids_events.get("max", 0),
            io_read_bytes=io[0],
            io_write_bytes=io[1],
        )
    io = parse_blkio(_read(cg.file("blkio", "blkio.throttle.io_service_bytes_recursive")))
    oom = parse_keyed(_read(cg.file("memory", "memory.oom_control")))
    return Counters(
        cpu_us=_int(cg.file("cpuacct", "cpuacct.usage")) // 1000,
        memory_peak_bytes=_int(cg.file("memory", "memory.max_usage_in_bytes")),
        oom_kills=oom.get("oom_kill", 0),
        pids_peak=_int(cg.file("pids", "pids.peak")),
        pids_limit_hits=pids_events.get("max", 0),
        io_read_bytes=io[0],
        io_write_bytes=io[1],
    )


# -- elastic limits (protocol/elastic.py decides; these apply) ------------------------------


def read_memory_held(cg: JobCgroup) -> int:
    """Memory the job cannot give back: anonymous pages and tmpfs (v1 ``total_rss +
    total_shmem``, v2 ``anon + shmem`` of memory.stat); page cache, which the kernel
    reclaims at the limit, does not count."""
    stat = parse_keyed(_read(cg.file("memory", "memory.stat")))
    if cg.mode is CgroupMode.V2:
        return stat.get("anon", 0) + stat.get("shmem", 0)
    return stat.get("total_rss", 0) + stat.get("total_shmem", 0)


def _write(path: Path | None, value: str) -> None:
    if path is None:
        raise OSError(f"no cgroup file to write {value!r} to")
    path.write_text(value)


def raise_memory_limit(cg: JobCgroup, limit: int, *, swap_accounting: bool) -> None:
    """Raise the job's memory limit to ``limit`` (no swap beyond it), in place.

    Raises:
        OSError: the kernel refused.
    """
    if cg.mode is CgroupMode.V2:
        _write(cg.file("memory", "memory.max"), str(limit))
        return
    # v1 requires memsw >= limit at every moment: raise memsw first.
    if swap_accounting:
        _write(cg.file("memory", "memory.memsw.limit_in_bytes"), str(limit))
    _write(cg.file("memory", "memory.limit_in_bytes"), str(limit))


def set_cpu_limit(cg: JobCgroup, cpu_milli: int, period_us: int = 100_000) -> None:
    """Set the job's CPU quota to ``cpu_milli`` millicores per period, in place.

    Raises:
        OSError: the kernel refused.
    """
    quota = max(1000, cpu_milli * period_us // 1000)
    if cg.mode is CgroupMode.V2:
        _write(cg.file("cpu", "cpu.max"), f"{quota} {period_us}")
        return
    _write(cg.file("cpu", "cpu.cfs_quota_us"), str(quota))


def read_pids(cg: JobCgroup) -> set[int]:
    """The processes in the job's cgroup, as this (the host's) pid namespace numbers them."""
    text = _read(cg.file("pids", "cgroup.procs"))
    return {int(p) for p in text.split() if p.isdigit()}
