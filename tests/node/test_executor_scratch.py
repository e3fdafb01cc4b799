"""A job's disk_bytes is a real scratch disk: on disk not in memory, its size enforced,
metered, and gone after the job."""

from __future__ import annotations

from pathlib import Path

import pytest
from executor_support import (
    MiB,
    busybox_image,
    close_and_remove,
    make_executor,
    searchable_dir,
    spec,
)

from protocol.messages import ExitReason, Resources

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def env():
    root = searchable_dir("cx-scratch-")
    executor = make_executor(root)
    yield executor, busybox_image(executor, root)
    close_and_remove(executor, root)


def _loop_backing_files() -> list[str]:
    return [p.read_text().strip() for p in Path("/sys/block").glob("loop*/loop/backing_file")]


async def test_scratch_is_disk_not_memory_and_is_metered(env):
    executor, image = env
    # 48 MiB written to /tmp by a job limited to 32 MiB of memory: a tmpfs /tmp would be
    # charged to the memory cgroup and the job killed; a scratch disk is not.
    result = await executor.run_job(
        spec(
            image,
            "dd if=/dev/zero of=/tmp/big bs=1M count=48 2>/dev/null && sync && "
            "test $(stat -c %s /tmp/big) = 50331648 && stat -c %a /tmp > /out/mode && "
            "grep ' /tmp ' /proc/mounts | cut -d' ' -f3 > /out/fs",
        ),
        Resources(cpu_milli=500, memory_bytes=32 * MiB, disk_bytes=64 * MiB),
    )
    assert result.exit_reason is ExitReason.SUCCESS, result
    got = {o.path: executor.store.read_bytes(o.digest) for o in result.outputs}
    assert got == {"/out/fs": b"ext4\n", "/out/mode": b"1777\n"}
    assert 48 * MiB <= result.scratch_bytes < 49 * MiB
    image_file = executor.scratch_dir / f"{result.job_id}.img"
    await executor.settled()
    assert not image_file.exists()
    assert not any(result.job_id in f for f in _loop_backing_files())


async def test_scratch_quota_is_enforced_inside_the_job(env):
    executor, image = env
    result = await executor.run_job(
        spec(image, "dd if=/dev/zero of=/tmp/big bs=1M count=16"),
        Resources(cpu_milli=500, memory_bytes=64 * MiB, disk_bytes=4 * MiB),
    )
    assert result.exit_reason is ExitReason.NONZERO_EXIT
    assert result.stderr is not None
    assert b"No space left on device" in executor.store.read_bytes(result.stderr)
    assert result.scratch_bytes <= 4 * MiB


async def test_without_disk_bytes_tmp_stays_a_small_tmpfs(env):
    executor, image = env
    result = await executor.run_job(
        spec(image, "grep ' /tmp ' /proc/mounts | cut -d' ' -f3 > /out/fs"),
        Resources(cpu_milli=500, memory_bytes=64 * MiB),
    )
    assert result.exit_reason is ExitReason.SUCCESS, result
    assert executor.store.read_bytes(result.outputs[0].digest) == b"tmpfs\n"
    assert result.scratch_bytes == 0
