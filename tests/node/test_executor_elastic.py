"""Elastic jobs in real containers: memory raised as the job nears its limit, CPU granted on
request through /cx/request, both recorded as grants; a job the provider cannot grow is
preempted with its checkpoint."""

from __future__ import annotations

import pytest
from executor_support import (
    MiB,
    busybox_image,
    close_and_remove,
    make_executor,
    searchable_dir,
    spec,
)

from node.exec.elastic import parse_request
from node.exec.executor import Executor, ExecutorConfig
from protocol.messages import Checkpoint, Elastic, ExitReason, Resources

pytestmark = pytest.mark.integration

# Holds N MiB in /dev/shm (tmpfs pages: memory the job cannot give back), one MiB every
# 50 ms, as a job whose data grows would.
GROW = (
    "i=0; while [ $i -lt {mib} ]; do i=$((i+1)); "
    "dd if=/dev/zero of=/dev/shm/f$i bs=1M count=1 2>/dev/null || exit 9; sleep 0.05; done"
)


@pytest.fixture(scope="module")
def env():
    root = searchable_dir("cx-elastic-")
    executor = make_executor(root)
    yield executor, busybox_image(executor, root)
    close_and_remove(executor, root)


def test_cpu_requests_parse() -> None:
    assert parse_request("cpu 4\n") == 4000
    assert parse_request("cpu 2.5") == 2500
    assert parse_request("cpu 1500m") == 1500
    assert parse_request("cpu lots") is None
    assert parse_request("memory 4") is None


async def test_memory_grows_without_a_restart_and_is_recorded(env):
    executor, image = env
    reserved = Resources(cpu_milli=500, memory_bytes=32 * MiB)
    result = await executor.run_job(
        spec(image, GROW.format(mib=48) + "; cat /cx/granted > /out/granted"),
        reserved,
        elastic=Elastic(memory_bytes=128 * MiB),
    )
    assert result.exit_reason is ExitReason.SUCCESS, result
    assert result.usage.oom_kills == 0
    grants = result.usage.grants
    assert grants, "the limit was never raised"
    limits = [g.memory_bytes for g in grants]
    assert limits == sorted(limits)
    assert 48 * MiB < limits[-1] <= 128 * MiB
    assert all(g.cpu_milli == 500 for g in grants)
    said = executor.store.read_bytes(result.outputs[0].digest).decode()
    assert f"memory_bytes {limits[-1]}" in said
    assert result.usage.memory_peak_bytes > 48 * MiB  # more than it reserved, and it lived
    assert executor.free == executor.config.capacity  # the growth is given back


async def test_without_elastic_the_same_job_meets_its_limit(env):
    executor, image = env
    result = await executor.run_job(
        spec(image, GROW.format(mib=48)), Resources(cpu_milli=500, memory_bytes=32 * MiB)
    )
    assert result.exit_reason is ExitReason.OOM, result


async def test_a_job_asks_for_more_cpu_and_gets_what_the_ceiling_allows(env):
    executor, image = env
    script = (
        'echo "cpu 8" > /cx/request; '
        'until grep -q "cpu_milli 2000" /cx/granted; do sleep 0.02; done; '
        "cat /cx/granted > /out/granted"
    )
    result = await executor.run_job(
        spec(image, script, wall_ms=10_000),
        Resources(cpu_milli=500, memory_bytes=64 * MiB),
        elastic=Elastic(cpu_milli=2000),
    )
    assert result.exit_reason is ExitReason.SUCCESS, result
    assert [(g.cpu_milli, g.memory_bytes) for g in result.usage.grants or ()] == [(2000, 64 * MiB)]
    assert executor.free == executor.config.capacity


async def test_a_job_the_provider_cannot_grow_is_preempted_with_its_checkpoint(env):
    _, image = env
    root = searchable_dir("cx-elastic-small-")
    small = Executor(
        ExecutorConfig(
            store_root=env[0].config.store_root,
            work_root=root / "work",
            capacity=Resources(cpu_milli=1000, memory_bytes=48 * MiB),
            pids_limit=32,
        )
    )
    try:
        script = "echo 7 > /ckpt/state; " + GROW.format(mib=60)
        result = await small.run_job(
            spec(image, script, wall_ms=20_000),
            Resources(cpu_milli=500, memory_bytes=32 * MiB),
            elastic=Elastic(memory_bytes=256 * MiB),
            checkpoint=Checkpoint(path="/ckpt", grace_ms=1000),
        )
        assert result.exit_reason is ExitReason.PREEMPTED, result
        assert result.checkpoint is not None
        assert [g.memory_bytes for g in result.usage.grants or ()] == [48 * MiB]
        assert small.free == small.config.capacity
    finally:
        close_and_remove(small, root)
