"""Job lifecycle (spec/lifecycle.md, "Job").

    agreed -> transferring -> running -> succeeded | failed | timed-out | preempted
           -> receipted -> settled

A job whose image or inputs cannot be had as named fails while transferring (exit reason
``bad-input``: the buyer's fault). A provider fault can end a job from any state before it
ends on its own; a job that ended
so may still be receipted (the provider admits it and charges nothing) or be abandoned by
the buyer and matched elsewhere. Both roles use the same table: the provider moves its job
as the executor reports, the buyer follows the provider's signed JobStatus events, which
must follow the table too.
"""

from __future__ import annotations

from types import MappingProxyType

from protocol.machine import Machine
from protocol.messages import ExitReason, JobState

__all__ = ["ENDED", "END_STATE", "job_machine"]

_J = JobState
ENDED = frozenset({_J.SUCCEEDED, _J.FAILED, _J.TIMED_OUT, _J.PREEMPTED, _J.PROVIDER_FAULT})

# The events of this machine are the states it moves to: a JobStatus names its new state.
_EDGES = [
    (_J.AGREED, _J.TRANSFERRING),
    (_J.TRANSFERRING, _J.RUNNING),
    (_J.TRANSFERRING, _J.FAILED),  # bad-input: the content was not as the job named it
    *((_J.RUNNING, end) for end in ENDED),
    *((before, _J.PROVIDER_FAULT) for before in (_J.AGREED, _J.TRANSFERRING)),
    *((end, _J.RECEIPTED) for end in ENDED),
    (_J.RECEIPTED, _J.SETTLED),
]
JOB_TABLE = MappingProxyType({(a, b): b for a, b in _EDGES})

END_STATE = MappingProxyType(
    {
        ExitReason.SUCCESS: _J.SUCCEEDED,
        ExitReason.NONZERO_EXIT: _J.FAILED,
        ExitReason.OOM: _J.FAILED,
        ExitReason.PIDS_EXHAUSTED: _J.FAILED,
        ExitReason.OUTPUT_TOO_LARGE: _J.FAILED,
        ExitReason.TIMEOUT: _J.TIMED_OUT,
        ExitReason.PREEMPTED: _J.PREEMPTED,
        ExitReason.PROVIDER_FAULT: _J.PROVIDER_FAULT,
        ExitReason.BAD_INPUT: _J.FAILED,
        ExitReason.STOPPED: _J.FAILED,
    }
)


def job_machine() -> Machine[JobState, JobState]:
    return Machine(JOB_TABLE, _J.AGREED, _J.ERROR)
