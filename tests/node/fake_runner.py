"""A stand-in for the executor behind the provider's ``Runner`` interface, for markets run
under trio's MockClock: a job "runs" for the seconds its command sleeps (``sleep N``), in
trio time, so virtual time passes and no container starts. The real executor is tested on
its own (test_executor_*) and inside whole markets (test_market.py, test_testnet_e2e.py)."""

from __future__ import annotations

import re

import trio

from node.exec.executor import JobResult
from node.storage.store import BlobStore
from protocol.messages import Checkpoint, Elastic, ExitReason, JobSpec, Resources, Usage

_SLEEP = re.compile(r"sleep (\d+)")


class FakeRunner:
    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self.started: list[str] = []
        self._stops: dict[str, trio.Event] = {}

    async def recover(self) -> None:
        pass

    async def run_job(
        self,
        spec: JobSpec,
        resources: Resources,
        *,
        job_id: str,
        checkpoint: Checkpoint | None,
        elastic: Elastic | None = None,
    ) -> JobResult:
        self.started.append(job_id)
        found = _SLEEP.search(" ".join(spec.command))
        seconds = int(found.group(1)) if found else 0
        stop = self._stops[job_id] = trio.Event()
        began = trio.current_time()
        with trio.move_on_after(seconds):
            await stop.wait()
        wall_ms = int((trio.current_time() - began) * 1000)
        stdout = self.store.put_bytes(f"ran {job_id}\n".encode())
        return JobResult(
            job_id=job_id,
            exit_reason=ExitReason.PREEMPTED if stop.is_set() else ExitReason.SUCCESS,
            exit_code=143 if stop.is_set() else 0,
            usage=Usage(wall_ms=wall_ms, cpu_us=wall_ms * resources.cpu_milli // 2),
            stdout=stdout,
        )

    def live_log(self, job_id: str, name: str, offset: int, limit: int) -> bytes | None:
        return b"" if job_id in self._stops else None

    def preempt(self, job_id: str) -> bool:
        stop = self._stops.get(job_id)
        if stop is None:
            return False
        stop.set()
        return True
