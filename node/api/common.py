"""What the control API's server and its clients share: the error every refusal becomes,
the limits, and how a running node publishes where its API listens.

The node writes ``$CX_HOME/api.token`` (mode 0600) and ``$CX_HOME/api.json``
(``{"url", "token_file"}``); clients read them. Kept apart from the server so that a client
(every ``cx`` command) never imports the web framework.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

__all__ = [
    "API_FILE",
    "MAX_BODY",
    "MAX_WAIT_S",
    "TOKEN_FILE",
    "ApiError",
    "clear_api_info",
    "new_token",
    "read_api_info",
    "write_api_info",
]

MAX_BODY = 1 << 20  # bytes of a request body
MAX_WAIT_S = 60.0  # the longest an events long-poll waits
API_FILE = "api.json"
TOKEN_FILE = "api.token"  # noqa: S105 - a file name, not a secret


class ApiError(Exception):
    """A request the node refuses: the HTTP status, a machine-readable code, one line for
    the user. Raised by a :class:`Controller`, answered by the server, and raised again by
    the client (node/api/client.py) from the answer."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.code!r}, {self.message!r})"


def new_token() -> str:
    """A fresh bearer token (256 random bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def write_api_info(home: Path, url: str, token: str) -> None:
    """Publish where the API listens: ``home/api.token`` (mode 0600) then ``home/api.json``.

    Both are replaced atomically, the token first, so a reader never sees a URL with a
    stale token. Raises OSError.
    """
    home.mkdir(parents=True, exist_ok=True)
    token_path = home / TOKEN_FILE
    _write_atomic(token_path, token.encode(), 0o600)
    info = {"url": url, "token_file": str(token_path.absolute())}
    _write_atomic(home / API_FILE, json.dumps(info).encode(), 0o644)


def read_api_info(home: Path) -> tuple[str, str]:
    """The ``(url, token)`` a node wrote with :func:`write_api_info`.

    Raises:
        FileNotFoundError: no node has published an API in ``home``.
        ValueError: api.json or the token is malformed.
        OSError: they cannot be read (e.g. PermissionError).
    """
    info = json.loads((home / API_FILE).read_bytes())
    if not isinstance(info, dict) or not isinstance(info.get("url"), str):
        raise ValueError(f"{home / API_FILE} has no url")
    token_file = Path(info.get("token_file") or TOKEN_FILE)
    token = (token_file if token_file.is_absolute() else home / token_file).read_text().strip()
    if not token:
        raise ValueError(f"{token_file} is empty")
    return info["url"], token


def clear_api_info(home: Path) -> None:
    """Withdraw what :func:`write_api_info` published (the node calls it on shutdown)."""
    for name in (API_FILE, TOKEN_FILE):
        (home / name).unlink(missing_ok=True)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have narrowed it; never widened past ``mode``
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)
