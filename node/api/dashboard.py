"""The dashboard's routes: the page, its login, its assets and its live stream.

::

    GET  /dashboard                 the page (a session or the token; else to the login)
    GET  /dashboard/api             the control API's interactive page, from /openapi.json
    GET  /dashboard/login[?code=C]  the login page; with a one-time code, a session
    POST /dashboard/login           form field ``token``: a session
    GET  /dashboard/static/NAME     the page's script and style (public: no data in them)
    POST /v1/dashboard/link         {"url", "expires_s"}: a one-time login link (token only)
    GET  /v1/stream                 server-sent events: a snapshot (node/api/snapshot.py)
                                    now, after every change and every 2 s while jobs run
                                    here; ``bye`` before it ends

Every asset ships in the package (node/api/static/): the page works with no internet.
How a browser logs in is node/api/sessions.py's docstring.
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import AsyncIterator
from importlib.resources import files
from typing import Any, Protocol
from urllib.parse import parse_qs

import trio
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

from node.api import models
from node.api.sessions import LINK_TTL_S, SESSION_TTL_S, Sessions, cookie_name

__all__ = [
    "API_PAGE_PATH",
    "LOGIN_PATH",
    "PAGE_PATH",
    "STATIC_PREFIX",
    "Live",
    "add_dashboard",
    "server_port",
]

PAGE_PATH = "/dashboard"
API_PAGE_PATH = "/dashboard/api"  # the control API's interactive page
LOGIN_PATH = "/dashboard/login"
STATIC_PREFIX = "/dashboard/static/"
HEARTBEAT_S = 15.0  # the longest a stream waits for a change before it looks at the clock
TICK_S = 2.0  # how often a stream resends while jobs run here (their measured use moves)
_ASSETS = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "dom.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
_SECURITY = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


class Live(Protocol):
    """What the live stream needs of a node (node/api/server.py's Controller has it)."""

    def snapshot(self) -> dict[str, Any]: ...

    def version(self) -> int:
        """A number that grows whenever something the snapshot shows changes."""
        ...

    async def changed(self) -> None:
        """Return at the next change."""
        ...

    def ticking(self) -> bool:
        """Whether the snapshot changes with no event: a provider's running jobs use more
        CPU time by the second. The stream then sends one every :data:`TICK_S`."""
        ...


def _static(name: str) -> str:
    return files("node.api").joinpath("static", name).read_text(encoding="utf-8")


def add_dashboard(
    app: FastAPI, live: Live, *, token: bytes, sessions: Sessions, stream_s: float
) -> None:
    """Add the dashboard's routes to ``app``; a live stream lasts ``stream_s`` seconds,
    less than the server's read timeout (see :func:`_events`)."""

    @app.get(PAGE_PATH, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(_static("dashboard.html"), headers=_SECURITY)

    @app.get(API_PAGE_PATH, include_in_schema=False)
    async def api_page() -> HTMLResponse:
        return HTMLResponse(_static("api.html"), headers=_SECURITY)

    @app.get(LOGIN_PATH, include_in_schema=False)
    async def login_page(request: Request, code: str = "") -> Response:
        if not code:
            return _login_form("")
        session = sessions.redeem(code)
        if session is None:
            why = "This link was used already or has expired. Run `cx dashboard` again."
            return _login_form(why, status=401)
        return _logged_in(request, session)

    @app.post(LOGIN_PATH, include_in_schema=False)
    async def login(request: Request) -> Response:
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        given = form.get("token", [""])[0].strip().encode()
        if not given or not hmac.compare_digest(given, token):
            why = "That is not this node's token (it is in the api.token file of its home)."
            return _login_form(why, status=401)
        return _logged_in(request, sessions.open())

    @app.get(STATIC_PREFIX + "{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        kind = _ASSETS.get(name)
        if kind is None:
            return Response("no such file\n", status_code=404, media_type="text/plain")
        return Response(_static(name), media_type=kind, headers=_SECURITY)

    @app.post("/v1/dashboard/link", response_model=models.DashboardLink)
    async def link(request: Request) -> dict[str, Any]:
        # The address the server is bound to, not the request's Host header (which a
        # client chooses).
        host, port = request.scope["server"]
        code = sessions.link_code()
        return {"url": f"http://{host}:{port}{LOGIN_PATH}?code={code}", "expires_s": LINK_TTL_S}

    @app.get("/v1/stream", include_in_schema=False)
    async def stream() -> StreamingResponse:
        return StreamingResponse(
            _events(live, stream_s),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )


async def _events(live: Live, stream_s: float) -> AsyncIterator[str]:
    """Snapshots for ``stream_s`` seconds, then ``event: bye`` and the end: the server
    disconnects a client that has sent nothing for its read timeout, even mid-answer, so
    the stream ends first and the browser reconnects at once (``retry``), taking a fresh
    snapshot. Nothing is missed: the version says whether anything changed meanwhile."""
    yield "retry: 250\n\n"
    end = trio.current_time() + stream_s
    while trio.current_time() < end:
        seen = live.version()
        yield f"data: {json.dumps(live.snapshot(), separators=(',', ':'))}\n\n"
        wait_s = TICK_S if live.ticking() else HEARTBEAT_S
        while live.version() == seen and trio.current_time() < end:
            with trio.move_on_at(min(end, trio.current_time() + wait_s)) as waited:
                await live.changed()
            if waited.cancelled_caught and wait_s == TICK_S:
                break  # time for a fresh measurement
    yield "event: bye\ndata: {}\n\n"


def _login_form(error: str, *, status: int = 200) -> HTMLResponse:
    html = _static("login.html").replace("<!--error-->", _escape(error))
    return HTMLResponse(html, status_code=status, headers=_SECURITY)


def _logged_in(request: Request, session: str) -> Response:
    answer = RedirectResponse(PAGE_PATH, status_code=303)
    answer.set_cookie(
        cookie_name(server_port(request.scope)),
        session,
        max_age=math.floor(SESSION_TTL_S),
        httponly=True,
        samesite="strict",
        path="/",
    )
    return answer


def server_port(scope: Any) -> int:  # noqa: ANN401 - an ASGI scope
    """The port this request came in on (the session cookie's name carries it)."""
    server = scope.get("server") or ("", 0)
    return int(server[1] or 0)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
