"""Workflows: steps whose inputs name other steps' outputs, run as a graph (spec/workloads.md,
"Flows").

Rules:
- A flow is a set of named steps. A step's input may name another step's output
  (``step:/out/path``, or ``step:/out/`` for every output under that directory); the named
  step is then a dependency. A step may also list dependencies without taking their
  outputs (``after``). A dependency on an unknown step, on itself, or any cycle makes the
  flow unusable (:class:`FlowError`, naming the step).
- A step is ``ready`` when it is pending and every dependency has succeeded; every ready
  step may run at once (independent steps run in parallel). When a step fails, after its
  retries, every step that depends on it, directly or not, is ``skipped`` with the reason
  naming the failed step; steps that do not depend on it go on. The flow ends when no
  step is pending or running; it succeeded when every step did.
- A step's attempt that did not succeed is retried while ``attempts <= retries``.
- Outputs pass by digest: a dependent's input is the dependency's output blob, found by
  its container path; a named output the dependency did not produce fails the dependent
  (``missing-output``), not the flow.
"""

from __future__ import annotations

import enum
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "FlowError",
    "Output",
    "Step",
    "StepInput",
    "StepState",
    "check_flow",
    "flow_over",
    "order",
    "ready",
    "resolve_inputs",
    "skipped",
]


class StepState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"  # a dependency failed


_ENDED = frozenset({StepState.SUCCEEDED, StepState.FAILED, StepState.SKIPPED})


class FlowError(ValueError):
    """An unusable flow or step input; ``reason`` is machine-readable (``unknown-step``,
    ``cycle``, ``missing-output``, ``bad-input``), ``step`` names the step."""

    def __init__(self, reason: str, step: str, why: str) -> None:
        super().__init__(f"step {step!r}: {why}")
        self.reason = reason
        self.step = step


@dataclass(frozen=True, slots=True, kw_only=True)
class StepInput:
    """``path`` in the job gets ``source``'s output at ``output`` (a file, or with a
    trailing ``/`` every output under that directory, placed under ``path``)."""

    path: str
    source: str
    output: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    name: str
    inputs: tuple[StepInput, ...] = ()
    after: tuple[str, ...] = ()
    retries: int = 0

    @property
    def needs(self) -> frozenset[str]:
        """Every step this one depends on directly."""
        return frozenset(self.after) | {i.source for i in self.inputs}


@dataclass(frozen=True, slots=True, kw_only=True)
class Output:
    """An output of a finished step: its container path, digest and size."""

    path: str
    digest: str
    size: int


def check_flow(steps: Mapping[str, Step]) -> None:
    """Raises FlowError for an unknown or self dependency, or a cycle."""
    for name, step in steps.items():
        for need in sorted(step.needs):
            if need == name:
                raise FlowError("cycle", name, "depends on itself")
            if need not in steps:
                raise FlowError("unknown-step", name, f"depends on {need!r}, which is no step")
    order(steps)


def order(steps: Mapping[str, Step]) -> list[str]:
    """The steps, each after its dependencies (ties by name).

    Raises:
        FlowError: a cycle (``cycle``), naming a step on it.
    """
    done: list[str] = []
    placed: set[str] = set()
    left = dict(steps)
    while left:
        free = sorted(n for n, s in left.items() if s.needs <= placed)
        if not free:
            raise FlowError("cycle", min(left), "is on a dependency cycle")
        for n in free:
            done.append(n)
            placed.add(n)
            del left[n]
    return done


def ready(steps: Mapping[str, Step], states: Mapping[str, StepState]) -> list[str]:
    """Pending steps whose dependencies have all succeeded, in order."""
    return [
        n
        for n in order(steps)
        if states[n] is StepState.PENDING
        and all(states[d] is StepState.SUCCEEDED for d in steps[n].needs)
    ]


def skipped(steps: Mapping[str, Step], states: Mapping[str, StepState]) -> dict[str, str]:
    """Pending steps that can never run, each with the failed step it waits on."""
    out: dict[str, str] = {}
    cause: dict[str, str] = {n: n for n, s in states.items() if s is StepState.FAILED}
    for n in order(steps):
        if states[n] is StepState.SKIPPED:
            cause.setdefault(n, n)
        if states[n] is not StepState.PENDING:
            continue
        for d in sorted(steps[n].needs):
            if d in cause:
                cause[n] = cause[d]
                out[n] = cause[d]
                break
    return out


def flow_over(states: Iterable[StepState]) -> bool:
    """Has every step ended?"""
    return all(s in _ENDED for s in states)


def resolve_inputs(step: Step, outputs: Mapping[str, Iterable[Output]]) -> list[Output]:
    """The blobs ``step`` takes from its dependencies, at their paths in its job.

    Raises:
        FlowError: ``missing-output``, a named output the dependency did not produce.
    """
    got: list[Output] = []
    for i in step.inputs:
        produced = list(outputs.get(i.source, ()))
        if i.output.endswith("/"):
            under = [o for o in produced if o.path.startswith(i.output)]
            if not under:
                raise FlowError(
                    "missing-output", step.name, f"{i.source} produced nothing under {i.output}"
                )
            for o in under:
                rel = o.path[len(i.output) :]
                got.append(Output(path=posixpath.join(i.path, rel), digest=o.digest, size=o.size))
            continue
        match = [o for o in produced if o.path == i.output]
        if not match:
            raise FlowError("missing-output", step.name, f"{i.source} produced no {i.output}")
        got.append(Output(path=i.path, digest=match[0].digest, size=match[0].size))
    return got
