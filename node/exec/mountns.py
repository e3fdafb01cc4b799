"""The node's handle on the namespace helpers (``mountns_child.py``): commands that must run
in the private mount namespace of a cgroup v1 hybrid host go to long-lived helper
processes instead of each forking the whole node into a fresh namespace.

Rules:
- A helper sees the job mounts made under a shared mount (the executor's jobs tmpfs,
  ``jobsdir``), also those made before it started; so any helper will do for any job.
- Each helper runs one command at a time; concurrent jobs get helpers of their own, up to
  ``most`` (then they wait for one). Helpers start on first use (about 40 ms each), or
  :meth:`MountNamespace.start`, and a dead one is replaced. Calls come from worker threads:
  blocking pipes work in any trio run, and an executor outlives several (each pytest-trio
  test, each ``trio.run`` of a benchmark).
- :meth:`MountNamespace.close` ends them; so does the node's death, or dropping the
  handle (their input closes).
- Failures raise :class:`NamespaceFault` (an OSError) with the helper's own words.
"""

from __future__ import annotations

import json
import logging
import os
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


class _Helper:
    """One helper process and its pipes."""

    def __init__(self, empty: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_CHILD), str(empty)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        ready = self._reply()
        if not ready.get("ready"):
            self.kill()
            why = ready.get("error", "it exited")
            raise NamespaceFault(f"cannot set up the private mount namespace: {why}")
        log.info("namespace helper %d: private mount namespace", self.proc.pid)
        # Dropping the handle closes the helper's input: it exits.
        weakref.finalize(self, self.proc.stdin.close)  # type: ignore[union-attr]

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def ask(self, request: str) -> dict[str, object]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(request + "\n")
            self.proc.stdin.flush()
        except OSError as exc:
            raise NamespaceFault(f"namespace helper died: {exc}") from exc
        return self._reply()

    def _reply(self) -> dict[str, object]:
        assert self.proc.stdout is not None
        try:
            line = self.proc.stdout.readline()
        except OSError as exc:
            raise NamespaceFault(f"namespace helper died: {exc}") from exc
        if not line:
            raise NamespaceFault(f"namespace helper exited ({self.proc.wait()})")
        reply: dict[str, object] = json.loads(line)
        return reply

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.warning("namespace helper %d did not exit; killing it", self.proc.pid)
            self.kill()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


class MountNamespace:
    """Private mount namespaces that hide the cgroup2 controllers behind ``empty`` (an
    empty file), one helper process each."""

    def __init__(self, empty: Path, *, most: int = os.cpu_count() or 2) -> None:
        self.empty = empty
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(most)
        self._idle: list[_Helper] = []

    @property
    def started(self) -> bool:
        with self._lock:
            return any(h.alive for h in self._idle)

    def start(self) -> None:
        """Have a helper ready. Blocks: call it from a worker thread.

        Raises:
            NamespaceFault: it could not set up the namespace.
        """
        with self._slots:
            self._give(self._take())

    def run(self, argv: list[str], stdout: Path, stderr: Path) -> int:
        """Run ``argv`` in the namespace with its output appended to the two files; return
        its exit status. Blocks: call it from a worker thread.

        Raises:
            NamespaceFault: no helper could start, or it died.
        """
        request = json.dumps({"argv": argv, "stdout": str(stdout), "stderr": str(stderr)})
        with self._slots:
            helper = self._take()
            try:
                reply = helper.ask(request)
            finally:
                self._give(helper)
        rc = reply.get("rc")
        if not isinstance(rc, int):
            raise NamespaceFault(f"namespace helper: {reply.get('error', reply)}")
        return rc

    def close(self) -> None:
        """End the idle helpers (all of them, once no command is running); waits for them."""
        with self._lock:
            helpers, self._idle = self._idle, []
        for helper in helpers:
            helper.close()

    def _take(self) -> _Helper:
        with self._lock:
            while self._idle:
                helper = self._idle.pop()
                if helper.alive:
                    return helper
        return _Helper(self.empty)

    def _give(self, helper: _Helper) -> None:
        if helper.alive:
            with self._lock:
                self._idle.append(helper)
