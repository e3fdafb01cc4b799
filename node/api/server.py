"""The node's local control API: HTTP/1.1 and JSON on 127.0.0.1, for the CLI and tools.

Rules:

- Every request carries ``Authorization: Bearer <token>``; the token is compared in
  constant time and anything else is answered 401 before routing.
- One request per connection (``Connection: close``). A request must arrive whole within
  ``read_timeout_s`` and its body may not exceed ``max_body`` bytes (413). A bad request
  is answered and closed; it never stops the server.
- Errors are ``{"error": {"code": str, "message": str}}`` with the HTTP status. The
  :class:`Controller` raises :class:`ApiError` for the user's mistakes (404 unknown job,
  400 bad request, 409 conflict); any other exception is logged with its traceback and
  answered 500, and the server goes on serving.
- The server parses ``POST /v1/jobs`` into a typed ``JobRequest`` (node/market/request.py,
  the one parser the CLI uses too) and answers 400 naming the first wrong field; the
  controller's ``submit`` receives only valid requests.
- Money is integer micro-credits, time integer milliseconds (``wait`` is seconds).

Routes (all JSON; ``{id}`` is a job id or an unambiguous prefix of one)::

    GET  /v1/node                 {peer_id, addrs: [str], provider: bool, offer: {}|null, version}
    GET  /v1/peers                [{peer_id, score, addrs?}]
    POST /v1/jobs                 body: a job request (below) -> 201, JobView
    GET  /v1/jobs                 [JobView], newest first
    GET  /v1/jobs/{id}            JobView
    GET  /v1/jobs/{id}/events?after=N&wait=S
                                  [{seq, at_ms, state, detail}] with seq > N; when there is none
                                  yet, waits up to S seconds (at most 60) for one, else []
    GET  /v1/jobs/{id}/why        {bid_id, state, offers_seen, ruled_out: {constraint: count},
                                   best_price: int|null, limit: int, explanation: str}
    GET  /v1/jobs/{id}/logs       {stdout: str, stderr: str}
    POST /v1/jobs/{id}/outputs    body {dest: absolute dir on the node's machine}
                                  -> [{path, file, size}], the files written under dest
    POST /v1/jobs/{id}/cancel     JobView
    GET  /v1/market               {offers, bids, classes: [{class, offers, bids,
                                   best_cpu_core_hour: int|null, last_prices: [int]}],
                                   recent_trades: [{at_ms, class, cpu_core_hour, memory_gib_hour}]}
    GET  /v1/ledger               {balance, entries: [{agreement_id, at_ms, payer, payee,
                                   amount, role}]}

Job request (``POST /v1/jobs``; only ``image``, ``command`` and ``max_prices.cpu_core_hour``
are required, unknown fields are refused)::

    image          "sha256:<64 hex>" manifest in the node's store, or an absolute path to an
                   OCI layout directory or archive the node imports
    command        [str], non-empty
    env            {str: str}                      default {}
    cpu_milli      int > 0                         default 1000
    memory_bytes   int > 0                         default 256 MiB
    disk_bytes     int >= 0                        default 0
    gpus           int >= 0                        default 0
    wall_ms        int > 0                         default 3,600,000
    max_prices     {cpu_core_hour, memory_gib_hour, disk_gib_hour, gpu_hour}, micro-credits;
                   the last three default to 0
    arch           str|null                        default null (any)
    regions        [str]                           default [] (any)
    trust          "none"|"tpm"|"sev-snp"          default "none"
    inputs         [{path: "/in/x", file: "/abs/local/file"} | {path, digest, size}]
    preemptible    bool                            default false
    checkpoint_path  str|null (absolute)           default null
    name           str|null                        default null

JobView::

    {id, name, state, detail, created_ms, updated_ms, provider: str|null, attempts,
     price: {cpu_core_hour, ...}|null, max_cost: int|null, cost: int|null,
     exit_reason: str|null, exit_code: int|null, outputs: [{path, digest, size}],
     logs: [{path, digest, size}]}

``state`` is one of ``node.market.buyer.JOB_STATES``. The node publishes where it listens in
``$CX_HOME/api.json`` (``{"url", "token_file"}``) and the token in ``$CX_HOME/api.token``
(mode 0600): :func:`write_api_info`, :func:`read_api_info`.
"""

from __future__ import annotations

import hmac
import http
import json
import logging
import math
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

import h11
import trio

from node.market.request import JobRequest, RequestError, parse_request

if TYPE_CHECKING:
    # libp2p pulls in trio-typing, whose stubs shadow trio's own types for mypy and spell
    # TaskStatus here (as in node/net/memnet.py); the annotation is never evaluated at runtime.
    from trio_typing import TaskStatus

__all__ = [
    "MAX_BODY",
    "MAX_WAIT_S",
    "ApiError",
    "Controller",
    "clear_api_info",
    "new_token",
    "read_api_info",
    "serve_api",
    "write_api_info",
]

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20
MAX_WAIT_S = 60.0
READ_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 100
API_FILE = "api.json"
TOKEN_FILE = "api.token"  # noqa: S105 - a file name, not a secret

Json = dict[str, Any]


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


class Controller(Protocol):
    """What a running node offers the API. Methods return JSON-able values and raise
    :class:`ApiError` for the user's mistakes (404 unknown job, 400, 409)."""

    def node_info(self) -> Json: ...

    def peers(self) -> list[Json]: ...

    async def submit(self, request: JobRequest) -> Json: ...

    def jobs(self) -> list[Json]: ...

    def job(self, job_id: str) -> Json: ...

    async def events(self, job_id: str, after: int, wait_s: float) -> list[Json]: ...

    def why(self, job_id: str) -> Json: ...

    async def logs(self, job_id: str) -> Json: ...

    async def outputs(self, job_id: str, dest: str) -> list[Json]: ...

    async def cancel(self, job_id: str) -> Json: ...

    def market(self) -> Json: ...

    def ledger(self) -> Json: ...


# -- the api.json / api.token convention -------------------------------------------------


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


# -- request validation ------------------------------------------------------------------


def _bad(message: str) -> ApiError:
    return ApiError(400, "bad-request", message)


def _abs_path(value: object, name: str) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value:
        raise _bad(f"{name} must be an absolute path")
    return value


# -- routing -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Call:
    job_id: str
    query: dict[str, str]
    body: bytes


_Handler = Callable[[Controller, _Call], Awaitable[tuple[int, object]]]


def _json_body(call: _Call) -> object:
    try:
        return json.loads(call.body, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, "bad-json", f"the request body is not JSON: {exc}") from None


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not allowed")


def _query_number(call: _Call, name: str, default: float) -> float:
    text = call.query.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise _bad(f"{name} must be a number, not {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise _bad(f"{name} must be a number >= 0")
    return value


async def _node(c: Controller, call: _Call) -> tuple[int, object]:
    return 200, c.node_info()


async def _peers(c: Controller, call: _Call) -> tuple[int, object]:
    return 200, c.peers()


async def _submit(c: Controller, call: _Call) -> tuple[int, object]:
    try:
        request = parse_request(call.body)
    except RequestError as exc:
        raise ApiError(400, exc.code, str(exc)) from None
    return 201, await c.submit(request)


async def _jobs(c: Controller, call: _Call) -> tuple[int, object]:
    return 200, c.jobs()


async def _job(c: Controller, call: _Call) -> tuple[int, object]:
    return 200, c.job(call.job_id)


async def _events(c: Controller, call: _Call) -> tuple[int, object]:
    after = _query_number(call, "after", 0)
    if after != int(after):
        raise _bad("after must be an integer")
    wait_s = min(_query_number(call, "wait", 0), MAX_WAIT_S)
    return 200, await c.events(call.job_id, int(after), wait_s)


async def _why(c: Controller, call: _Call) -> tuple[int, object]:
    return 200, c.why(call.job_id)


async def _logs(c: Controller, call: _Call) -> tuple[int, object]:
    return 200, await c.logs(call.job_id)


async def _outputs(c: Controller, call: _Call) -> tuple[int, object]:
    body = _json_body(call)
    if not isinstance(body, dict) or set(body) != {"dest"}:
        raise _bad('the body must be {"dest": "/absolute/directory"}')
    return 200, await c.outputs(call.job_id, _abs_path(body["dest"], "dest"))


async def _cancel(c: Controller, call: _Call) -> tuple[int, object]:
    return 200, await c.cancel(call.job_id)


async def _market(c: Controller, call: _Call) -> tuple[int, object]:
    return 200, c.market()


async def _ledger(c: Controller, call: _Call) -> tuple[int, object]:
    return 200, c.ledger()


# Path patterns under /v1; "*" is the job id.
_ROUTES: dict[tuple[str, ...], dict[str, _Handler]] = {
    ("node",): {"GET": _node},
    ("peers",): {"GET": _peers},
    ("jobs",): {"GET": _jobs, "POST": _submit},
    ("jobs", "*"): {"GET": _job},
    ("jobs", "*", "events"): {"GET": _events},
    ("jobs", "*", "why"): {"GET": _why},
    ("jobs", "*", "logs"): {"GET": _logs},
    ("jobs", "*", "outputs"): {"POST": _outputs},
    ("jobs", "*", "cancel"): {"POST": _cancel},
    ("market",): {"GET": _market},
    ("ledger",): {"GET": _ledger},
}


def _route(target: str) -> tuple[dict[str, _Handler], str, dict[str, str]]:
    """The methods for ``target``, the job id in it and its query.

    Raises:
        ApiError: 404 for a path that is not a route.
    """
    split = urlsplit(target)
    parts = [unquote(p) for p in split.path.split("/")]
    query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
    if len(parts) >= 3 and parts[0] == "" and parts[1] == "v1":
        rest = parts[2:]
        job_id = rest[1] if len(rest) > 1 and rest[0] == "jobs" else ""
        pattern = tuple("*" if i == 1 and rest[0] == "jobs" else p for i, p in enumerate(rest))
        methods = _ROUTES.get(pattern)
        if methods is not None and (job_id or len(rest) == 1):
            return methods, job_id, query
    raise ApiError(404, "not-found", f"no such route {split.path}; routes live under /v1")


# -- the server ------------------------------------------------------------------------------


class _TooLarge(Exception):
    pass


_PHRASES = frozenset(s.value for s in http.HTTPStatus)


async def serve_api(
    controller: Controller,
    *,
    token: str,
    host: str = "127.0.0.1",
    port: int = 0,
    max_body: int = MAX_BODY,
    read_timeout_s: float = READ_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
    task_status: TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the control API until cancelled; ``nursery.start`` returns the bound port.

    Raises:
        ValueError: ``token`` is empty.
        OSError: the address cannot be bound.
    """
    if not token:
        raise ValueError("the API token must not be empty")
    expected = token.encode()
    limiter = trio.CapacityLimiter(max_connections)

    async def handle(stream: trio.SocketStream) -> None:
        async with limiter:
            try:
                await _connection(stream, controller, expected, max_body, read_timeout_s)
            # The top of a per-connection task: a broken client must not stop the server.
            except Exception:
                log.warning("control API connection failed", exc_info=True)
            finally:
                await trio.aclose_forcefully(stream)

    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    log.info("control API listening on http://%s:%d", host, bound)
    task_status.started(bound)
    await trio.serve_listeners(handle, listeners)


async def _next_event(stream: trio.SocketStream, conn: h11.Connection) -> Any:  # noqa: ANN401
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await stream.receive_some(65536))


async def _read_request(
    stream: trio.SocketStream, conn: h11.Connection, max_body: int
) -> tuple[h11.Request, bytes] | None:
    """The request and its body, or None when the client closed without sending one.

    Raises:
        h11.RemoteProtocolError: malformed HTTP.
        _TooLarge: the body exceeds ``max_body``.
    """
    request = await _next_event(stream, conn)
    if isinstance(request, h11.ConnectionClosed):
        return None
    assert isinstance(request, h11.Request)
    for name, value in request.headers:
        if name == b"content-length" and int(value) > max_body:
            raise _TooLarge
    if conn.they_are_waiting_for_100_continue:  # curl asks before sending a larger body
        await stream.send_all(
            conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b""
        )
    body = bytearray()
    while True:
        event = await _next_event(stream, conn)
        if isinstance(event, h11.EndOfMessage):
            return request, bytes(body)
        if isinstance(event, h11.Data):
            body += event.data
            if len(body) > max_body:
                raise _TooLarge


def _authorized(request: h11.Request, expected: bytes) -> bool:
    for name, value in request.headers:
        if name == b"authorization":
            scheme, _, given = bytes(value).partition(b" ")
            return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), expected)
    return False


async def _connection(
    stream: trio.SocketStream,
    controller: Controller,
    expected: bytes,
    max_body: int,
    read_timeout_s: float,
) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=16384)
    answer = await _answer(stream, conn, controller, expected, max_body, read_timeout_s)
    if answer is not None:
        await _respond(stream, conn, answer, read_timeout_s)


# The status, the JSON body and any extra headers.
_Answer = tuple[int, bytes, list[tuple[str, str]]]


async def _answer(
    stream: trio.SocketStream,
    conn: h11.Connection,
    controller: Controller,
    expected: bytes,
    max_body: int,
    read_timeout_s: float,
) -> _Answer | None:
    """The answer to the one request on ``conn``; None when the client sent none."""
    read: tuple[h11.Request, bytes] | None = None
    with trio.move_on_after(read_timeout_s) as reading:
        try:
            read = await _read_request(stream, conn, max_body)
        except h11.RemoteProtocolError as exc:
            return _error(exc.error_status_hint, "bad-http", str(exc))
        except _TooLarge:
            return _error(413, "too-large", f"the request body exceeds {max_body} bytes")
    if reading.cancelled_caught:
        return _error(408, "timeout", f"the request did not arrive within {read_timeout_s} s")
    if read is None:
        return None
    request, body = read
    if not _authorized(request, expected):
        status, refusal, _ = _error(401, "unauthorized", "a valid bearer token is required")
        return status, refusal, [("www-authenticate", "Bearer")]
    target = request.target.decode("ascii", "replace")
    return await _dispatch(controller, request.method.decode("ascii", "replace"), target, body)


async def _dispatch(controller: Controller, method: str, target: str, body: bytes) -> _Answer:
    try:
        methods, job_id, query = _route(target)
        handler = methods.get(method)
        if handler is None:
            allowed = ", ".join(sorted(methods))
            status, refusal, _ = _error(405, "method-not-allowed", f"use {allowed} here")
            return status, refusal, [("allow", allowed)]
        status, payload = await handler(controller, _Call(job_id=job_id, query=query, body=body))
        data = json.dumps(payload).encode()  # not JSON-able is a bug: answered 500 below
    except ApiError as exc:
        return _error(exc.status, exc.code, exc.message)
    # The top of one request: a controller bug is logged and answered, never fatal.
    except Exception as exc:
        log.exception("control API: %s %s failed", method, target)
        return _error(500, "internal", f"the node failed ({type(exc).__name__}); see its log")
    return status, data, []


def _error(status: int, code: str, message: str) -> _Answer:
    return status, json.dumps({"error": {"code": code, "message": message}}).encode(), []


async def _respond(
    stream: trio.SocketStream,
    conn: h11.Connection,
    answer: _Answer,
    timeout_s: float,
) -> None:
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    status, data, headers = answer
    reason = http.HTTPStatus(status).phrase.encode() if status in _PHRASES else b""
    out = conn.send(
        h11.Response(
            status_code=status,
            reason=reason,
            headers=[
                ("content-type", "application/json"),
                ("content-length", str(len(data))),
                ("connection", "close"),
                *headers,
            ],
        )
    )
    out = (out or b"") + (conn.send(h11.Data(data=data)) or b"")
    out += conn.send(h11.EndOfMessage()) or b""
    with trio.move_on_after(timeout_s):
        try:
            await stream.send_all(out)
            if conn.their_state is not h11.DONE:
                # Unread request bytes would make the kernel reset the connection and the
                # client might lose our answer: shut our side, then drain theirs a while.
                await stream.send_eof()
                with trio.move_on_after(1.0):
                    while await stream.receive_some(65536):
                        pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            log.debug("control API client went away before the answer")
