"""The namespace helper: a small long-lived process that runs commands in a private mount
namespace where the hybrid host's cgroup2 controllers are hidden (PLATFORM.md: crun 1.8
refuses hybrid hosts otherwise). ``node.exec.mountns`` starts and drives it.

Run as a script (``python -I -S mountns_child.py JOBS_DIR EMPTY_FILE``), so it imports
nothing of this package: it starts in about 40 ms and holds about 10 MB, where importing
``node`` would cost 0.3 s and 30 MB. Rules:
- Set-up, once, while still in the host's mount namespace: ``JOBS_DIR`` becomes a shared
  mount (bound onto itself if it is not a mount point), so the job mounts the node makes
  there afterwards propagate into the private namespace; then ``unshare(CLONE_NEWNS)``,
  ``/`` recursively slave (nothing made here propagates back to the host), and
  ``EMPTY_FILE`` bound over ``/sys/fs/cgroup/unified/cgroup.controllers``.
- Protocol: one JSON object per line each way. It answers ``{"ready": true}`` once set up
  (or ``{"error": "..."}`` and exits 1), then for each request
  ``{"argv": [...], "stdout": path, "stderr": path}`` runs ``argv`` with those files
  (created if missing) as its output and answers ``{"rc": exit status}``.
- On end of input (the node closed the pipe or died) it goes back to the host namespace
  and removes the bind, unless job mounts are still under it (a node that died with jobs
  running, or another executor on the same directory: the next helper reuses the bind
  and removes it later), and exits. A mount at ``JOBS_DIR`` of another filesystem than its
  parent directory's is the operator's own, never removed.
- It is single-threaded (``setns`` of a mount namespace needs that) and never a subreaper:
  a container's init, orphaned when the runtime exits, is reaped by the node.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys

CLONE_NEWNS = 0x00020000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SLAVE = 1 << 19
MS_SHARED = 1 << 20
MNT_DETACH = 0x2
CONTROLLERS = "/sys/fs/cgroup/unified/cgroup.controllers"

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _call(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, flags: int) -> None:
    src = source.encode() if source is not None else None
    _call(_libc.mount(src, target.encode(), None, ctypes.c_ulong(flags), None), f"mount {target}")


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f]


def _is_own_bind(jobs_dir: str) -> bool:
    """A bind of the directory's own filesystem (ours), not another one mounted there."""
    return os.stat(jobs_dir).st_dev == os.stat(os.path.dirname(jobs_dir)).st_dev


def set_up(jobs_dir: str, empty: str) -> tuple[int, bool]:
    """Enter the private namespace; return (host namespace fd, whether the bind at
    jobs_dir is ours to remove)."""
    host = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    if jobs_dir not in _mount_points():
        _mount(jobs_dir, jobs_dir, MS_BIND | MS_REC)
    ours = _is_own_bind(jobs_dir)
    _mount(None, jobs_dir, MS_SHARED)
    _call(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", MS_REC | MS_SLAVE)
    _mount(empty, CONTROLLERS, MS_BIND)
    return host, ours


def tear_down(host: int, jobs_dir: str, ours: bool) -> None:
    _call(_libc.setns(host, CLONE_NEWNS), "setns(host)")
    busy = any(p.startswith(jobs_dir + "/") for p in _mount_points())
    if ours and not busy:
        _call(_libc.umount2(jobs_dir.encode(), MNT_DETACH), f"umount {jobs_dir}")


def run(request: dict[str, object]) -> int:
    argv = [str(a) for a in request["argv"]]  # type: ignore[attr-defined]
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
    out = os.open(str(request["stdout"]), flags, 0o644)
    err = os.open(str(request["stderr"]), flags, 0o644)
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, check=False)
    finally:
        os.close(out)
        os.close(err)
    return done.returncode


def answer(reply: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()


def main() -> int:
    jobs_dir, empty = sys.argv[1], sys.argv[2]
    try:
        host, ours = set_up(jobs_dir, empty)
    except OSError as exc:
        answer({"error": str(exc)})
        return 1
    answer({"ready": True})
    try:
        for line in sys.stdin:
            try:
                answer({"rc": run(json.loads(line))})
            except (OSError, ValueError, KeyError, TypeError) as exc:
                answer({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        tear_down(host, jobs_dir, ours)
    return 0


if __name__ == "__main__":
    sys.exit(main())
