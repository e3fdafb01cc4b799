"""The node's handle on the namespace helper (``mountns_child.py``): commands that must run
in the private mount namespace of a cgroup v1 hybrid host go to one long-lived helper
process instead of each forking the whole node into a fresh namespace.

Rules:
- It sees the job mounts made under a shared mount (the executor's jobs tmpfs,
  ``jobsdir``), also those made before it started. It starts on first use, or
  :meth:`MountNamespace.start`, and again if it has died. One request at a time (a lock),
  from a worker thread: blocking pipes work in any trio run, and an executor outlives
  several (each pytest-trio test, each ``trio.run`` of a benchmark).
- :meth:`MountNamespace.close` ends it; so does the node's death, or dropping the handle
  (its input closes).
- Failures raise :class:`NamespaceFault` (an OSError) with the helper's own words.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import weakref
from pathlib import Path

__all__ = ["MountNamespace", "NamespaceFault"]

log = logging.getLogger(__name__)

_CHILD = Path(__file__).with_name("mountns_child.py")


class NamespaceFault(OSError):
    """The namespace helper could not start or run a command."""


class MountNamespace:
    """A private mount namespace that hides the cgroup2 controllers behind ``empty`` (an
    empty file)."""

    def __init__(self, empty: Path) -> None:
        self.empty = empty
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None

    @property
    def started(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the helper unless it runs. Blocks: call it from a worker thread.

        Raises:
            NamespaceFault: it could not set up the namespace.
        """
        with self._lock:
            if not self.started:
                self._start()

    def run(self, argv: list[str], stdout: Path, stderr: Path) -> int:
        """Run ``argv`` in the namespace with its output appended to the two files; return
        its exit status. Blocks: call it from a worker thread.

        Raises:
            NamespaceFault: the helper could not start, or died.
        """
        request = json.dumps({"argv": argv, "stdout": str(stdout), "stderr": str(stderr)})
        with self._lock:
            proc = self._proc if self._proc and self.started else self._start()
            reply = self._ask(proc, request)
        rc = reply.get("rc")
        if not isinstance(rc, int):
            raise NamespaceFault(f"namespace helper: {reply.get('error', reply)}")
        return rc

    def close(self) -> None:
        """End the helper; waits for it."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.warning("namespace helper %d did not exit; killing it", proc.pid)
            proc.kill()
            proc.wait()

    def _start(self) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_CHILD), str(self.empty)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline() or "{}")
        if not ready.get("ready"):
            proc.kill()
            proc.wait()
            why = ready.get("error", "it exited")
            raise NamespaceFault(f"cannot set up the private mount namespace: {why}")
        log.info("namespace helper %d: private mount namespace", proc.pid)
        self._proc = proc
        # Dropping the handle closes the helper's input: it exits.
        weakref.finalize(self, proc.stdin.close)  # type: ignore[union-attr]
        return proc

    def _ask(self, proc: subprocess.Popen[str], request: str) -> dict[str, object]:
        assert proc.stdin is not None
        assert proc.stdout is not None
        try:
            proc.stdin.write(request + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except OSError as exc:
            raise NamespaceFault(f"namespace helper died: {exc}") from exc
        if not line:
            raise NamespaceFault(f"namespace helper exited ({proc.wait()})")
        reply: dict[str, object] = json.loads(line)
        return reply
