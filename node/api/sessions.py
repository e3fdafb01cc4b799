"""How a browser logs in to the dashboard: one-time links and session cookies.

A browser cannot send the bearer token on its own, so it logs in once and then carries a
session cookie. Rules:

- A session comes from the token itself (the login page's form) or from a one-time link
  that ``cx dashboard`` asks the node for with the token: the link's code is good once,
  for :data:`LINK_TTL_S`, so a link left in a shell history or a screen share is spent.
- A session is a random id the node keeps in memory for :data:`SESSION_TTL_S`; a restart
  of the node ends every session. The cookie is ``HttpOnly`` and ``SameSite=Strict`` and
  named after the node's port (two nodes on one host keep apart: cookies ignore ports).
- A session may only read (GET): the dashboard never submits, cancels or writes, so a page
  on another site that makes the browser post to the node has nothing to act with.
- Expired entries are dropped whenever a new one is made, and at most :data:`MAX_PENDING`
  links and :data:`MAX_SESSIONS` sessions are held (the oldest go first).
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from http.cookies import CookieError, SimpleCookie

import trio

__all__ = ["LINK_TTL_S", "SESSION_TTL_S", "Sessions", "cookie_name"]

LINK_TTL_S = 120.0
SESSION_TTL_S = 12 * 3600.0
MAX_PENDING = 64
MAX_SESSIONS = 256


def cookie_name(port: int) -> str:
    return f"cx_session_{port}"


class Sessions:
    """One node's dashboard sessions and pending one-time links (``now`` in seconds)."""

    def __init__(self, now: Callable[[], float] = trio.current_time) -> None:
        self._now = now
        self._links: dict[str, float] = {}  # code -> expiry
        self._sessions: dict[str, float] = {}  # session id -> expiry

    def link_code(self) -> str:
        """A fresh one-time login code."""
        return self._add(self._links, LINK_TTL_S, MAX_PENDING)

    def redeem(self, code: str) -> str | None:
        """A new session for a valid, unspent code (which is spent now); else None."""
        expiry = self._links.pop(code, None)
        if expiry is None or expiry <= self._now():
            return None
        return self.open()

    def open(self) -> str:
        """A new session id (after the token was checked)."""
        return self._add(self._sessions, SESSION_TTL_S, MAX_SESSIONS)

    def valid(self, cookie_header: bytes, port: int) -> bool:
        """Whether a request's ``Cookie`` header carries a live session of this node."""
        try:
            cookie = SimpleCookie(cookie_header.decode("latin-1"))
        except CookieError:
            return False
        morsel = cookie.get(cookie_name(port))
        if morsel is None:
            return False
        now = self._now()
        return any(
            hmac.compare_digest(sid, morsel.value) and expiry > now
            for sid, expiry in self._sessions.items()
        )

    def _add(self, table: dict[str, float], ttl_s: float, cap: int) -> str:
        now = self._now()
        for key in [k for k, expiry in table.items() if expiry <= now]:
            del table[key]
        while len(table) >= cap:
            del table[next(iter(table))]  # the oldest
        key = secrets.token_urlsafe(32)
        table[key] = now + ttl_s
        return key
