"""The bounds every job's limits must lie within (spec/messages.md, "Limits").

Rules:
- One place decides whether a job's limits are usable, for a local job (``cx exec``), a
  buyer's request and a provider's check of proposed terms alike: a limit outside its
  bounds never reaches a runtime, where it would fail half-way (``--memory 1``), be
  rounded into something else (``--cpu 0`` ran at 1%) or switch the limit off
  (``--pids 0``).
- Each bound says why it is there: the kernel's own limits (a CPU quota below 1 ms per
  100 ms period is refused), what the runtime needs to start a container at all, and
  ceilings no machine reaches that keep every value exact in JSON and in a signed int64.
- :func:`check_limits` raises :class:`OutOfBounds`, an
  :class:`~protocol.errors.InvalidMessage` with reason ``bad-field``, naming the first
  field out of bounds (``field``), its value and the bounds.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from types import MappingProxyType

from protocol.errors import InvalidMessage, Reason
from protocol.messages import Checkpoint, JobSpec, Resources

__all__ = [
    "CHECKPOINT_SIGNALS",
    "LIMITS",
    "Bounds",
    "OutOfBounds",
    "check_checkpoint",
    "check_job",
    "check_limits",
    "check_pids_limit",
    "check_resources",
]

MIB, TIB = 1 << 20, 1 << 40
# 64 TiB: beyond any single machine's memory or scratch, far inside int64 and JSON.
_HUGE_BYTES = 64 * TIB


@dataclass(frozen=True, slots=True, kw_only=True)
class Bounds:
    """Inclusive bounds of one limit, and its unit for people."""

    minimum: int
    maximum: int
    unit: str

    def describe(self, value: int) -> str:
        return f"{value} {self.unit} is outside {self.minimum}..{self.maximum} {self.unit}"


LIMITS = MappingProxyType(
    {
        # 10 millicores is a 1 ms quota per 100 ms period, the kernel's smallest quota.
        "resources.cpu_milli": Bounds(minimum=10, maximum=1_024_000, unit="millicores"),
        # The runtime's init and the job's log pages are charged to the job: 0 or 1 byte
        # made the runtime itself fail (a provider fault for a buyer's mistake).
        "resources.memory_bytes": Bounds(minimum=4 * MIB, maximum=_HUGE_BYTES, unit="bytes"),
        # The scratch disk (the job's /tmp); 0: none, /tmp is the provider's small tmpfs.
        "resources.disk_bytes": Bounds(minimum=0, maximum=_HUGE_BYTES, unit="bytes"),
        "resources.gpus": Bounds(minimum=0, maximum=256, unit="GPUs"),
        "job.wall_ms": Bounds(minimum=1, maximum=30 * 24 * 3_600_000, unit="ms"),
        "job.max_output_bytes": Bounds(minimum=0, maximum=_HUGE_BYTES, unit="bytes"),
        # A provider waits this long for a preempted job's checkpoint before SIGKILL.
        "checkpoint.grace_ms": Bounds(minimum=0, maximum=600_000, unit="ms"),
        # The provider's pids limit per job (not part of a bid): 0 would switch the limit
        # off and a fork bomb would be unbounded; 4,194,304 is the kernel's PID_MAX_LIMIT.
        "pids_limit": Bounds(minimum=8, maximum=4_194_304, unit="processes"),
    }
)

# Signals a job may declare for its checkpoint: ones a program can catch.
CHECKPOINT_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"})


class OutOfBounds(InvalidMessage):
    """A limit outside its bounds: ``field`` names it (``resources.memory_bytes``), ``why``
    says what is allowed."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(Reason.BAD_FIELD, f"{field}: {why}")
        self.field = field
        self.why = why


def _bad(field: str, why: str) -> OutOfBounds:
    return OutOfBounds(field, why)


def _within(field: str, value: int) -> None:
    bounds = LIMITS[field]
    if not bounds.minimum <= value <= bounds.maximum:
        raise _bad(field, bounds.describe(value))


def _container_dir(field: str, path: str) -> None:
    """An absolute, normalised directory path that is not the container's root."""
    if not path.startswith("/") or posixpath.normpath(path) != path or path == "/":
        raise _bad(field, f"{path!r} must be an absolute, normalised path other than /")


def check_resources(resources: Resources) -> None:
    """Raises OutOfBounds if a reserved resource is out of bounds."""
    _within("resources.cpu_milli", resources.cpu_milli)
    _within("resources.memory_bytes", resources.memory_bytes)
    _within("resources.disk_bytes", resources.disk_bytes)
    _within("resources.gpus", resources.gpus)


def check_job(job: JobSpec) -> None:
    """Raises OutOfBounds if the job's wall time, output cap or output directory is
    unusable."""
    _within("job.wall_ms", job.wall_ms)
    _within("job.max_output_bytes", job.max_output_bytes)
    _container_dir("job.output_path", job.output_path)


def check_checkpoint(checkpoint: Checkpoint | None) -> None:
    """Raises OutOfBounds if the checkpoint contract is unusable."""
    if checkpoint is None:
        return
    _within("checkpoint.grace_ms", checkpoint.grace_ms)
    if checkpoint.signal not in CHECKPOINT_SIGNALS:
        allowed = ", ".join(sorted(CHECKPOINT_SIGNALS))
        raise _bad("checkpoint.signal", f"{checkpoint.signal!r} is not one of {allowed}")
    _container_dir("checkpoint.path", checkpoint.path)


def check_limits(job: JobSpec, resources: Resources, checkpoint: Checkpoint | None) -> None:
    """Check every limit of one job: the single entry point for buyers, providers and
    ``cx exec``.

    Raises:
        OutOfBounds: an InvalidMessage (BAD_FIELD) naming the first field out of bounds.
    """
    check_resources(resources)
    check_job(job)
    check_checkpoint(checkpoint)


def check_pids_limit(pids: int) -> None:
    """Raises OutOfBounds if a provider's per-job pids limit is unusable."""
    _within("pids_limit", pids)
