"""Why a job ended, decided from what the provider observed (spec/content.md, "Exit reasons").

Pure: the executor meters the job's cgroup and hands the observation in; the same
observation always gives the same reason, so a buyer can re-derive it from a receipt.

Precedence, first match wins:
1. provider-fault: the provider could not run or meter the job.
2. preempted: the provider stopped the job (checkpoint contract).
3. output-too-large: the output area holds more than ``max_output_bytes``.
4. oom: the cgroup OOM-killed a process of the job, even if the job then exited 0 (a shell
   whose ``dd`` into the memory-backed /tmp was killed goes on to exit 0: its work was
   lost all the same, and the exit reason must say so).
5. success: exit status 0 and not timed out.
6. pids-exhausted: the job failed and a fork hit the pids limit (a job that copes with a
   failed fork and exits 0 succeeded).
7. timeout: the wall-clock limit was reached.
8. nonzero-exit: anything else.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.messages import ExitReason

__all__ = ["Observation", "classify", "exit_code_of"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    exit_code: int  # 0..255, or 128 + signal number when killed by a signal
    oom_kills: int = 0
    pids_limit_hits: int = 0
    timed_out: bool = False
    preempted: bool = False
    output_bytes: int = 0
    max_output_bytes: int
    fault: bool = False


def exit_code_of(*, exited: bool, status: int) -> int:
    """Shell convention: the exit status, or 128 + the signal that killed the process."""
    return status if exited else 128 + status


def classify(o: Observation) -> ExitReason:
    if o.fault:
        return ExitReason.PROVIDER_FAULT
    if o.preempted:
        return ExitReason.PREEMPTED
    if o.output_bytes > o.max_output_bytes:
        return ExitReason.OUTPUT_TOO_LARGE
    if o.oom_kills > 0:
        return ExitReason.OOM
    if o.exit_code == 0 and not o.timed_out:
        return ExitReason.SUCCESS
    if o.pids_limit_hits > 0:
        return ExitReason.PIDS_EXHAUSTED
    if o.timed_out:
        return ExitReason.TIMEOUT
    return ExitReason.NONZERO_EXIT
