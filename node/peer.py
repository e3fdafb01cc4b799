"""A whole node, assembled, and the embedding API for Python programs.

::

    async with open_peer(Path("~/.cx").expanduser()) as peer:
        job = await peer.submit(
            build_request(image=digest, command=("echo", "hi"),
                          max_prices={"cpu_core_hour": 100_000_000})
        )
        done = await peer.wait(job.id)

:func:`serve_peer` runs one node inside the caller's nursery (``nursery.start``): the
libp2p network (or a network the caller passes, such as ``node.net.memnet`` in tests), the
market, the buyer role, the provider role when the home's config offers capacity, blob
transfer and TPM enrolment. Time, randomness, timeouts and the executor come in as
arguments, so a test can run a market of nodes under trio's ``MockClock``.

:class:`Peer` answers with the node's own typed objects (``JobRow``, ``Explanation``,
ledger entries) and raises :class:`PeerError` subclasses for what the caller got wrong.
The control API (``node.api``) is a JSON view onto a Peer; ``cx node`` serves both.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from node.clock import Clock, Entropy, Timings, system_entropy
from node.exec.executor import Executor, ExecutorConfig
from node.exec.gpu import provider_gpus
from node.exec.machine import detect_hardware
from node.market import peering
from node.market.buyer import FINAL_STATES, WAITING_STATES, Buyer
from node.market.gossip import Market
from node.market.provider import Provider, Runner
from node.market.remote import resolve_remote
from node.market.reputation import Reputation
from node.market.request import JobRequest, parse_request, resolve
from node.market.score_check import ScoreCheck, ScoreCheckError, check_score
from node.net.ports import busy_ports
from node.net.transport import Network, NetworkError
from node.storage import transfer
from node.storage.db import AgreementRow, Database, JobRow
from node.storage.home import Home, HomeError, NodeConfig
from node.storage.store import BlobStore
from node.tpm import attestor as attestation
from node.tpm import swtpm
from protocol.book import Explanation
from protocol.errors import InvalidMessage, ProtocolError
from protocol.explain import why_not, why_ranked
from protocol.identity import PrivateKey
from protocol.messages import Terms
from protocol.negotiation import Agreement
from protocol.pricing import Rung
from protocol.quotas import GroupUse, Quota
from protocol.settlement import LedgerEntry
from protocol.trader import Trader

if TYPE_CHECKING:
    from trio_typing import TaskStatus  # see node/net/memnet.py: trio-stubs shadow trio

__all__ = [
    "AmbiguousJob",
    "Conflict",
    "LiveLogs",
    "Peer",
    "PeerError",
    "Sold",
    "UnknownJob",
    "Why",
    "Written",
    "open_peer",
    "serve_peer",
]

log = logging.getLogger(__name__)


class PeerError(Exception):
    """What a caller of :class:`Peer` got wrong; ``code`` is machine-readable."""

    code = "bad-request"


class UnknownJob(PeerError):
    code = "unknown-job"


class AmbiguousJob(PeerError):
    code = "ambiguous-job"


class Conflict(PeerError):
    """The job is not in a state that allows this (``code`` says which rule)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveLogs:
    """A job's output since the offsets asked (:meth:`Peer.live_logs`)."""

    stdout: bytes
    stderr: bytes
    ended: bool  # the job is over: nothing follows these


@dataclass(frozen=True, slots=True, kw_only=True)
class Sold:
    """A job this node runs or ran for a buyer: its agreement, and what it earned once the
    buyer countersigned the receipt (None before)."""

    row: AgreementRow
    terms: Terms
    earned: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Why:
    """Why a job's bid has not matched: ``explanation`` while it waits, else None."""

    job: JobRow
    explanation: Explanation | None
    text: str
    rung: Rung | None = None  # a deadline's price ladder: the limit now, the next rise


@dataclass(frozen=True, slots=True, kw_only=True)
class Written:
    """One output file written by :meth:`Peer.outputs`."""

    path: str  # in the job
    file: str | None  # on this machine; None for an output uploaded to the job's prefix
    size: int
    url: str | None = None  # where it was uploaded (JobRequest.output_to)


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
        self.market = market
        self.buyer = buyer
        self.provider = provider

    @property
    def net(self) -> Network:
        return self.market.net

    @property
    def db(self) -> Database:
        return self.market.db

    async def join(self, addr: str) -> str:
        """Connect to the peer at ``addr`` and take its addresses and book; its peer id.

        Raises NetworkError when ``addr`` cannot be reached.
        """
        return await self.market.join(addr)

    async def changed(self) -> None:
        """Return when something observable changes: a job, the book, the ledger."""
        await self.market.changed()

    # -- jobs ------------------------------------------------------------------------------

    async def submit(self, request: JobRequest) -> JobRow:
        """Import what the request names (in a worker thread), bid for it; the new job.

        Raises RequestError.
        """
        request = await resolve_remote(
            request, s3=self.config.s3, now=datetime.fromtimestamp(self.market.now_ms() / 1000, UTC)
        )
        resolved = await trio.to_thread.run_sync(resolve, request, self.market.store)
        credentials = request.credentials.credentials() if request.credentials else None
        return await self.buyer.submit(resolved, credentials)

    def jobs(self) -> list[JobRow]:
        """This node's jobs, newest first."""
        return self.db.jobs()

    def job(self, job_id: str) -> JobRow:
        """The job with this id, or the only one whose id starts with it.

        Raises UnknownJob, AmbiguousJob.
        """
        found = self.db.jobs_by_prefix(job_id) if job_id else []
        if len(found) > 1:
            raise AmbiguousJob(f"{len(found)} jobs start with {job_id!r}")
        if not found:
            raise UnknownJob(f"no job with id {job_id!r}; see `cx jobs`")
        return found[0]

    def request(self, job: JobRow) -> JobRequest:
        """The request a job was made from."""
        return parse_request(job.request)

    async def events(self, job_id: str, after: int, wait_s: float) -> list[dict[str, Any]]:
        """The job's state changes after ``after``; waits up to ``wait_s`` for one."""
        job = self.job(job_id)
        with trio.move_on_after(max(0.0, wait_s)):
            while not self.db.events(job.id, after):
                await self.changed()
        return self.db.events(job.id, after)

    async def wait(self, job_id: str) -> JobRow:
        """Wait until the job has ended (succeeded, failed, timed out, cancelled)."""
        while (job := self.job(job_id)).state not in FINAL_STATES:
            await self.changed()
        return job

    def why(self, job_id: str) -> Why:
        job = self.job(job_id)
        if job.state not in WAITING_STATES:
            text = f"the job is {job.state}"
            if job.provider:
                text += f"; it was matched with {job.provider}"
                if ranked := self._why_ranked(job, job.provider):
                    text += f": {ranked}"
            return Why(job=job, explanation=None, text=text)
        trader = self.market.trader
        bid = self.buyer.bid_of(job)
        now = self.market.now_ms()
        e = trader.book.explain(bid, now_ms=now, reputation=trader.reputation)
        text, rung = why_not(e, bid), self.buyer.rung(job)
        if job.bid_id is not None and (held := self.buyer.quota_held(job.bid_id)):
            text = f"{text.rstrip('.')}. Provider {held}."
        if rung is not None:
            limit = rung.limit.cpu_core_hour / 1e6
            text = (
                text.rstrip(".")
                + f". Its deadline's limit is {limit:.2f} credits per CPU core-hour now"
            )
            if rung.next_rise_ms is None:
                text += ", its maximum."
            else:
                text += f", rising in {(rung.next_rise_ms - now) / 1000:.0f} s."
        return Why(job=job, explanation=e, text=text, rung=rung)

    def _why_ranked(self, job: JobRow, provider: str) -> str:
        """How moving the job's data ranked its provider (protocol/explain.py)."""
        bid, trader = self.buyer.bid_of(job), self.market.trader
        if bid.data is None:
            return ""
        now = self.market.now_ms()
        return why_ranked(
            trader.book.ranking(bid, now_ms=now, reputation=trader.reputation), provider, bid
        )

    async def logs(self, job_id: str) -> dict[str, str]:
        """The job's stdout and stderr, as far as its receipt names them."""
        job = self.job(job_id)
        out = {"stdout": "", "stderr": ""}
        for ref in job.logs or []:
            name = Path(ref["path"]).name
            data = await trio.to_thread.run_sync(self.market.store.read_bytes, ref["digest"])
            out[name] = data.decode(errors="replace")
        return out

    async def live_logs(self, job_id: str, offsets: tuple[int, int] = (0, 0)) -> LiveLogs:
        """What the job has written to stdout and stderr since the byte ``offsets``: from
        its provider while it runs (spec/peer.md rule 14), from its receipt's logs once it
        has ended (``ended``: nothing more will come).

        Raises:
            UnknownJob, AmbiguousJob: no such job.
            NetworkError: its provider could not be reached.
        """
        job = self.job(job_id)
        if job.state not in FINAL_STATES:
            out, err = await self.buyer.live_logs(job.id, offsets)
            return LiveLogs(stdout=out, stderr=err, ended=False)
        kept = {"stdout": b"", "stderr": b""}
        for ref in job.logs or []:
            data = await trio.to_thread.run_sync(self.market.store.read_bytes, ref["digest"])
            kept[Path(ref["path"]).name] = data
        return LiveLogs(
            stdout=kept["stdout"][offsets[0] :], stderr=kept["stderr"][offsets[1] :], ended=True
        )

    async def outputs(self, job_id: str, dest: Path) -> list[Written]:
        """Copy the job's output files under ``dest`` (an absolute directory).

        Raises PeerError for a relative ``dest`` or one that cannot be written (``/proc``,
        a file, no permission), Conflict for an output path that would leave it.
        """
        job = self.job(job_id)
        if not dest.is_absolute() or "\x00" in str(dest):
            raise PeerError(f"destination {str(dest)!r} must be an absolute path")
        try:
            return await self._copy_outputs(job, dest)
        except OSError as exc:
            raise PeerError(
                f"cannot write the outputs under {dest}: {exc.strerror or exc}; choose a "
                "directory this node's user may write"
            ) from None

    async def _copy_outputs(self, job: JobRow, dest: Path) -> list[Written]:
        written = []
        for ref in job.outputs or []:
            rel = (
                Path(ref["path"]).relative_to("/out")
                if ref["path"].startswith("/out/")
                else Path(ref["path"].lstrip("/"))
            )
            if ".." in rel.parts:
                raise Conflict(
                    "bad-output", f"output path {ref['path']} leaves the output directory"
                )
            if "url" in ref and not self.market.store.has(ref["digest"]):
                written.append(
                    Written(path=ref["path"], file=None, size=ref["size"], url=ref["url"])
                )
                continue  # it went to the job's object-store prefix
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            await trio.to_thread.run_sync(
                shutil.copyfile, self.market.store.path(ref["digest"]), target
            )
            written.append(Written(path=ref["path"], file=str(target), size=ref["size"]))
        return written

    async def cancel(self, job_id: str, *, waiting_only: bool = False) -> JobRow:
        """Withdraw a job that is still waiting for a provider, or ask its provider to stop
        it (spec/peer.md rule 13: its receipt says ``stopped``; the time used is paid),
        unless ``waiting_only``.

        Raises Conflict(``too-late``) when it has ended, or its provider cannot be reached.
        """
        job = self.job(job_id)
        if await self.buyer.cancel(job.id):
            return self.job(job.id)
        if waiting_only:
            raise Conflict("too-late", f"job {job.id} is {job.state}; it is no longer waiting")
        try:
            stopping = await self.buyer.stop(job.id)
        except NetworkError as exc:
            raise Conflict(
                "too-late", f"job {job.id}: its provider could not be reached to stop it ({exc})"
            ) from None
        if not stopping:
            raise Conflict("too-late", f"job {job.id} has already ended ({job.state})")
        return self.job(job.id)

    async def check_score(self, provider: str) -> ScoreCheck:
        """Run the benchmark on ``provider`` and judge the work score its offer states
        (node/market/score_check.py); a provider that overstates it loses this node's trust.

        Raises PeerError when the check cannot be made.
        """
        try:
            return await check_score(self.buyer, provider)
        except (ScoreCheckError, InvalidMessage) as exc:
            raise PeerError(f"cannot check {provider}'s work score: {exc}") from None

    def reload_quotas(self) -> list[tuple[Quota, GroupUse]]:
        """Apply the ``[[provider.quota]]`` of config.toml as it is now, without a restart
        (its other keys wait for one); each group with its use.

        Raises:
            Conflict: this node sells nothing.
            PeerError: config.toml has problems (the node keeps its quotas).
        """
        if self.provider is None:
            raise Conflict("not-provider", "this node sells nothing, so it has no quotas")
        try:
            provider = self.home.config().provider
        except HomeError as exc:
            raise PeerError(f"quotas not reloaded: {exc}") from None
        if provider is None:
            raise PeerError("quotas not reloaded: config.toml has no [provider] table now")
        self.provider.set_quotas(provider.quotas)
        return self.provider.quota_use()

    def sold(self) -> list[Sold]:
        """The jobs this node took as provider, newest first, with what each earned."""
        paid = {entry.agreement_id: entry.amount for entry, _ in self.db.ledger()}
        out = []
        for row in reversed(self.db.agreements()):
            if row.role != "provider":
                continue
            try:
                agreement = Agreement.from_wire(row.wire)
            except (ProtocolError, ValueError):
                continue  # quarantined by the provider at start
            out.append(Sold(row=row, terms=agreement.terms, earned=paid.get(row.id)))
        return out

    def ledger(self) -> list[tuple[LedgerEntry, int]]:
        """Every settled receipt's ledger entry with the time it settled, oldest first."""
        return self.db.ledger()


# -- running a node ------------------------------------------------------------------------


async def serve_peer(
    root: Path | Home,
    *,
    network: Network | None = None,
    clock: Clock | None = None,
    timings: Timings | None = None,
    entropy: Entropy = system_entropy,
    executor: Runner | None = None,
    task_status: TaskStatus[Peer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the node of the home at ``root`` until cancelled; ``nursery.start`` returns it.

    ``network`` defaults to libp2p as the home's config says, ``clock`` to the wall clock,
    ``timings`` to production values, ``executor`` (used only if the home offers capacity)
    to real OCI containers.

    Raises HomeError for a missing or bad home, one another node holds, or ports of its
    config that another program holds.
    """
    home = root if isinstance(root, Home) else Home(root)
    key, config = home.key(), home.config()
    held = home.lock()  # one node per home: one key, one node.db, one api.json
    try:
        if network is None and (busy := busy_ports(config.listen, config.api_port)):
            raise HomeError("\n".join(busy))
        clock = clock or Clock()
        db = Database(home.db_path)
    except BaseException:
        held.release()
        raise
    store = BlobStore(home.store_root, budget_bytes=config.store_budget_bytes)
    trader = Trader(key)
    for entry, _ in db.ledger():
        try:
            trader.ledger.record(entry)
        except (ProtocolError, TypeError) as exc:  # a negative or non-integer amount
            db.quarantine("ledger", entry.agreement_id, f"unusable entry: {exc}", clock.now_ms())
    db.sweep_jobs(clock.now_ms())
    try:
        # The exit stack outlives the nursery: the TPM stays open while any task may use it.
        async with contextlib.AsyncExitStack() as stack, trio.open_nursery() as nursery:
            net: Network = (
                network if network is not None else await nursery.start(_libp2p, key, config)
            )
            market = Market(
                trader,
                net,
                db,
                store,
                clock=clock,
                timings=timings or Timings(),
                entropy=entropy,
            )
            await nursery.start(market.run)
            await nursery.start(Reputation(market, key).run)
            transfer.serve_blobs(net, store)
            nursery.start_soon(save_store_counts, store)
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
                    attestation.serve_enrolment(
                        net, attestor, key, clock=market.now_ms, entropy=entropy
                    )
                devices = await provider_gpus(config.provider.gpu_shares)
                offering = replace(
                    config.provider.with_gpus(tuple(d.advertised() for d in devices)),
                    hardware=detect_hardware(),
                )
                runner = executor or Executor(
                    ExecutorConfig(
                        store_root=home.store_root,
                        work_root=home.work_root,
                        capacity=offering.capacity,
                        gpus=devices,
                    )
                )
                if isinstance(runner, Executor):
                    stack.callback(runner.close)  # its cleanups and helper process
                provider = Provider(market, key, runner, offering, attestor, s3=config.s3)
                await nursery.start(provider.run)
            await nursery.start(peering.keep_in_touch, market, config.bootstrap)
            task_status.started(Peer(home, config, key, market, buyer, provider))
    finally:
        store.save_counts()
        db.close()
        held.release()


async def save_store_counts(store: BlobStore) -> None:
    """Write the store's hit and miss counts a second late at most, for ``cx store``."""
    while True:
        await trio.sleep(1)
        store.save_counts()


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
    """Run a node inside the caller's task tree for the duration of the block; ``options``
    are :func:`serve_peer`'s."""
    async with trio.open_nursery() as nursery:
        peer: Peer = await nursery.start(
            lambda task_status: serve_peer(root, task_status=task_status, **options)
        )
        try:
            yield peer
        finally:
            nursery.cancel_scope.cancel()
