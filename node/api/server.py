"""The node's local control API: HTTP and JSON on 127.0.0.1, for the CLI and tools.

FastAPI routes over a :class:`Controller`, served by hypercorn's trio worker in the node's
own event loop. ``/openapi.json`` is the OpenAPI 3 document, generated from the same models
the server validates with (node/market/request.py for the job request, node/api/models.py
for every answer).

Rules:

- Every request carries ``Authorization: Bearer <token>``; the token is compared in
  constant time and anything else is answered 401 before routing (so unknown routes are
  not revealed either). Two exceptions, for the dashboard (node/api/dashboard.py): its
  login page and assets are public, and a browser's dashboard session (a cookie,
  node/api/sessions.py) may make GET requests; ``/dashboard`` without either redirects
  to the login page.
- A request body may not exceed ``max_body`` bytes (413, chunked bodies too). Each read
  from a client must come within ``read_timeout_s``; a client that stops sending is
  disconnected, and it holds no slot another client needs: there is no connection limit
  to starve authenticated clients. One request per connection (``Connection: close``).
- Errors are ``{"error": {"code": str, "message": str}}`` with the HTTP status. The
  :class:`Controller` raises :class:`ApiError` for the user's mistakes (404 unknown job,
  400 bad request, 409 conflict); a request that breaks the schema is 400 naming the
  field; any other exception is logged with its traceback and answered 500, and the
  server goes on serving.
- Every answer is checked against its model before it leaves: a controller that answers
  outside the schema is a 500, never a surprise for the client.
- Money is integer micro-credits, time integer milliseconds (``wait`` is seconds).

Routes (``{id}`` is a job id or an unambiguous prefix of one)::

    GET  /v1/node                 NodeView
    GET  /v1/peers                [PeerView]
    POST /v1/jobs                 body: a JobRequest -> 201, JobView
    GET  /v1/jobs                 [JobView], newest first
    GET  /v1/jobs/{id}            JobView
    GET  /v1/jobs/{id}/events?after=N&wait=S
                                  [EventView] with seq > N; when there is none yet, waits up
                                  to S seconds (at most 60) for one, else []
    GET  /v1/jobs/{id}/why        WhyView
    GET  /v1/jobs/{id}/logs       LogsView
    GET  /v1/jobs/{id}/logs/live?stdout_from=N&stderr_from=M
                                  LiveLogsView: the output since those byte offsets, from
                                  the provider while the job runs
    POST /v1/jobs/{id}/outputs    body {dest: absolute dir on the node's machine}
                                  -> [WrittenView], the files written under dest
    GET  /v1/sold                 [SoldView]: the jobs this node took as provider
    POST /v1/jobs/{id}/cancel     JobView (?waiting_only=true: never stop a running job)
    POST /v1/providers/{peer}/check-score
                                  ScoreCheckView: the benchmark run on that provider, its
                                  stated and measured work score (waits for the job)
    POST /v1/quotas/reload        [QuotaView]: a provider applies config.toml's quotas now
    GET  /v1/offers               [OfferRowView]: every live offer in the book
    GET  /v1/market               MarketView
    GET  /v1/market/trades?since_ms=T
                                  [TradeView]: the tape's prints, oldest first
    GET  /v1/market/history?interval_ms=N&since_ms=T&field=F
                                  HistoryView: OHLC candles of the tape per class
    GET  /v1/ledger               LedgerView
    GET  /metrics                 the Prometheus text format (node/api/scrape.py)
    POST /v1/dashboard/link       DashboardLink: a one-time login link for a browser
    GET  /v1/stream, /dashboard   the dashboard and its live updates (node/api/dashboard.py)
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Annotated, Any, Protocol

import trio
from fastapi import FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from starlette.exceptions import HTTPException

from node.api import models
from node.api.common import MAX_BODY, MAX_WAIT_S, ApiError
from node.api.dashboard import (
    API_PAGE_PATH,
    LOGIN_PATH,
    PAGE_PATH,
    STATIC_PREFIX,
    Live,
    add_dashboard,
    server_port,
)
from node.api.sessions import Sessions
from node.market.request import JobRequest, RequestError, parse_request

if TYPE_CHECKING:
    # libp2p pulls in trio-typing, whose stubs shadow trio's own types for mypy and spell
    # TaskStatus here (as in node/net/memnet.py); the annotation is never evaluated at runtime.
    from trio_typing import TaskStatus

__all__ = ["READ_TIMEOUT_S", "Controller", "build_app", "serve_api"]

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 10.0
_INT_MAX = 2**63 - 1
_WEEK_MS = 7 * 86_400_000
_PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"

Json = dict[str, Any]
_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]


class Controller(Live, Protocol):
    """What a running node offers the API. Methods return JSON-able values in the shapes of
    node/api/models.py and raise :class:`ApiError` for the user's mistakes; the dashboard's
    live stream takes ``snapshot``, ``version`` and ``changed`` (node/api/dashboard.py)."""

    def node_info(self) -> Json: ...

    def peers(self) -> list[Json]: ...

    async def submit(self, request: JobRequest) -> Json: ...

    def jobs(self) -> list[Json]: ...

    def sold(self) -> list[Json]: ...

    def reload_quotas(self) -> list[Json]: ...

    def job(self, job_id: str) -> Json: ...

    async def events(self, job_id: str, after: int, wait_s: float) -> list[Json]: ...

    def why(self, job_id: str) -> Json: ...

    async def logs(self, job_id: str) -> Json: ...

    async def live_logs(self, job_id: str, stdout_from: int, stderr_from: int) -> Json: ...

    async def outputs(self, job_id: str, dest: str) -> list[Json]: ...

    async def cancel(self, job_id: str, *, waiting_only: bool = False) -> Json: ...

    def market(self) -> Json: ...

    def trades(self, since_ms: int) -> list[Json]: ...

    def offers(self) -> list[Json]: ...

    async def check_score(self, provider: str) -> Json: ...

    def history(self, interval_ms: int, since_ms: int, price_field: str) -> Json: ...

    def ledger(self) -> Json: ...

    def metrics(self) -> bytes:
        """The node in the Prometheus text format (node/api/scrape.py)."""
        ...


# -- the application ---------------------------------------------------------------------

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": models.ErrorBody, "description": what}
    for status, what in (
        (400, "a malformed request, or one the node cannot take; the message names why"),
        (401, "no valid bearer token"),
        (404, "no such job"),
        (409, "the job is not in a state that allows this"),
        (413, "the body is larger than the limit"),
    )
}


def build_app(
    controller: Controller,
    *,
    token: str,
    max_body: int = MAX_BODY,
    read_timeout_s: float = READ_TIMEOUT_S,
) -> _Guard:
    """The control API over ``controller`` as an ASGI application; ``read_timeout_s`` is
    the server's (a live stream ends before it).

    Raises:
        ValueError: ``token`` is empty.
    """
    if not token:
        raise ValueError("the API token must not be empty")
    app = FastAPI(
        title="Compute Exchange node",
        version="1",
        description="The control API of one node: jobs, market, ledger and peers.",
        openapi_url="/openapi.json",
        docs_url=None,
        redoc_url=None,
        responses=_ERRORS,
    )
    sessions = Sessions()
    _routes(app, controller)
    add_dashboard(
        app, controller, token=token.encode(), sessions=sessions, stream_s=read_timeout_s * 0.8
    )
    _errors(app)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return _Guard(app, token=token.encode(), max_body=max_body, sessions=sessions)


JobId = Annotated[str, "a job id or an unambiguous prefix of one"]


def _routes(app: FastAPI, c: Controller) -> None:
    @app.get("/v1/node", response_model=models.NodeView)
    async def node() -> Json:
        return c.node_info()

    @app.get("/v1/peers", response_model=list[models.PeerView])
    async def peers() -> list[Json]:
        return c.peers()

    @app.post(
        "/v1/jobs",
        status_code=201,
        response_model=models.JobView,
        response_model_exclude_unset=True,  # an output's url only when it has one
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/JobRequest"}}
                },
            }
        },
    )
    async def submit(request: Request) -> Json:
        # The one parser of job requests (strict JSON, errors naming the field), not
        # FastAPI's: the CLI and the database use it too.
        try:
            job = parse_request(await request.body())
        except RequestError as exc:
            raise ApiError(400, exc.code, str(exc)) from None
        return await c.submit(job)

    @app.get("/v1/jobs", response_model=list[models.JobView], response_model_exclude_unset=True)
    async def jobs() -> list[Json]:
        return c.jobs()

    @app.get("/v1/sold", response_model=list[models.SoldView])
    async def sold() -> list[Json]:
        return c.sold()

    @app.get("/v1/jobs/{job_id}", response_model=models.JobView, response_model_exclude_unset=True)
    async def job(job_id: JobId) -> Json:
        return c.job(job_id)

    @app.get("/v1/jobs/{job_id}/events", response_model=list[models.EventView])
    async def events(
        job_id: JobId,
        after: Annotated[int, Query(ge=0, le=_INT_MAX)] = 0,
        wait: Annotated[float, Query(ge=0, allow_inf_nan=False)] = 0.0,
    ) -> list[Json]:
        return await c.events(job_id, after, min(wait, MAX_WAIT_S))

    @app.get("/v1/jobs/{job_id}/why", response_model=models.WhyView)
    async def why(job_id: JobId) -> Json:
        return c.why(job_id)

    @app.get("/v1/jobs/{job_id}/logs", response_model=models.LogsView)
    async def logs(job_id: JobId) -> Json:
        return await c.logs(job_id)

    @app.get("/v1/jobs/{job_id}/logs/live", response_model=models.LiveLogsView)
    async def live_logs(
        job_id: JobId,
        stdout_from: Annotated[int, Query(ge=0, le=_INT_MAX)] = 0,
        stderr_from: Annotated[int, Query(ge=0, le=_INT_MAX)] = 0,
    ) -> Json:
        return await c.live_logs(job_id, stdout_from, stderr_from)

    @app.post(
        "/v1/jobs/{job_id}/outputs",
        response_model=list[models.WrittenView],
        response_model_exclude_unset=True,
    )
    async def outputs(job_id: JobId, body: models.OutputsRequest) -> list[Json]:
        if not body.dest.startswith("/") or "\x00" in body.dest:
            raise ApiError(400, "bad-request", "dest must be an absolute path")
        return await c.outputs(job_id, body.dest)

    @app.post(
        "/v1/jobs/{job_id}/cancel", response_model=models.JobView, response_model_exclude_unset=True
    )
    async def cancel(job_id: JobId, waiting_only: bool = False) -> Json:
        return await c.cancel(job_id, waiting_only=waiting_only)

    @app.post("/v1/providers/{peer_id}/check-score", response_model=models.ScoreCheckView)
    async def check_score(
        peer_id: Annotated[str, Path(pattern=r"^12D3KooW[1-9A-HJ-NP-Za-km-z]{44}$")],
    ) -> Json:
        return await c.check_score(peer_id)

    @app.post("/v1/quotas/reload", response_model=list[models.QuotaView])
    async def reload_quotas() -> list[Json]:
        return c.reload_quotas()

    @app.get("/v1/offers", response_model=list[models.OfferRowView])
    async def offers() -> list[Json]:
        return c.offers()

    @app.get("/v1/market", response_model=models.MarketView)
    async def market() -> Json:
        return c.market()

    @app.get("/v1/market/trades", response_model=list[models.TradeView])
    async def trades(since_ms: Annotated[int, Query(ge=0, le=_INT_MAX)] = 0) -> list[Json]:
        return c.trades(since_ms)

    @app.get("/v1/market/history", response_model=models.HistoryView)
    async def history(
        interval_ms: Annotated[int, Query(ge=1000, le=_WEEK_MS)] = 60_000,
        since_ms: Annotated[int, Query(ge=0, le=_INT_MAX)] = 0,
        field: models.PriceField = "cpu_core_hour",
    ) -> Json:
        return c.history(interval_ms, since_ms, field)

    @app.get("/v1/ledger", response_model=models.LedgerView)
    async def ledger() -> Json:
        return c.ledger()

    @app.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {
                "content": {_PROMETHEUS: {"schema": {"type": "string"}}},
                "description": "the node's metrics, Prometheus text format 0.0.4",
            }
        },
    )
    async def metrics() -> Response:
        return Response(c.metrics(), media_type=_PROMETHEUS)


def _errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def refused(request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"] if p not in ("query", "path", "body"))
        if first["type"] == "json_invalid":
            return _error(400, "bad-json", f"the request body is not JSON: {first['msg']}")
        return _error(400, "bad-request", f"{where or 'the request'}: {first['msg']}")

    @app.exception_handler(HTTPException)
    async def unrouted(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            answer = _error(405, "method-not-allowed", f"use {allowed} here")
            answer.headers["allow"] = allowed
            return answer
        path = request.url.path
        return _error(404, "not-found", f"no such route {path}; routes live under /v1")

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> JSONResponse:
        # The top of one request: a controller bug is logged and answered, never fatal.
        log.error("control API: %s %s failed", request.method, request.url.path, exc_info=exc)
        return _error(500, "internal", f"the node failed ({type(exc).__name__}); see its log")


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, with the job request's schema (which the submit route reads
    itself) added from its model."""
    if app.openapi_schema is None:
        document = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
        )
        schema = JobRequest.model_json_schema(ref_template="#/components/schemas/{model}")
        components = document.setdefault("components", {}).setdefault("schemas", {})
        components.update(schema.pop("$defs", {}))
        components["JobRequest"] = schema
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        document["security"] = [{"bearer": []}]
        app.openapi_schema = document
    return app.openapi_schema


# -- what happens before routing ------------------------------------------------------------


class _TooLarge(Exception):
    pass


class _Guard:
    """ASGI middleware in front of the routes: the token, the body limit (the body is read
    whole here, so a 413 can always be answered), ``Connection: close``, and a last 500
    for what escapes the application."""

    def __init__(self, app: FastAPI, *, token: bytes, max_body: int, sessions: Sessions) -> None:
        self.app = app
        self.token = token
        self.max_body = max_body
        self.sessions = sessions

    def openapi(self) -> dict[str, Any]:
        return self.app.openapi()

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)  # lifespan
            return
        headers = dict(scope["headers"])
        if not self._admitted(scope, headers):
            if scope["path"] in (PAGE_PATH, API_PAGE_PATH):  # a person at a browser
                await _redirect(send, LOGIN_PATH)
                return
            await _reply(send, 401, "unauthorized", "a valid bearer token is required",
                         [(b"www-authenticate", b"Bearer")])  # fmt: skip
            return
        try:
            body = await self._body(headers, receive)
        except _TooLarge:
            await _reply(send, 413, "too-large", f"the request body exceeds {self.max_body} bytes")
            return
        replayed = False

        async def replay() -> _Message:
            nonlocal replayed
            if replayed:
                return await receive()  # a disconnect, for a long-poll that listens
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        started = False

        async def closing(message: _Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message = {**message, "headers": [*message["headers"], (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, replay, closing)
        except Exception:
            # Starlette answered (the 500 handler logged it) and re-raised for the server.
            if not started:
                log.exception("control API: %s %s failed", scope["method"], scope["path"])
                await _reply(send, 500, "internal", "the node failed; see its log")

    def _admitted(self, scope: _Scope, headers: dict[bytes, bytes]) -> bool:
        """The token; or a dashboard session, for reading; or a page anyone may see."""
        path = scope["path"]
        if _authorized(headers.get(b"authorization", b""), self.token):
            return True
        if path == LOGIN_PATH or path.startswith(STATIC_PREFIX):
            return True
        return scope["method"] in ("GET", "HEAD") and self.sessions.valid(
            headers.get(b"cookie", b""), server_port(scope)
        )

    async def _body(self, headers: dict[bytes, bytes], receive: _Receive) -> bytes:
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            raise _TooLarge
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return bytes(body)  # the client went away
            body += message.get("body", b"")
            if len(body) > self.max_body:
                raise _TooLarge
            if not message.get("more_body", False):
                return bytes(body)


def _authorized(header: bytes, expected: bytes) -> bool:
    scheme, _, given = header.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), expected)


async def _redirect(send: _Send, location: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 303,
            "headers": [
                (b"location", location.encode()),
                (b"content-length", b"0"),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b""})


async def _reply(
    send: _Send,
    status: int,
    code: str,
    message: str,
    extra: tuple[tuple[bytes, bytes], ...] | list[tuple[bytes, bytes]] = (),
) -> None:
    data = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                (b"connection", b"close"),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


# -- serving -------------------------------------------------------------------------------


async def serve_api(
    controller: Controller,
    *,
    token: str,
    host: str = "127.0.0.1",
    port: int = 0,
    max_body: int = MAX_BODY,
    read_timeout_s: float = READ_TIMEOUT_S,
    task_status: TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the control API until cancelled; ``nursery.start`` returns the bound port.

    Raises:
        ValueError: ``token`` is empty.
        OSError: the address cannot be bound.
    """
    app = build_app(controller, token=token, max_body=max_body, read_timeout_s=read_timeout_s)
    config = HypercornConfig()
    config.bind = [f"{host}:{port}"]
    config.read_timeout = read_timeout_s  # type: ignore[assignment]  # a float serves too
    config.keep_alive_timeout = read_timeout_s
    config.accesslog = None
    config.errorlog = log
    config.graceful_timeout = 1.0
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(hypercorn_serve, app, config)
        bound = int(binds[0].rsplit(":", 1)[1])
        log.info("control API listening on %s", binds[0])
        task_status.started(bound)
