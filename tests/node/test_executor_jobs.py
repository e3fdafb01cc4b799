"""Running jobs in real containers: outputs, inputs, limits, metering, checkpoints, capacity."""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import pytest
import trio
import trio.testing
from executor_support import (
    SMALL,
    MiB,
    assert_still_serves,
    busybox_image,
    close_and_remove,
    make_executor,
    searchable_dir,
    spec,
)

from node.exec.cgroups import CgroupMode
from node.exec.executor import CapacityExceeded
from node.market.benchmark import run_benchmark
from protocol.errors import InvalidMessage
from protocol.messages import (
    LOG_CAP_BYTES,
    Checkpoint,
    DataRef,
    ExitReason,
    Resources,
)
from protocol.work import BENCHMARK_BYTES, score_of

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["crun", "runc"])
def env(request):
    root = searchable_dir(f"cx-jobs-{request.param}-")
    executor = make_executor(root, runtime=request.param)
    yield executor, busybox_image(executor, root)
    close_and_remove(executor, root)


async def test_trivial_job_meters_and_returns_outputs(env):
    executor, image = env
    steps: list[str] = []
    result = await executor.run_job(
        spec(
            image,
            "echo hello > /out/a; mkdir /out/d; printf x > /out/d/b; echo log; exit 0",
            env={"GREETING": "hi"},
        ),
        SMALL,
        progress=steps.append,
    )
    assert result.exit_reason is ExitReason.SUCCESS
    assert result.exit_code == 0
    assert [(o.path, o.size) for o in result.outputs] == [("/out/a", 6), ("/out/d/b", 1)]
    assert executor.store.read_bytes(result.outputs[0].digest) == b"hello\n"
    assert result.stdout is not None
    assert executor.store.read_bytes(result.stdout) == b"log\n"
    u = result.usage
    assert u.cpu_us > 0
    assert u.memory_peak_bytes > 0
    assert u.pids_peak >= 1
    assert u.oom_kills == 0
    assert any(s.startswith("running") for s in steps)
    await executor.settled()  # the cleanup runs after the result
    assert not list(executor.jobs_dir.iterdir())
    assert not (executor.runtime.state_root / f"cx-{result.job_id}").exists()


async def test_env_exit_code_and_identity(env):
    executor, image = env
    result = await executor.run_job(
        spec(
            image, 'test "$GREETING" = hi && test "$(id -u)" = 0 && exit 7', env={"GREETING": "hi"}
        ),
        SMALL,
    )
    assert (result.exit_reason, result.exit_code) == (ExitReason.NONZERO_EXIT, 7)


async def test_inputs_are_read_only_and_verified(env):
    executor, image = env
    digest = executor.store.put_bytes(b"input data")
    ref = DataRef(digest=digest, path="/in/data", size=10)
    result = await executor.run_job(
        spec(
            image, "cat /in/data > /out/copy; ! echo x > /in/data && ! rm /in/data", inputs=(ref,)
        ),
        SMALL,
    )
    assert result.exit_reason is ExitReason.SUCCESS, result
    assert result.outputs[0].digest == digest
    assert executor.store.read_bytes(digest) == b"input data"


async def test_missing_image_is_a_provider_fault(env):
    executor, _ = env
    result = await executor.run_job(spec("sha256:" + "1" * 64, "true"), SMALL)
    assert result.exit_reason is ExitReason.PROVIDER_FAULT
    assert "not imported" in result.detail
    assert executor.free == executor.config.capacity


async def test_timeout(env):
    executor, image = env
    result = await executor.run_job(spec(image, "sleep 30", wall_ms=300), SMALL)
    assert result.exit_reason is ExitReason.TIMEOUT
    assert result.exit_code == 137
    assert result.usage.wall_ms >= 300


async def test_cpu_quota_caps_cpu_time(env):
    executor, image = env
    # One busy loop wants a whole core; the quota gives it a quarter.
    result = await executor.run_job(
        spec(image, "while :; do :; done", wall_ms=1000),
        Resources(cpu_milli=250, memory_bytes=64 * MiB),
    )
    assert result.exit_reason is ExitReason.TIMEOUT
    assert 0 < result.usage.cpu_us < result.usage.wall_ms * 1000 * 0.6


async def test_memory_limit_has_no_swap_beyond_it(env):
    executor, image = env
    result = await executor.run_job(
        spec(image, "x=aaaaaaaaaaaaaaaa; while :; do x=$x$x; done"),
        Resources(cpu_milli=1000, memory_bytes=32 * MiB),
    )
    assert result.exit_reason is ExitReason.OOM
    assert result.usage.oom_kills >= 1
    assert result.usage.memory_peak_bytes <= 32 * MiB
    await assert_still_serves(executor, image)


async def test_preempt_checkpoint_and_resume(env):
    executor, image = env
    ready = trio.Event()
    port: list[int] = []

    async def handshake(stream: trio.SocketStream) -> None:
        await stream.receive_some()
        ready.set()

    script = (
        "trap 'echo 41 > /checkpoint/state; exit 0' TERM; "
        "echo up | nc 127.0.0.1 {port}; "
        "while :; do sleep 0.05; done"
    )
    results = []
    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, handshake, 0, host="127.0.0.1")
        listeners = await nursery.start(serve)
        port.append(listeners[0].socket.getsockname()[1])

        async def job() -> None:
            results.append(
                await executor.run_job(
                    spec(image, script.format(port=port[0]), network=True),
                    SMALL,
                    job_id="preempt-me",
                    checkpoint=Checkpoint(grace_ms=5000),
                )
            )
            nursery.cancel_scope.cancel()

        nursery.start_soon(job)
        await ready.wait()
        assert executor.preempt("preempt-me")
    first = results[0]
    assert first.exit_reason is ExitReason.PREEMPTED
    assert first.checkpoint is not None
    assert first.usage.checkpoint_ms > 0
    resumed = await executor.run_job(
        spec(image, "test -f /checkpoint/state && expr $(cat /checkpoint/state) + 1 > /out/n"),
        SMALL,
        checkpoint=Checkpoint(resume_from=first.checkpoint),
    )
    assert resumed.exit_reason is ExitReason.SUCCESS, resumed
    assert executor.store.read_bytes(resumed.outputs[0].digest) == b"42\n"
    assert not executor.preempt("preempt-me")


async def test_concurrent_jobs_have_their_own_limits_and_capacity_holds(env):
    executor, image = env
    results = {}

    async def run(name: str, script: str, memory: int) -> None:
        results[name] = await executor.run_job(
            spec(image, script), Resources(cpu_milli=500, memory_bytes=memory)
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "bomb", "x=aaaaaaaa; while :; do x=$x$x; done", 32 * MiB)
        nursery.start_soon(run, "fine", "head -c 40000000 /dev/zero | wc -c > /out/n", 512 * MiB)
        await trio.testing.wait_all_tasks_blocked()
        assert executor.free.memory_bytes == 1024 * MiB - 544 * MiB
        with pytest.raises(CapacityExceeded):
            await executor.run_job(
                spec(image, "true"), Resources(cpu_milli=500, memory_bytes=600 * MiB)
            )
    assert results["bomb"].exit_reason is ExitReason.OOM
    assert results["fine"].exit_reason is ExitReason.SUCCESS
    assert executor.free == executor.config.capacity


def test_cgroup_mode_is_detected(env):
    executor, _ = env
    assert executor.mode in set(CgroupMode)
    assert executor.runtime.name in ("crun", "runc")


async def test_command_not_in_image_is_the_jobs_failure(env):
    executor, image = env
    result = await executor.run_job(
        spec(image, "unused").__class__(image=image, command=("/no/such/program",)), SMALL
    )
    assert (result.exit_reason, result.exit_code) == (ExitReason.NONZERO_EXIT, 127)
    assert "/no/such/program" in result.detail


async def test_limits_out_of_bounds_are_refused_before_anything_runs(env):
    executor, image = env
    await executor.settled()
    with pytest.raises(InvalidMessage, match=r"resources\.memory_bytes"):
        await executor.run_job(spec(image, "true"), Resources(cpu_milli=500, memory_bytes=1))
    assert not list(executor.jobs_dir.iterdir())
    assert executor.free == executor.config.capacity


def _job_cgroups(job_id: str) -> list[Path]:
    return [d for d in Path("/sys/fs/cgroup").glob(f"*/cx/{job_id}") if d.is_dir()] + [
        d for d in [Path("/sys/fs/cgroup/cx") / job_id] if d.is_dir()
    ]


async def test_a_failed_cgroup_write_leaves_no_cgroup_behind(env):
    # Issue 17, D4: the runtime failing half-way (EINVAL writing a limit) left
    # /sys/fs/cgroup/*/cx/<job> behind. Provoke a real EINVAL with valid limits: a cgroup
    # below the job's that may use more CPU than the job asks for (v1 refuses a parent
    # quota below a child's); on v2, a child with controllers enabled refuses the job's
    # init (no internal processes).
    executor, image = env
    job_id = f"clash-{executor.runtime.name}"
    if executor.mode is CgroupMode.V2:
        held = Path("/sys/fs/cgroup/cx") / job_id / "held"
        held.mkdir(parents=True)
        (held.parent / "cgroup.subtree_control").write_text("+pids")
    else:
        held = executor.cgroups.v1["cpu"] / "cx" / job_id / "held"
        held.mkdir(parents=True)
        (held / "cpu.cfs_quota_us").write_text("200000")
    result = await executor.run_job(spec(image, "true"), SMALL, job_id=job_id)
    assert result.exit_reason is ExitReason.PROVIDER_FAULT, result
    await executor.settled()
    assert _job_cgroups(job_id) == []
    assert not list(executor.jobs_dir.iterdir())
    await assert_still_serves(executor, image)


async def test_each_log_is_capped_on_its_own_and_marked(env):
    # Issue 17: stdout and stderr shared one 8 MiB cap; a job that filled it lost its
    # stderr, and nothing said the log was cut.
    executor, image = env
    over = LOG_CAP_BYTES + 100_000
    result = await executor.run_job(
        spec(image, f"head -c {over} /dev/zero | tr '\\0' x; echo still here >&2"), SMALL
    )
    assert result.exit_reason is ExitReason.SUCCESS, result
    assert result.truncated_logs == ("/dev/stdout",)
    assert result.stdout is not None
    assert result.stderr is not None
    assert executor.store.size(result.stdout) == LOG_CAP_BYTES
    # the job saw its stdout full (ENOSPC), and its stderr is whole
    assert executor.store.read_bytes(result.stderr).endswith(b"still here\n")


async def test_the_benchmark_kernel_gives_a_work_score_from_a_real_container(env):
    """protocol/work.py's kernel, run as the provider runs it at start-up: in the executor,
    one core, on the busybox image the node builds itself. Its output is the MD5 of the
    zeros it hashed, so the work was really done, and the CPU time it took gives a score."""
    executor, _ = env
    result = await run_benchmark(executor, executor.store, f"benchmark-{os.urandom(8).hex()}")
    assert result is not None
    assert result.stdout is not None
    digest = hashlib.md5(bytes(BENCHMARK_BYTES)).hexdigest()
    assert executor.store.read_bytes(result.stdout).split()[0].decode() == digest
    assert score_of(BENCHMARK_BYTES, result.usage.cpu_us) > 0
