"""Shared helpers for the executor tests (real containers): an executor over a temp dir,
the busybox image, a static probe binary, and a trivial job that proves the provider still
serves."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from node.exec.executor import Executor, ExecutorConfig
from node.storage.image import Entry, busybox_entries, import_image, write_layout
from protocol.messages import ExitReason, JobSpec, Resources

MiB = 1024 * 1024
SMALL = Resources(cpu_milli=500, memory_bytes=64 * MiB)

ESCAPE_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <unistd.h>

static int escaped = 0;
static void report(const char *what, long rc) {
    printf("%s: %s\n", what, rc == -1 ? strerror(errno) : "ALLOWED");
    if (rc != -1) escaped = 1;
}
int main(void) {
    report("ptrace-attach-1", ptrace(PTRACE_ATTACH, 1, 0, 0));
    report("ptrace-traceme", ptrace(PTRACE_TRACEME, 0, 0, 0));
    report("unshare-user", unshare(CLONE_NEWUSER));
    report("unshare-mount", unshare(CLONE_NEWNS));
    report("unshare-net", unshare(CLONE_NEWNET));
    report("clone-newpid", syscall(SYS_clone, CLONE_NEWPID | 17 /* SIGCHLD */, 0, 0, 0, 0));
    report("mount-tmpfs", mount("x", "/tmp", "tmpfs", 0, 0));
    report("mount-proc", mount("proc", "/proc", "proc", MS_REMOUNT, 0));
    int fd = open("/proc/1/ns/mnt", O_RDONLY);
    report("setns", setns(fd, 0));
    report("keyctl", syscall(SYS_keyctl, 1, 0, 0, 0, 0));
    report("bpf", syscall(SYS_bpf, 0, 0, 0));
    return escaped;
}
"""


def searchable_dir(prefix: str) -> Path:
    """A temp dir the containers' mapped uid can reach (pytest's tmp_path is 0700)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o711)
    return root


def mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve()) + "/"
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(prefix)]


def close_and_remove(executor: Executor, root: Path) -> None:
    """End the executor's helper and check that nothing it mounted outlives it."""
    executor.close()
    assert mounts_under(root) == []
    shutil.rmtree(root)


def make_executor(root: Path, *, runtime: str | None = None) -> Executor:
    return Executor(
        ExecutorConfig(
            store_root=root / "store",
            work_root=root / "work",
            capacity=Resources(cpu_milli=2000, memory_bytes=1024 * MiB, disk_bytes=1024 * MiB),
            pids_limit=32,
            runtime=runtime,
        )
    )


def busybox_image(executor: Executor, root: Path, *, with_escape: bool = False) -> str:
    layers = [busybox_entries()]
    if with_escape:
        src = root / "escape.c"
        src.write_text(ESCAPE_C)
        subprocess.run(["gcc", "-static", "-O1", "-o", str(root / "escape"), str(src)], check=True)
        layers.append([Entry(path="bin/escape", data=(root / "escape").read_bytes())])
    layout = root / ("layout-escape" if with_escape else "layout")
    write_layout(layout, layers)
    digest = import_image(executor.store, layout).manifest
    executor.rootfs.unpack(digest)
    return digest


def spec(image: str, script: str, **kw: object) -> JobSpec:
    kw.setdefault("wall_ms", 20_000)
    return JobSpec(image=image, command=("/bin/sh", "-c", script), **kw)  # type: ignore[arg-type]


async def assert_still_serves(executor: Executor, image: str) -> None:
    result = await executor.run_job(spec(image, "echo ok > /out/ok"), SMALL)
    assert result.exit_reason is ExitReason.SUCCESS, result
    assert [o.path for o in result.outputs] == ["/out/ok"]
    assert executor.free == executor.config.capacity
