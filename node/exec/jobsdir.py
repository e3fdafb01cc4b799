"""The jobs directory: one tmpfs under the work root, where every job's area lives.

Rules:
- A job's area (config.json, pid file, the overlay's upper and work directories, the
  mount points of its tmpfs areas) is small and lives only as long as the job. On the
  disk (ext4 with discard) removing one took about 2 ms and unmounting its overlay about
  0.9 ms; on a tmpfs both take a tenth of that.
- The tmpfs is a shared mount (mount propagation), so a private mount namespace made from
  it later (``mountns``) sees the job mounts the node makes afterwards.
- Several executors may use one work root (a node and a ``cx exec`` beside it). Each holds
  a shared flock on ``jobs.users.lock`` while open; the first one mounts the tmpfs (source
  ``cx-jobs``), the last one to close unmounts it if no job mount is left under it, and
  ``jobs.setup.lock`` keeps the two apart. A process that dies drops its lock; the tmpfs
  it leaves, with the areas of its jobs, is taken over by the next executor, whose
  ``recover`` cleans them up.
- Anything else mounted at that path is the operator's: used as it is (made shared),
  never unmounted.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from node.exec import mounts

__all__ = ["JobsDir"]

log = logging.getLogger(__name__)

SOURCE = "cx-jobs"
# Only areas' small files live here (outputs, logs and scratch have tmpfs mounts of their
# own); the cap keeps a runaway from eating the host's memory.
_SIZE = 256 * 1024 * 1024


class JobsDir:
    """``path`` as a shared tmpfs for as long as this object is open."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._users: int | None = None

    def open(self) -> None:
        """Mount the tmpfs unless it (or the operator's own mount) is there; make it shared."""
        self.path.mkdir(parents=True, exist_ok=True)
        users = os.open(self.path.with_name("jobs.users.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        with self._setup():
            if _mounted(self.path) is None:
                mounts.mount_tmpfs(
                    self.path, size_bytes=_SIZE, uid=0, gid=0, mode=0o711, source=SOURCE
                )
            mounts.make_shared(self.path)
            fcntl.flock(users, fcntl.LOCK_SH)
        self._users = users

    def close(self) -> None:
        """Let go; the last executor out unmounts the tmpfs if no job mount is under it."""
        users, self._users = self._users, None
        if users is None:
            return
        try:
            with self._setup():
                try:
                    fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return  # another executor still uses it
                busy = any(p.startswith(f"{self.path}/") for p in mounts.mount_points())
                if _mounted(self.path) == SOURCE and not busy:
                    mounts.unmount(self.path)
        finally:
            os.close(users)

    @contextlib.contextmanager
    def _setup(self) -> Iterator[None]:
        fd = os.open(self.path.with_name("jobs.setup.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _mounted(path: Path) -> str | None:
    """The source of the topmost mount at ``path``, or None if it is not a mount point."""
    found = None
    for point, source in mounts.mount_sources():
        if point == str(path):
            found = source
    return found
