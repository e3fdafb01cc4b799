"""Find a job's cgroup and read its usage counters, on cgroup v1, hybrid and v2 hosts.

Rules:
- The host's mode is decided once from /proc/self/mountinfo: ``v2`` when /sys/fs/cgroup is
  cgroup2, ``hybrid`` when v1 controllers sit beside a cgroup2 mount (ours), else ``v1``.
- A job's cgroup is located from ``/proc/<init pid>/cgroup`` after ``create``, so it does not
  matter where a runtime places a relative ``cgroupsPath`` (crun and runc differ).
- Counters, v1 / v2 (see PLATFORM.md): ``cpuacct.usage`` / ``cpu.stat usage_usec``;
  ``memory.max_usage_in_bytes`` / ``memory.peak``; ``memory.oom_control oom_kill`` /
  ``memory.events oom_kill``; ``pids.peak`` and ``pids.events max`` on both;
  ``blkio.throttle.io_service_bytes_recursive`` / ``io.stat``. A counter the kernel lacks
  reads as 0. The parsers are pure functions of the file text.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CgroupMode",
    "Counters",
    "JobCgroup",
    "detect_mode",
    "locate",
    "parse_mode",
    "read_counters",
]

log = logging.getLogger(__name__)


class CgroupMode(enum.StrEnum):
    V1 = "v1"
    HYBRID = "hybrid"
    V2 = "v2"


def parse_mode(mountinfo: str) -> CgroupMode:
    """The cgroup mode from the text of /proc/self/mountinfo."""
    v1 = False
    v2_at: set[str] = set()
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or not rfields:
            continue
        if rfields[0] == "cgroup2":
            v2_at.add(fields[4])
        elif rfields[0] == "cgroup":
            v1 = True
    if "/sys/fs/cgroup" in v2_at:
        return CgroupMode.V2
    return CgroupMode.HYBRID if v1 and v2_at else CgroupMode.V1


def detect_mode() -> CgroupMode:
    return parse_mode(Path("/proc/self/mountinfo").read_text())


def v1_mounts(mountinfo: str) -> dict[str, Path]:
    """controller name -> v1 hierarchy mount point."""
    out: dict[str, Path] = {}
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(rfields) < 3 or rfields[0] != "cgroup":
            continue
        for opt in rfields[2].split(","):
            out.setdefault(opt.removeprefix("name="), Path(fields[4]))
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class JobCgroup:
    """Where one job's counters live: ``dirs`` maps controller to directory (v1), or has the
    single key ``""`` for the unified hierarchy (v2)."""

    mode: CgroupMode
    dirs: dict[str, Path]

    def file(self, controller: str, name: str) -> Path | None:
        d = self.dirs.get("" if self.mode is CgroupMode.V2 else controller)
        return d / name if d is not None else None


def parse_proc_cgroup(
    text: str, mode: CgroupMode, mounts: dict[str, Path], v2_root: Path
) -> JobCgroup:
    """A JobCgroup from the text of /proc/<pid>/cgroup."""
    dirs: dict[str, Path] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.lstrip("/")
        if controllers == "":
            if mode is CgroupMode.V2:
                dirs[""] = v2_root / rel
            continue
        for c in controllers.split(","):
            c = c.removeprefix("name=")
            if c in mounts:
                dirs[c] = mounts[c] / rel
    return JobCgroup(mode=mode, dirs=dirs)


def locate(pid: int, mode: CgroupMode) -> JobCgroup:
    """The cgroup of a live process. Raises OSError if it is gone."""
    text = Path(f"/proc/{pid}/cgroup").read_text()
    mounts = v1_mounts(Path("/proc/self/mountinfo").read_text())
    return parse_proc_cgroup(text, mode, mounts, Path("/sys/fs/cgroup"))


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
