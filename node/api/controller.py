"""The control API over a running :class:`~node.peer.Peer`: typed answers become JSON views,
the peer's refusals become :class:`ApiError` with their HTTP status, and
:func:`serve_control` publishes where it listens in the home (``api.json``)."""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from node.api import views
from node.api.common import API_FILE, ApiError, clear_api_info, write_api_info
from node.api.scrape import exposition
from node.api.server import serve_api
from node.api.snapshot import snapshot
from node.market.reputation import score_of
from node.market.request import JobRequest, RequestError
from node.net.transport import NetworkError
from node.peer import Conflict, Peer, PeerError, UnknownJob
from protocol.messages import JobState

if TYPE_CHECKING:
    from trio_typing import TaskStatus  # see node/net/memnet.py: trio-stubs shadow trio

__all__ = ["NodeController", "serve_control"]

Json = dict[str, Any]
log = logging.getLogger(__name__)


@contextmanager
def _refusals() -> Iterator[None]:
    """The peer's refusals as the API's errors, with their HTTP status."""
    try:
        yield
    except UnknownJob as exc:
        raise ApiError(404, exc.code, str(exc)) from exc
    except Conflict as exc:
        raise ApiError(409, exc.code, str(exc)) from exc
    except PeerError as exc:  # AmbiguousJob and every other request the peer cannot take
        raise ApiError(400, exc.code, str(exc)) from exc
    except RequestError as exc:
        raise ApiError(400, exc.code, str(exc)) from exc


class NodeController:
    """Implements node.api.server.Controller for a running peer."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer

    def node_info(self) -> Json:
        provider = self.peer.provider
        offer = provider.offer if provider is not None else None
        return {
            "peer_id": self.peer.net.peer_id,
            "addrs": self.peer.net.listen_addrs,
            "provider": provider is not None,
            "offer": None if offer is None else views.offer(offer),
            "version": version("compute-exchange"),
            "quotas": views.quotas(provider.quota_use() if provider is not None else ()),
        }

    def peers(self) -> list[Json]:
        net, addresses = self.peer.net, self.peer.market.addresses
        return [
            {
                "peer_id": p,
                "score": net.score(p),
                "reputation": score_of(self.peer.market, p),
                "addrs": [a] if (a := addresses.get(p)) else [],
            }
            for p in sorted(net.peers())
        ]

    async def submit(self, request: JobRequest) -> Json:
        with _refusals():
            return views.job(await self.peer.submit(request))

    def reload_quotas(self) -> list[Json]:
        with _refusals():
            return views.quotas(self.peer.reload_quotas())

    def sold(self) -> list[Json]:
        return [views.sold(s) for s in self.peer.sold()]

    def jobs(self) -> list[Json]:
        return [views.job(j) for j in self.peer.jobs()]

    def job(self, job_id: str) -> Json:
        with _refusals():
            return views.job(self.peer.job(job_id))

    async def events(self, job_id: str, after: int, wait_s: float) -> list[Json]:
        with _refusals():
            return await self.peer.events(job_id, after, wait_s)

    def why(self, job_id: str) -> Json:
        with _refusals():
            return views.why(self.peer.why(job_id))

    async def logs(self, job_id: str) -> Json:
        with _refusals():
            return await self.peer.logs(job_id)

    async def live_logs(self, job_id: str, stdout_from: int, stderr_from: int) -> Json:
        with _refusals():
            try:
                got = await self.peer.live_logs(job_id, (stdout_from, stderr_from))
            except NetworkError as exc:
                raise ApiError(409, "unreachable", f"its provider did not answer: {exc}") from exc
        return {
            "stdout": got.stdout.decode(errors="replace"),
            "stderr": got.stderr.decode(errors="replace"),
            "stdout_next": stdout_from + len(got.stdout),
            "stderr_next": stderr_from + len(got.stderr),
            "ended": got.ended,
        }

    async def outputs(self, job_id: str, dest: str) -> list[Json]:
        with _refusals():
            written = await self.peer.outputs(job_id, Path(dest))
        return [
            {"path": w.path, "size": w.size, **({"file": w.file} if w.file else {"url": w.url})}
            for w in written
        ]

    async def cancel(self, job_id: str, *, waiting_only: bool = False) -> Json:
        with _refusals():
            return views.job(await self.peer.cancel(job_id, waiting_only=waiting_only))

    def market(self) -> Json:
        m = self.peer.market
        return views.market(m.trader.book, list(m.tape.prints()), m.rejected, m.now_ms())

    async def check_score(self, provider: str) -> Json:
        with _refusals():
            return dataclasses.asdict(await self.peer.check_score(provider))

    def offers(self) -> list[Json]:
        trader = self.peer.market.trader
        return views.offers(
            trader.book, trader.reputation, trader.me.raw, self.peer.market.now_ms()
        )

    def trades(self, since_ms: int) -> list[Json]:
        return [views.trade_print(t) for t in self.peer.market.tape.prints(since_ms=since_ms)]

    def history(self, interval_ms: int, since_ms: int, price_field: str) -> Json:
        prints = list(self.peer.market.tape.prints(since_ms=since_ms))
        return views.history(prints, interval_ms=interval_ms, price_field=price_field)

    def ledger(self) -> Json:
        return views.ledger(self.peer.ledger(), self.peer.key.public_key.raw)

    def metrics(self) -> bytes:
        return exposition(self.peer)

    def snapshot(self) -> Json:
        return snapshot(self.peer, self.node_info(), self.market())

    def version(self) -> int:
        return self.peer.market.version

    async def changed(self) -> None:
        await self.peer.changed()

    def ticking(self) -> bool:
        if self.peer.provider is None:
            return False
        counts = self.peer.db.state_counts("provider")
        return any(counts.get(s.value, 0) for s in (JobState.TRANSFERRING, JobState.RUNNING))


async def serve_control(
    peer: Peer, *, task_status: TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve the control API for ``peer`` on 127.0.0.1 (the home's ``api_port``, else any
    free one) and publish it in the home until cancelled; ``nursery.start`` returns its URL.

    Raises OSError when the port cannot be bound.
    """
    token = secrets.token_hex(24)
    home: Path = peer.home.root
    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            lambda task_status: serve_api(
                NodeController(peer),
                token=token,
                port=peer.config.api_port,
                task_status=task_status,
            )
        )
        url = f"http://127.0.0.1:{port}"
        write_api_info(home, url, token)
        log.info("control API published in %s", home / API_FILE)
        try:
            task_status.started(url)
            await trio.sleep_forever()
        finally:
            clear_api_info(home)
