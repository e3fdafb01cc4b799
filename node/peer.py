"""A whole node, assembled: the embedding API for Python programs, served by ``cx node``.

::

    async with open_peer(Path("~/.cx").expanduser()) as peer:
        job = await peer.submit({"image": digest, "command": ["echo", "hi"],
                                 "max_prices": {"cpu_core_hour": 100_000_000}})
        done = await peer.wait(job["id"])

:func:`serve_peer` runs one node inside the caller's nursery (``nursery.start``): the
libp2p network (or a network the caller passes, such as ``node.net.memnet`` in tests), the
market, the buyer role, the provider role when the home's config offers capacity, blob
transfer, TPM enrolment, and the control API on 127.0.0.1 (``api.json`` in the home).
:class:`Peer`'s methods are the control API's (node/api/server.py): they return JSON-able values
and raise :class:`~node.api.server.ApiError` for what the caller got wrong.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
from collections.abc import AsyncIterator
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from node.api.server import FINAL_STATES, ApiError, serve_api, write_api_info
from node.clock import now_ms
from node.exec.executor import Executor, ExecutorConfig
from node.market.buyer import Buyer
from node.market.gossip import Market, resource_class
from node.market.provider import Provider
from node.market.request import RequestError, bid_from_request, resolve
from node.net.transport import Network, NetworkError
from node.storage import transfer
from node.storage.db import Database, JobRow
from node.storage.home import Home, HomeError, NodeConfig
from node.storage.store import BlobStore
from node.tpm import attestor as attestation
from node.tpm import swtpm
from protocol.envelope import MessageId
from protocol.identity import PrivateKey, PublicKey
from protocol.trader import Trader

if TYPE_CHECKING:
    from trio_typing import TaskStatus  # see node/net/memnet.py: trio-stubs shadow trio

__all__ = ["Peer", "open_peer", "serve_peer"]

log = logging.getLogger(__name__)


class Peer:
    def __init__(
        self,
        home: Home,
        config: NodeConfig,
        key: PrivateKey,
        market: Market,
        buyer: Buyer,
        provider: Provider | None,
    ) -> None:
        self.home = home
        self.config = config
        self.key = key
        self._market = market
        self.buyer = buyer
        self.provider = provider

    @property
    def net(self) -> Network:
        return self._market.net

    @property
    def db(self) -> Database:
        return self._market.db

    async def join(self, addr: str) -> str:
        """Connect to the peer at ``addr`` and take its addresses and book; its peer id."""
        try:
            return await self._market.join(addr)
        except NetworkError as exc:
            raise ApiError(502, "unreachable", f"{addr}: {exc}") from exc

    # -- the controller: what `cx` and other tools ask of a node -----------------------

    def node_info(self) -> dict[str, Any]:
        offer = self.provider.offer if self.provider is not None else None
        return {
            "peer_id": self.net.peer_id,
            "addrs": self.net.listen_addrs,
            "provider": self.provider is not None,
            "offer": None if offer is None else _offer_view(offer.payload, offer.id),
            "version": version("compute-exchange"),
        }

    def peers(self) -> list[dict[str, Any]]:
        return [
            {
                "peer_id": p,
                "score": self.net.score(p),
                "addrs": [a] if (a := self._market.addresses.get(p)) else [],
            }
            for p in sorted(self.net.peers())
        ]

    async def submit(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            resolved = await trio.to_thread.run_sync(resolve, request, self._market.store)
            bid = bid_from_request(resolved)
        except RequestError as exc:
            raise ApiError(400, "bad-request", str(exc)) from exc
        now = now_ms()
        job = JobRow(
            id=os.urandom(8).hex(),
            name=resolved.get("name"),
            request=resolved,
            state="waiting",
            created_ms=now,
            updated_ms=now,
        )
        return _job_view(await self.buyer.submit(job, bid))

    def jobs(self) -> list[dict[str, Any]]:
        return [_job_view(j) for j in self.db.jobs()]

    def _job(self, job_id: str) -> JobRow:
        found = self.db.jobs_by_prefix(job_id) if job_id else []
        if len(found) > 1:
            raise ApiError(400, "ambiguous-job", f"{len(found)} jobs start with {job_id!r}")
        if not found:
            raise ApiError(404, "unknown-job", f"no job with id {job_id!r}; see `cx jobs`")
        return found[0]

    def job(self, job_id: str) -> dict[str, Any]:
        return _job_view(self._job(job_id))

    async def events(self, job_id: str, after: int, wait_s: float) -> list[dict[str, Any]]:
        job = self._job(job_id)
        with trio.move_on_after(max(0.0, min(wait_s, 60.0))):
            while not self.db.events(job.id, after):
                await self.buyer.changed.wait()
        return self.db.events(job.id, after)

    async def wait(self, job_id: str) -> dict[str, Any]:
        """Wait until the job has ended (succeeded, failed, timed out, cancelled)."""
        while (job := self._job(job_id)).state not in FINAL_STATES:
            await self.buyer.changed.wait()
        return _job_view(job)

    def why(self, job_id: str) -> dict[str, Any]:
        job = self._job(job_id)
        bid = bid_from_request(job.request)
        book = self._market.trader.book
        e = book.explain(bid, now_ms=now_ms(), reputation=self._market.trader.reputation)
        excluded = [f"{name} ruled out {n}" for name, n in e.ruled_out.items() if n]
        if job.state not in ("waiting", "negotiating"):
            text = f"the job is {job.state}"
            if job.provider:
                text += f"; it was matched with {job.provider}"
        elif e.offers == 0:
            text = "no offers are known to this node yet; is it connected (`cx peers`)?"
        elif e.matching:
            text = (
                f"{e.matching} of {e.offers} offers fit; negotiation is under way or they refused"
            )
        else:
            text = f"none of {e.offers} offers fits: {', '.join(excluded)}; "
            if e.best_quote is None:
                text += "no offer passes the other constraints"
            else:
                text += (
                    f"the cheapest offer that passes the others would cost up to "
                    f"{_credits(e.best_quote)} credits, the bid allows {_credits(e.budget)}"
                )
        return {
            "bid_id": job.bid_id.hex() if job.bid_id else None,
            "state": job.state,
            "offers_seen": e.offers,
            "matching": e.matching,
            "ruled_out": e.ruled_out,
            "best_price": e.best_quote,
            "limit": e.budget,
            "explanation": text,
        }

    async def logs(self, job_id: str) -> dict[str, str]:
        job = self._job(job_id)
        out = {"stdout": "", "stderr": ""}
        for ref in job.logs or []:
            name = Path(ref["path"]).name
            data = await trio.to_thread.run_sync(self._market.store.read_bytes, ref["digest"])
            out[name] = data.decode(errors="replace")
        return out

    async def outputs(self, job_id: str, dest: str) -> list[dict[str, Any]]:
        job = self._job(job_id)
        root = Path(dest)
        if not root.is_absolute():
            raise ApiError(400, "bad-request", f"destination {dest!r} must be an absolute path")
        written = []
        for ref in job.outputs or []:
            rel = (
                Path(ref["path"]).relative_to("/out")
                if ref["path"].startswith("/out/")
                else Path(ref["path"].lstrip("/"))
            )
            if ".." in rel.parts:
                raise ApiError(
                    409, "bad-output", f"output path {ref['path']} leaves the output directory"
                )
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            await trio.to_thread.run_sync(
                shutil.copyfile, self._market.store.path(ref["digest"]), target
            )
            written.append({"path": ref["path"], "file": str(target), "size": ref["size"]})
        return written

    async def cancel(self, job_id: str) -> dict[str, Any]:
        job = self._job(job_id)
        if not await self.buyer.cancel(job.id):
            raise ApiError(
                409, "too-late", f"job {job.id} is {job.state}; only a waiting job can be cancelled"
            )
        return self.job(job.id)

    def market(self) -> dict[str, Any]:
        book = self._market.trader.book
        now = now_ms()
        classes: dict[str, dict[str, Any]] = {}

        def of(name: str) -> dict[str, Any]:
            empty = {"class": name, "offers": 0, "bids": 0, "best_cpu_core_hour": None}
            return classes.setdefault(name, {**empty, "last_prices": []})

        for resting in book.live_offers(now):
            c = of(resource_class(resting.offer))
            c["offers"] += 1
            price, best = resting.offer.prices.cpu_core_hour, c["best_cpu_core_hour"]
            c["best_cpu_core_hour"] = price if best is None else min(price, best)
        for trade in self._market.trades:
            c = of(trade.resource_class)
            c["last_prices"] = (c["last_prices"] + [trade.cpu_core_hour])[-5:]
        bids = sum(1 for b in book.bids.values() if b.order.expires_ms > now)
        return {
            "offers": sum(c["offers"] for c in classes.values()),
            "bids": bids,
            "classes": sorted(classes.values(), key=lambda c: c["class"]),
            "recent_trades": [
                {
                    "at_ms": t.at_ms,
                    "class": t.resource_class,
                    "cpu_core_hour": t.cpu_core_hour,
                    "memory_gib_hour": t.memory_gib_hour,
                }
                for t in list(self._market.trades)[-20:]
            ],
            "rejected_gossip": dict(self._market.rejected),
        }

    def ledger(self) -> dict[str, Any]:
        me = self.key.public_key.raw
        entries = []
        balance = 0
        for entry, at in self.db.ledger():
            role = "provider" if entry.payee == me else "buyer"
            balance += entry.amount if role == "provider" else -entry.amount
            entries.append(
                {
                    "agreement_id": entry.agreement_id.hex(),
                    "at_ms": at,
                    "payer": PublicKey(entry.payer).peer_id,
                    "payee": PublicKey(entry.payee).peer_id,
                    "amount": entry.amount,
                    "role": role,
                }
            )
        return {"balance": balance, "entries": entries}


def _credits(micro: int) -> str:
    return f"{micro / 1_000_000:.6f}".rstrip("0").rstrip(".")


def _offer_view(offer: Any, offer_id: MessageId) -> dict[str, Any]:  # noqa: ANN401
    return {
        "id": offer_id.hex(),
        "class": resource_class(offer),
        "cpu_milli": offer.capacity.cpu_milli,
        "memory_bytes": offer.capacity.memory_bytes,
        "cpu_core_hour": offer.prices.cpu_core_hour,
        "memory_gib_hour": offer.prices.memory_gib_hour,
        "trust": [t.value for t in offer.trust],
    }


def _job_view(job: JobRow) -> dict[str, Any]:
    return {
        "id": job.id,
        "name": job.name,
        "state": job.state,
        "detail": job.detail,
        "created_ms": job.created_ms,
        "updated_ms": job.updated_ms,
        "provider": job.provider,
        "attempts": job.attempts,
        "price": job.prices,
        "max_cost": job.max_cost,
        "cost": job.cost,
        "exit_reason": job.exit_reason,
        "exit_code": job.exit_code,
        "outputs": job.outputs or [],
        "logs": job.logs or [],
    }


# -- running a node ------------------------------------------------------------------------


async def serve_peer(
    root: Path | Home,
    *,
    network: Network | None = None,
    api: bool = True,
    task_status: TaskStatus[Peer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the node of the home at ``root`` until cancelled; ``nursery.start`` returns it.

    Raises HomeError for a missing or bad home.
    """
    home = root if isinstance(root, Home) else Home(root)
    key, config = home.key(), home.config()
    db = Database(home.db_path)
    store = BlobStore(home.store_root)
    trader = Trader(key)
    for entry, _ in db.ledger():
        trader.ledger.record(entry)
    try:
        # The exit stack outlives the nursery: the TPM stays open while any task may use it.
        async with contextlib.AsyncExitStack() as stack, trio.open_nursery() as nursery:
            net: Network = (
                network if network is not None else await nursery.start(_libp2p, key, config)
            )
            market = Market(trader, net, db, store)
            await nursery.start(market.run)
            transfer.serve_blobs(net, store)
            known: dict[bytes, list[bytes]] = {}
            for provider_key, name in db.trusted_aks():
                known.setdefault(provider_key, []).append(name)
            trust = attestation.AkTrust(_roots(config), names=known, on_add=db.trust_ak)
            buyer = Buyer(market, key, trust)
            await nursery.start(buyer.run)
            provider = None
            if config.provider is not None:
                attestor = await stack.enter_async_context(_attestor(home, config))
                if attestor is not None:
                    attestation.serve_enrolment(net, attestor, key)
                executor = Executor(
                    ExecutorConfig(
                        store_root=home.store_root,
                        work_root=home.work_root,
                        capacity=config.provider.capacity,
                    )
                )
                provider = Provider(market, key, executor, config.provider, attestor)
                await nursery.start(provider.run)
            for addr in config.bootstrap:
                try:
                    await market.join(addr)
                except NetworkError as exc:
                    log.warning("bootstrap peer %s unreachable: %s", addr, exc)
            peer = Peer(home, config, key, market, buyer, provider)
            if api:
                token = secrets.token_hex(24)
                port = await nursery.start(
                    lambda task_status: serve_api(
                        peer, token=token, port=config.api_port, task_status=task_status
                    )
                )
                write_api_info(home.root, f"http://127.0.0.1:{port}", token)
            task_status.started(peer)
    finally:
        db.close()


async def _libp2p(
    key: PrivateKey, config: NodeConfig, *, task_status: TaskStatus[Any] = trio.TASK_STATUS_IGNORED
) -> None:
    from node.net.p2p import P2PConfig, serve_network

    await serve_network(
        key,
        P2PConfig(listen_addrs=config.listen, enable_dht=config.dht, enable_mdns=config.mdns),
        task_status=task_status,
    )


def _roots(config: NodeConfig) -> list[bytes]:
    roots = []
    for path in config.ek_roots:
        try:
            roots.append(Path(path).read_bytes())
        except OSError as exc:
            raise HomeError(f"EK root certificate {path}: {exc}") from exc
    return roots


@contextlib.asynccontextmanager
async def _attestor(
    home: Home, config: NodeConfig
) -> AsyncIterator[attestation.TpmAttestor | None]:
    """The provider's TPM: the configured device, or a swtpm kept under the home."""
    provider = config.provider
    if provider is None or not provider.tpm:
        yield None
        return
    if provider.tcti is not None:
        attestor = await attestation.TpmAttestor.open(provider.tcti)
        try:
            yield attestor
        finally:
            attestor.close()
        return
    if not (home.tpm_dir / "state").is_dir():
        await trio.to_thread.run_sync(swtpm.manufacture, home.tpm_dir)
    tpm = await trio.to_thread.run_sync(swtpm.start, home.tpm_dir)
    try:
        attestor = await attestation.open_swtpm_attestor(tpm)
        try:
            yield attestor
        finally:
            attestor.close()
    finally:
        tpm.stop()


@contextlib.asynccontextmanager
async def open_peer(root: Path | Home, **options: Any) -> AsyncIterator[Peer]:  # noqa: ANN401
    """Run a node inside the caller's task tree for the duration of the block."""
    async with trio.open_nursery() as nursery:
        peer: Peer = await nursery.start(
            lambda task_status: serve_peer(root, task_status=task_status, **options)
        )
        try:
            yield peer
        finally:
            nursery.cancel_scope.cancel()
