"""A synchronous client of the node's control API (node/api/server.py), for the CLI and scripts.

One method per route; each returns the decoded JSON answer. Errors::

    ApiError (node/api/common.py)    the node answered and refused: status, code, message
    ClientError               we could not get an answer
    ├── NodeNotRunning        no node publishes an API in the home, or nothing listens
    └── BadResponse           something answered, but not as the API does

The standard library's http.client is enough: the CLI is synchronous, one request per
connection, on loopback.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from node.api.common import ApiError, read_api_info
from node.market.request import JobRequest

__all__ = ["ApiClient", "BadResponse", "ClientError", "NodeNotRunning"]

Json = dict[str, Any]

# How much longer than a long-poll's own wait the socket waits for its answer.
_POLL_MARGIN_S = 15.0
# A live stream sends at least every 15 s (node/api/dashboard.py): silence past this is a
# dead node.
_STREAM_IDLE_S = 45.0


class ClientError(Exception):
    """No usable answer from the node; the message says what to do."""


class NodeNotRunning(ClientError):
    """No node is serving the API for this home."""


class BadResponse(ClientError):
    """Something answered that does not speak the control API."""


class ApiClient:
    """Calls the control API at ``base_url`` (``http://127.0.0.1:PORT``) with ``token``."""

    def __init__(
        self, base_url: str, token: str, *, timeout_s: float = 60.0, home: Path | None = None
    ) -> None:
        split = urlsplit(base_url)
        if split.scheme != "http" or not split.hostname or split.port is None:
            raise ValueError(f"{base_url!r} is not a URL like http://127.0.0.1:PORT")
        self.base_url = base_url
        self._host = split.hostname
        self._port = split.port
        self._token = token
        self._timeout_s = timeout_s
        self._home = home

    @classmethod
    def from_home(cls, home: Path, *, timeout_s: float = 60.0) -> ApiClient:
        """The client for the node whose state is in ``home`` (its api.json and api.token).

        Raises:
            NodeNotRunning: the node has not published an API there.
            ClientError: the files are there but unreadable.
        """
        try:
            url, token = read_api_info(home)
        except FileNotFoundError:
            raise NodeNotRunning(_not_running(home)) from None
        except PermissionError as exc:
            raise ClientError(
                f"cannot read {exc.filename}: permission denied; run as the node's user"
            ) from None
        except (OSError, ValueError) as exc:
            raise ClientError(
                f"the API files in {home} are unusable ({exc}); restart the node with `cx node`"
            ) from None
        try:
            return cls(url, token, timeout_s=timeout_s, home=home)
        except ValueError as exc:
            raise ClientError(f"{home / 'api.json'}: {exc}; restart the node") from None

    # -- routes ---------------------------------------------------------------------------

    def node_info(self) -> Json:
        return self._object("GET", "/v1/node")

    def peers(self) -> list[Json]:
        return self._list("GET", "/v1/peers")

    def submit(self, request: JobRequest) -> Json:
        """Submit a job; returns its JobView."""
        return self._object("POST", "/v1/jobs", request.wire_json())

    def jobs(self) -> list[Json]:
        return self._list("GET", "/v1/jobs")

    def sold(self) -> list[Json]:
        return self._list("GET", "/v1/sold")

    def job(self, job_id: str) -> Json:
        return self._object("GET", _job(job_id))

    def events(self, job_id: str, after: int = 0, wait_s: float = 0.0) -> list[Json]:
        """Events with ``seq > after``; waits up to ``wait_s`` (at most 60) for the next."""
        query = urlencode({"after": after, "wait": wait_s})
        return self._list(
            "GET", f"{_job(job_id)}/events?{query}", timeout_s=wait_s + _POLL_MARGIN_S
        )

    def live_logs(self, job_id: str, stdout_from: int = 0, stderr_from: int = 0) -> Json:
        query = urlencode({"stdout_from": stdout_from, "stderr_from": stderr_from})
        return self._object("GET", f"{_job(job_id)}/logs/live?{query}")

    def why(self, job_id: str) -> Json:
        return self._object("GET", f"{_job(job_id)}/why")

    def logs(self, job_id: str) -> Json:
        return self._object("GET", f"{_job(job_id)}/logs")

    def outputs(self, job_id: str, dest: str | Path) -> list[Json]:
        """Have the node write the job's outputs under ``dest`` (made absolute here)."""
        return self._list("POST", f"{_job(job_id)}/outputs", {"dest": str(Path(dest).absolute())})

    def cancel(self, job_id: str, *, waiting_only: bool = False) -> Json:
        """Withdraw a waiting job, or stop a running one unless ``waiting_only``."""
        query = "?waiting_only=true" if waiting_only else ""
        return self._object("POST", f"{_job(job_id)}/cancel{query}")

    def market(self) -> Json:
        return self._object("GET", "/v1/market")

    def check_score(self, peer_id: str) -> Json:
        """Run the benchmark on that provider and judge its stated work score (waits)."""
        return self._object("POST", f"/v1/providers/{peer_id}/check-score")

    def reload_quotas(self) -> list[Json]:
        """Have a provider apply its config.toml's quotas now; each group with its use."""
        return self._list("POST", "/v1/quotas/reload")

    def offers(self) -> list[Json]:
        return self._list("GET", "/v1/offers")

    def trades(self, since_ms: int = 0) -> list[Json]:
        return self._list("GET", f"/v1/market/trades?since_ms={since_ms}")

    def history(self, *, interval_ms: int, since_ms: int = 0, field: str = "cpu_core_hour") -> Json:
        query = urlencode({"interval_ms": interval_ms, "since_ms": since_ms, "field": field})
        return self._object("GET", f"/v1/market/history?{query}")

    def ledger(self) -> Json:
        return self._object("GET", "/v1/ledger")

    def dashboard_link(self) -> Json:
        return self._object("POST", "/v1/dashboard/link")

    def stream(self) -> Iterator[Json]:
        """The dashboard's snapshots (GET /v1/stream), one whenever the node changes, for
        ever: the node ends each stream after a while and this opens the next.

        Raises ApiError, NodeNotRunning, ClientError as :meth:`call` does.
        """
        while True:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=_STREAM_IDLE_S)
            try:
                try:
                    conn.request("GET", "/v1/stream", headers=self._headers())
                    response = conn.getresponse()
                    if response.status != 200:
                        self._answer(response.status, response.read())
                    named = False  # the message has an event name: not a snapshot
                    while line := response.readline():
                        if line.startswith(b"event:"):
                            named = True
                        elif line.startswith(b"data: ") and not named:
                            yield json.loads(line[len(b"data: ") :])
                        elif line in (b"\n", b"\r\n"):
                            named = False
                except ConnectionRefusedError:
                    raise NodeNotRunning(_not_running(self._home, self.base_url)) from None
                except (OSError, http.client.HTTPException, ValueError) as exc:
                    raise ClientError(
                        f"the node at {self.base_url} broke off its live stream ({exc}); "
                        "check that `cx node` is still running"
                    ) from None
            finally:
                conn.close()

    # -- transport -------------------------------------------------------------------------

    def _object(self, method: str, path: str, body: Json | str | None = None) -> Json:
        answer = self.call(method, path, body)
        if not isinstance(answer, dict):
            raise BadResponse(f"{method} {path}: expected a JSON object from the node")
        return answer

    def _list(
        self, method: str, path: str, body: Json | None = None, *, timeout_s: float | None = None
    ) -> list[Json]:
        answer = self.call(method, path, body, timeout_s=timeout_s)
        if not isinstance(answer, list):
            raise BadResponse(f"{method} {path}: expected a JSON list from the node")
        return answer

    def call(
        self,
        method: str,
        path: str,
        body: Json | str | None = None,
        *,
        timeout_s: float | None = None,
    ) -> Any:  # noqa: ANN401 - whatever JSON the route returns
        """One request; the decoded JSON answer.

        Raises:
            ApiError: the node answered with an error.
            NodeNotRunning: nothing listens at the URL.
            ClientError: no answer (timeout, reset) or not the API's.
        """
        headers = self._headers()
        data = None
        if body is not None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            headers["Content-Type"] = "application/json"
        conn = http.client.HTTPConnection(
            self._host, self._port, timeout=self._timeout_s if timeout_s is None else timeout_s
        )
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            status, raw = response.status, response.read()
        except ConnectionRefusedError:
            raise NodeNotRunning(_not_running(self._home, self.base_url)) from None
        except (OSError, http.client.HTTPException) as exc:
            raise ClientError(
                f"the node at {self.base_url} did not answer {method} {path} ({exc}); "
                "check that `cx node` is still running"
            ) from None
        finally:
            conn.close()
        return self._answer(status, raw)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}

    def _answer(self, status: int, raw: bytes) -> Any:  # noqa: ANN401 - the route's JSON
        """The decoded answer; raises ApiError for an error answer, BadResponse."""
        try:
            answer = json.loads(raw)
        except ValueError:
            raise BadResponse(
                f"{self.base_url} answered {status} without JSON; is it a cx node?"
            ) from None
        if status >= 400:
            error = answer.get("error") if isinstance(answer, dict) else None
            if not isinstance(error, dict):
                raise BadResponse(f"{self.base_url} answered {status} without an error object")
            raise ApiError(status, str(error.get("code")), str(error.get("message")))
        return answer


def _job(job_id: str) -> str:
    return f"/v1/jobs/{quote(job_id, safe='')}"


def _not_running(home: Path | None, url: str | None = None) -> str:
    if home is None:
        return f"no node is listening at {url}; start one with `cx node`"
    if not (home / "config.toml").exists():
        return f"{home} is not a node's home yet; make one with `cx init --home {home}`"
    return f"no node is running for home {home}; start one with `cx node --home {home}`"
