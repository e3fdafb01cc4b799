"""Clean up after jobs off the critical path: a job's result is ready once its usage is
read and its outputs are stored; deleting its container, cgroup and areas comes after.

Rules:
- The work is plain blocking calls (the runtime's ``delete``, rmdir, umount, rmtree), done
  by one worker thread in the order submitted: cleanups never compete with each other and
  never block the event loop, and the thread works for whichever trio run submitted.
- A failing cleanup is logged with its traceback and the next one still runs; nothing
  raises to the caller. Whatever a dead process left undone, the executor's ``recover``
  finds at the next start.
- :meth:`Janitor.drain` blocks until everything submitted so far is done (before the
  namespace helper stops, when a job id comes back, in tests).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

__all__ = ["Janitor"]

log = logging.getLogger(__name__)


class Janitor:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[str, Callable[[], None]]] = queue.SimpleQueue()
        self._done = threading.Condition()
        self._submitted = self._finished = 0
        self._thread: threading.Thread | None = None

    def submit(self, what: str, cleanup: Callable[[], None]) -> None:
        """Run ``cleanup`` soon, after everything submitted before it."""
        with self._done:
            self._submitted += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="cx-janitor", daemon=True)
                self._thread.start()
        self._queue.put((what, cleanup))

    def drain(self) -> None:
        """Block until every cleanup submitted so far has run."""
        with self._done:
            target = self._submitted
            self._done.wait_for(lambda: self._finished >= target)

    def _work(self) -> None:
        while True:
            what, cleanup = self._queue.get()
            try:
                cleanup()
            except Exception:  # top of one cleanup: log it, go on with the next
                log.exception("cleaning up after %s failed", what)
            with self._done:
                self._finished += 1
                self._done.notify_all()
