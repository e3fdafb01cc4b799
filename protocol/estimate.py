"""Resource estimation: from one measured run to the resources a bid should ask for.

Rules (spec/workloads.md, "Estimation"; vectors in spec/vectors/estimate.json):
- An image may say how to run itself in estimation mode with the OCI config label
  ``org.computeexchange.estimate``, a JSON object: ``command`` (a list of strings; absent:
  the job's own command), ``sample_bytes`` (each input is cut to its first N bytes for the
  run; absent: whole inputs) and ``memory`` (``"fixed"``, the default: peak memory does not
  grow with the input, as for a streaming job; ``"linear"``: it grows in proportion).
  Anything else in the label is refused (:class:`BadEstimateLabel`, naming the key).
- A sampled run is scaled to the full inputs by ``full / sampled`` input bytes: CPU time,
  wall time and I/O always, peak memory only when the label says ``"linear"``, scratch
  never (it is measured, not guessed).
- The recommendation adds headroom: memory x 1.25 rounded up to a MiB (at least 16 MiB, so
  the runtime's own pages fit), CPU the average cores used x 1.1 rounded up to 100
  millicores (at least 100), wall time twice the expected run plus 10 s, rounded up to a
  second, scratch x 1.25 rounded up to a MiB (0 when the run wrote none). Every figure is
  kept within protocol.limits' bounds, so a recommendation is always a usable request.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from fractions import Fraction

from protocol.limits import LIMITS
from protocol.messages import Prices, Resources, Usage
from protocol.settlement import cost, quote

__all__ = [
    "ESTIMATE_LABEL",
    "BadEstimateLabel",
    "EstimateRule",
    "Observed",
    "Recommendation",
    "parse_estimate_label",
    "recommend",
]

ESTIMATE_LABEL = "org.computeexchange.estimate"
MIB = 1 << 20
MEMORY_HEADROOM = Fraction(5, 4)
CPU_HEADROOM = Fraction(11, 10)
DISK_HEADROOM = Fraction(5, 4)
MIN_MEMORY = 16 * MIB
CPU_STEP = 100  # millicores
WALL_SLACK_MS = 10_000
_KEYS = frozenset({"command", "sample_bytes", "memory"})


class BadEstimateLabel(ValueError):
    """The image's estimation label is unusable; ``key`` names the part (``""``: the whole)."""

    reason = "bad-estimate-label"

    def __init__(self, key: str, why: str) -> None:
        where = f"{ESTIMATE_LABEL}" + (f" {key}" if key else "")
        super().__init__(f"{where}: {why}")
        self.key = key


@dataclass(frozen=True, slots=True, kw_only=True)
class EstimateRule:
    """How to run an image in estimation mode (the label, parsed)."""

    command: tuple[str, ...] | None = None
    sample_bytes: int | None = None
    memory_scales: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Observed:
    """What one run measured (its cgroup counters and its scratch area)."""

    wall_ms: int
    cpu_us: int
    memory_peak_bytes: int
    io_read_bytes: int = 0
    io_write_bytes: int = 0
    scratch_bytes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Recommendation:
    """What to bid for: ``resources`` and ``wall_ms`` with headroom; ``expected``, the run
    scaled to the full inputs (what a receipt would meter); ``scale``, full / sampled."""

    resources: Resources
    wall_ms: int
    expected: Usage
    scale: Fraction

    def expected_cost(self, prices: Prices) -> int:
        """What the expected run costs at ``prices`` (micro-credits)."""
        return cost(prices, self.resources, self.expected)

    def worst_cost(self, prices: Prices) -> int:
        """The bid's quote: every reserved core busy for the whole wall-time limit."""
        return quote(prices, self.resources, self.wall_ms)


def parse_estimate_label(value: str) -> EstimateRule:
    """The rule an image's ``org.computeexchange.estimate`` label states.

    Raises:
        BadEstimateLabel: not a JSON object of the keys above with values of their types.
    """
    try:
        doc = json.loads(value)
    except ValueError:
        raise BadEstimateLabel("", "is not JSON") from None
    if not isinstance(doc, dict):
        raise BadEstimateLabel("", "must be a JSON object")
    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise BadEstimateLabel(unknown[0], f"unknown key; use {', '.join(sorted(_KEYS))}")
    command = doc.get("command")
    if command is not None and (
        not isinstance(command, list)
        or not command
        or not all(isinstance(a, str) and a for a in command)
    ):
        raise BadEstimateLabel("command", "must be a non-empty list of non-empty strings")
    sample = doc.get("sample_bytes")
    if sample is not None and (type(sample) is not int or sample < 1):
        raise BadEstimateLabel("sample_bytes", "must be a positive integer")
    memory = doc.get("memory", "fixed")
    if memory not in ("fixed", "linear"):
        raise BadEstimateLabel("memory", 'must be "fixed" or "linear"')
    return EstimateRule(
        command=tuple(command) if command is not None else None,
        sample_bytes=sample,
        memory_scales=memory == "linear",
    )


def _up(value: Fraction | int, step: int) -> int:
    return math.ceil(Fraction(value) / step) * step


def _bounded(field: str, value: int) -> int:
    bounds = LIMITS[field]
    return min(max(value, bounds.minimum), bounds.maximum)


def recommend(
    observed: Observed,
    *,
    full_input_bytes: int = 0,
    sampled_input_bytes: int = 0,
    memory_scales: bool = False,
    gpus: int = 0,
) -> Recommendation:
    """Resources for the whole job from a run on ``sampled_input_bytes`` of its
    ``full_input_bytes`` of input (equal, or both 0, when the run saw everything);
    ``memory_scales`` is the rule's ``"memory": "linear"``."""
    scale = Fraction(1)
    if 0 < sampled_input_bytes < full_input_bytes:
        scale = Fraction(full_input_bytes, sampled_input_bytes)
    wall_ms = max(1, math.ceil(observed.wall_ms * scale))
    cpu_us = math.ceil(observed.cpu_us * scale)
    memory = observed.memory_peak_bytes
    if memory_scales:
        memory = math.ceil(memory * scale)
    cores = Fraction(cpu_us, wall_ms * 1000)
    cpu_milli = max(CPU_STEP, _up(cores * 1000 * CPU_HEADROOM, CPU_STEP))
    memory_bytes = max(MIN_MEMORY, _up(memory * MEMORY_HEADROOM, MIB))
    disk = observed.scratch_bytes
    disk_bytes = _up(disk * DISK_HEADROOM, MIB) if disk else 0
    resources = Resources(
        cpu_milli=_bounded("resources.cpu_milli", cpu_milli),
        memory_bytes=_bounded("resources.memory_bytes", memory_bytes),
        disk_bytes=_bounded("resources.disk_bytes", disk_bytes),
        gpus=gpus,
    )
    limit_ms = _bounded("job.wall_ms", _up(2 * wall_ms + WALL_SLACK_MS, 1000))
    expected = Usage(
        wall_ms=wall_ms,
        cpu_us=cpu_us,
        memory_peak_bytes=memory,
        io_read_bytes=math.ceil(observed.io_read_bytes * scale),
        io_write_bytes=math.ceil(observed.io_write_bytes * scale),
    )
    return Recommendation(resources=resources, wall_ms=limit_ms, expected=expected, scale=scale)
