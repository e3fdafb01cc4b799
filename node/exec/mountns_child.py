"""The namespace helper: a small long-lived process that runs commands in a private mount
namespace where the hybrid host's cgroup2 controllers are hidden (PLATFORM.md: crun 1.8
refuses hybrid hosts otherwise). ``node.exec.mountns`` starts and drives it.

Run as a script (``python -I -S mountns_child.py EMPTY_FILE``), so it imports nothing of
this package: it starts in about 40 ms and holds about 10 MB, where importing ``node``
would cost 0.3 s and 30 MB. Rules:
- Set-up, once: ``unshare(CLONE_NEWNS)``, ``/`` recursively slave (mounts made in the host
  under a shared mount, as the jobs directory is, appear here too; nothing made here
  propagates back), and ``EMPTY_FILE`` bound over
  ``/sys/fs/cgroup/unified/cgroup.controllers``.
- Protocol: one JSON object per line each way. It answers ``{"ready": true}`` once set up
  (or ``{"error": "..."}`` and exits 1), then for each request
  ``{"argv": [...], "stdout": path, "stderr": path}`` runs ``argv`` with those files
  (created if missing) as its output and answers ``{"rc": exit status}``.
- It exits at the end of its input (the node closed the pipe, or died): the namespace goes
  with it, and it holds nothing else.
- It is not a subreaper: a container's init, orphaned when the runtime exits, is reaped by
  the node.
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
CONTROLLERS = "/sys/fs/cgroup/unified/cgroup.controllers"

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _call(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, flags: int) -> None:
    src = source.encode() if source is not None else None
    _call(_libc.mount(src, target.encode(), None, ctypes.c_ulong(flags), None), f"mount {target}")


def set_up(empty: str) -> None:
    _call(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", MS_REC | MS_SLAVE)
    _mount(empty, CONTROLLERS, MS_BIND)


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
    try:
        set_up(sys.argv[1])
    except OSError as exc:
        answer({"error": str(exc)})
        return 1
    answer({"ready": True})
    for line in sys.stdin:
        try:
            answer({"rc": run(json.loads(line))})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            answer({"error": f"{type(exc).__name__}: {exc}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
