"""Hostile jobs in real containers: each is contained, ends with the right exit reason, and
the provider keeps serving. Limits are small so each case ends in about a second."""

from __future__ import annotations

import functools
import os

import pytest
import trio
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

from protocol.messages import Checkpoint, ExitReason, Resources

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def env():
    root = searchable_dir("cx-hostile-")
    executor = make_executor(root)  # the runtime this host would use in production
    yield executor, busybox_image(executor, root, with_escape=True)
    close_and_remove(executor, root)


async def test_fork_bomb_is_pids_exhausted(env):
    executor, image = env
    result = await executor.run_job(
        spec(image, "bomb() { bomb | bomb & }; bomb; while :; do sleep 9 & done", wall_ms=1500),
        SMALL,
    )
    assert result.exit_reason is ExitReason.PIDS_EXHAUSTED
    assert 0 < result.usage.pids_peak <= executor.config.pids_limit
    await assert_still_serves(executor, image)


async def test_memory_bomb_is_oom(env):
    executor, image = env
    result = await executor.run_job(
        spec(image, "x=aaaaaaaaaaaaaaaa; while :; do x=$x$x; done"),
        Resources(cpu_milli=1000, memory_bytes=48 * MiB),
    )
    assert result.exit_reason is ExitReason.OOM
    assert result.exit_code == 137
    assert result.usage.memory_peak_bytes <= 48 * MiB
    await assert_still_serves(executor, image)


async def test_disk_filler_is_output_too_large(env):
    executor, image = env
    result = await executor.run_job(
        spec(image, "dd if=/dev/zero of=/out/fill bs=1M count=512", max_output_bytes=4 * MiB),
        SMALL,
    )
    assert result.exit_reason is ExitReason.OUTPUT_TOO_LARGE
    assert result.outputs == ()
    await assert_still_serves(executor, image)


async def test_scratch_filler_meets_enospc(env):
    executor, image = env
    result = await executor.run_job(
        spec(image, "dd if=/dev/zero of=/tmp/fill bs=1M count=512 2>&1 | grep -q 'No space'"),
        Resources(cpu_milli=500, memory_bytes=128 * MiB, disk_bytes=8 * MiB),
    )
    assert result.exit_reason is ExitReason.SUCCESS, result


async def test_scratch_writes_past_memory_are_oom_even_if_the_job_exits_0(env):
    # Without a scratch disk, /tmp is a 64 MiB tmpfs charged to the job's memory: the
    # writer is OOM-killed. The shell goes on and exits 0, which was reported `success`
    # with one OOM kill (issue 17). (With disk_bytes, /tmp is disk: test_executor_scratch.)
    executor, image = env
    result = await executor.run_job(
        spec(image, "dd if=/dev/zero of=/tmp/fill bs=1M count=60; exit 0"),
        Resources(cpu_milli=500, memory_bytes=32 * MiB),
    )
    assert result.exit_reason is ExitReason.OOM, result
    assert result.exit_code == 0
    assert result.usage.oom_kills >= 1
    await assert_still_serves(executor, image)


async def test_network_is_absent_unless_allowed(env):
    executor, image = env
    received = []

    async def handler(stream: trio.SocketStream) -> None:
        received.append(await stream.receive_some())

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        denied = await executor.run_job(
            spec(image, f"ip -o link | grep -qv ' lo:' && exit 9; echo no | nc 127.0.0.1 {port}"),
            SMALL,
        )
        allowed = await executor.run_job(
            spec(image, f"echo yes | nc 127.0.0.1 {port}", network=True), SMALL
        )
        nursery.cancel_scope.cancel()
    assert denied.exit_reason is ExitReason.NONZERO_EXIT
    assert denied.exit_code == 1  # nc: connection refused, not exit 9 (another interface)
    assert allowed.exit_reason is ExitReason.SUCCESS
    assert received == [b"yes\n"]


async def test_unshare_mount_ptrace_are_refused(env):
    executor, image = env
    result = await executor.run_job(
        spec(
            image,
            "escape; rc=$?; unshare -U true || unshare -m true || mount -t tmpfs x /tmp "
            "|| nsenter -t 1 -m true || exit $rc; exit 99",
        ),
        SMALL,
    )
    log = executor.store.read_bytes(result.stdout).decode() if result.stdout else ""
    assert result.exit_reason is ExitReason.SUCCESS, log
    assert "ALLOWED" not in log
    assert log.count("Operation not permitted") >= 8, log


async def test_sigterm_ignorer_is_killed_after_grace(env):
    executor, image = env
    done = trio.Event()
    results = []

    def progress(step: str) -> None:
        if step.startswith("running"):
            executor.preempt("stubborn")

    async def job() -> None:
        results.append(
            await executor.run_job(
                spec(image, "trap '' TERM; while :; do sleep 1; done"),
                SMALL,
                job_id="stubborn",
                checkpoint=Checkpoint(grace_ms=200),
                progress=progress,
            )
        )
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(job)
        await done.wait()
    (result,) = results
    assert result.exit_reason is ExitReason.PREEMPTED
    assert result.exit_code == 137
    assert result.usage.wall_ms >= 200
    await assert_still_serves(executor, image)


async def test_writes_outside_the_output_area_fail(env):
    executor, image = env
    rootfs = executor.rootfs.path(image)
    assert rootfs is not None
    before = sorted(os.listdir(rootfs))
    result = await executor.run_job(
        spec(
            image,
            "for f in /x /etc/passwd /bin/sh /root/x /proc/sys/kernel/hostname /dev/x; do "
            "  (echo pwned > $f) 2>/dev/null && echo $f && exit 1; done; echo fine > /out/ok",
        ),
        SMALL,
    )
    wrote = executor.store.read_bytes(result.stdout) if result.stdout else b""
    assert result.exit_reason is ExitReason.SUCCESS, wrote
    assert [o.path for o in result.outputs] == ["/out/ok"]
    assert sorted(os.listdir(rootfs)) == before
    assert b"pwned" not in (rootfs / "etc" / "passwd").read_bytes()


async def test_symlink_out_of_the_output_area_is_not_followed(env):
    executor, image = env
    result = await executor.run_job(
        spec(image, "ln -s /etc/shadow /out/shadow; ln -s / /out/root; mkfifo /out/fifo"),
        SMALL,
    )
    assert result.exit_reason is ExitReason.SUCCESS
    assert result.outputs == ()
