"""Servers the tests start as processes: a free loopback port, waiting for the line a
server logs when it is ready (read unbuffered, no polling), and draining its log after, so
a full pipe never stalls it."""

from __future__ import annotations

import contextlib
import http.server
import os
import select
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_log(proc: subprocess.Popen[bytes], text: str, timeout_s: float = 30.0) -> None:
    """Read ``proc``'s stderr until it holds ``text``, then keep draining it."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    deadline = time.monotonic() + timeout_s
    said = b""
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        chunk = os.read(fd, 65536) if ready else b""
        if not chunk:
            break
        said += chunk
        if text.encode() in said:
            threading.Thread(target=_drain, args=(proc,), daemon=True).start()
            return
    raise RuntimeError(f"{proc.args!r} did not start: {said[-2000:].decode(errors='replace')}")


def _drain(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stderr is not None
    while proc.stderr.read(65536):
        pass


@contextlib.contextmanager
def serving_directory(root: Path) -> Iterator[str]:
    """A plain HTTP server for the files under ``root`` on loopback; yields its base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
