"""The provider's benchmark (protocol/work.py): the standard hashing kernel, run as a job of
one core in the provider's own executor at start-up, gives the ``work_score`` its offers
state. The image is the busybox the node builds itself, so every provider runs the same
bytes and nothing is fetched.
"""

from __future__ import annotations

import logging
import tempfile
from typing import TYPE_CHECKING

import trio

from node.exec.executor import JobResult
from node.storage.image import ImageError, build_rootfs, import_image
from node.storage.store import BlobStore
from protocol.messages import ExitReason, JobSpec, Resources
from protocol.work import BENCHMARK_BYTES, BENCHMARK_COMMAND, score_of

if TYPE_CHECKING:
    from node.market.provider import Runner

__all__ = ["benchmark_image", "measure_work_score", "run_benchmark"]

log = logging.getLogger(__name__)

_ONE_CORE = Resources(cpu_milli=1000, memory_bytes=128 << 20)


async def measure_work_score(runner: Runner, store: BlobStore, job_id: str) -> int | None:
    """Work units per core-hour of this machine; None (logged) if the kernel could not run.
    ``job_id`` must be unique on the host: a job's cgroup is named after it, and several
    providers on one machine (a testnet) measure at the same time."""
    result = await run_benchmark(runner, store, job_id)
    if result is None:
        return None
    score = score_of(BENCHMARK_BYTES, result.usage.cpu_us)
    log.info("benchmark: %d work units per core-hour (%d us of CPU)", score, result.usage.cpu_us)
    return score


async def run_benchmark(runner: Runner, store: BlobStore, job_id: str) -> JobResult | None:
    """Run the kernel as a job of one core; its result if it succeeded, else None (logged)."""
    try:
        image = await trio.to_thread.run_sync(benchmark_image, store)
    except (ImageError, OSError) as exc:
        log.warning("no benchmark: cannot build its image: %s", exc)
        return None
    spec = JobSpec(image=image, command=BENCHMARK_COMMAND, wall_ms=300_000)
    result = await runner.run_job(spec, _ONE_CORE, job_id=job_id, checkpoint=None)
    if result.exit_reason is not ExitReason.SUCCESS or result.usage.cpu_us <= 0:
        log.warning("benchmark failed: %s, exit %s", result.exit_reason, result.exit_code)
        return None
    return result


def benchmark_image(store: BlobStore) -> str:
    """The busybox image the kernel runs in, built here and put in ``store``; its digest."""
    with tempfile.TemporaryDirectory(prefix="cx-benchmark-") as root:
        build_rootfs(f"{root}/layout")
        return import_image(store, f"{root}/layout").manifest
