"""The provider role of a node: sell capacity, run agreed jobs, get receipts countersigned.

The provider gossips a signed offer (a fresh one at start and before the old one expires).
A buyer's proposal arrives on ``/cx/negotiate/1``; what to refuse, and which cheaper
preemptible jobs to preempt to make room, are decided by :class:`protocol.selling.Selling`;
this shell gathers its inputs and acts: it attaches a TPM quote bound to the terms when the
bid demands it, preempts, and after the agreement pulls the image and inputs from the buyer
by digest, marks the job *started* in the database, runs it through its :class:`Runner`
(the executor) and signs a usage receipt.

Statuses and receipts go through a durable outbox, in order, per buyer, until the buyer
answers (a status with ``ok``, a receipt with its countersignature); after a crash the
outbox is still there. A job that was started when the node died is not run again: the
restarted provider issues a provider-fault receipt for it (nothing is charged) and the
buyer bids for it elsewhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import trio

from node.exec.executor import CapacityExceeded, JobResult
from node.market.benchmark import measure_work_score
from node.market.gossip import Market
from node.market.holdings import follow_holdings, held_now
from node.market.invitations import send_invitations
from node.market.joblink import IDLE_S, JobLink
from node.market.livelogs import CHUNK, answer_logs
from node.market.quotas import feed_spend, group_uses
from node.market.repricing import asking_now, follow_prices
from node.market.secrets import SealKey, receive_secrets
from node.market.stopping import answer_stop
from node.net.transport import FramedStream, NetworkError, PeerId, Stream
from node.net.wire import (
    LOGS,
    NEGOTIATE,
    PING,
    STOP,
    PeerRefused,
    control,
    read_control,
)
from node.storage.db import Database
from node.storage.home import ProviderConfig, S3Config
from node.storage.jobdata import (
    ContentError,
    Credentials,
    Sources,
    fetch_job_content,
    job_blobs,
    upload_outputs,
)
from node.tpm.attestor import TpmAttestor
from protocol.envelope import MessageId, Signed, open_signed
from protocol.errors import ProtocolError, Reason
from protocol.identity import PrivateKey, PublicKey
from protocol.messages import (
    Accept,
    Checkpoint,
    DataRef,
    Elastic,
    ExitReason,
    JobSpec,
    JobState,
    Offer,
    Prices,
    Resources,
    Terms,
    TrustLevel,
    Usage,
    UsageReceipt,
)
from protocol.negotiation import Agreement, terms_hash
from protocol.quotas import GroupUse, Quota, Quotas
from protocol.selling import Selling

__all__ = ["Provider", "Runner"]

log = logging.getLogger(__name__)

# A negotiate stream the buyer keeps (node/market/joblink.py) is closed after this long
# unused: the buyer closes its own after IDLE_S, so only a buyer that forgot it meets this.
NEGOTIATE_IDLE_S = 3 * IDLE_S
# A buyer that refuses a receipt for one of these reasons will refuse it again.
_FINAL_REFUSALS = frozenset(
    {Reason.ILLEGAL_TRANSITION, Reason.TERMS_MISMATCH, Reason.WRONG_PARTY, Reason.BAD_SIGNATURE}
)


class Runner(Protocol):
    """What the provider needs of an executor (node.exec.Executor; a fake in tests)."""

    async def recover(self) -> None: ...

    async def run_job(
        self,
        spec: JobSpec,
        resources: Resources,
        *,
        job_id: str,
        checkpoint: Checkpoint | None,
        elastic: Elastic | None = None,
    ) -> JobResult: ...

    def preempt(self, job_id: str) -> bool: ...

    def live_log(self, job_id: str, name: str, offset: int, limit: int) -> bytes | None: ...


@dataclass(slots=True)
class _Running:
    agreement: Agreement
    job_id: str
    done: trio.Event = field(default_factory=trio.Event)
    stopped: bool = False  # its buyer asked to stop it (node/market/stopping.py)


class Provider:
    def __init__(
        self,
        market: Market,
        key: PrivateKey,
        executor: Runner,
        config: ProviderConfig,
        attestor: TpmAttestor | None,
        *,
        s3: S3Config | None = None,
    ) -> None:
        self.market = market
        self.key = key
        self.executor = executor
        self.config = config
        self.attestor = attestor
        self.selling = Selling(
            market.trader, max_share_ppm=config.max_share_ppm, quotas=config.quotas
        )
        self.timings = market.timings
        self.s3 = s3  # where the jobs' s3:// inputs and outputs go
        self.seal = SealKey()  # buyers seal their jobs' secrets to it
        self._running: dict[bytes, _Running] = {}
        self._nursery: trio.Nursery | None = None
        self._wake = trio.Event()
        self._queued: dict[bytes, trio.Event] = {}  # agreement id -> its lane's next message
        self._delivering: set[tuple[str, bytes]] = set()  # (buyer, agreement) lanes
        self._pricing = config.effective_pricing()
        self._prices = config.prices  # asked now: the policies move them from here
        self._work_score: int | None = None  # measured at start when config.benchmark
        self._holds: bytes | None = None  # the blobs the offer says it holds (holdings.py)

    @property
    def offer(self) -> Signed[Offer] | None:
        return self.selling.offer

    @property
    def db(self) -> Database:
        return self.market.db

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:  # noqa: ANN401
        await self.executor.recover()
        if self.config.benchmark:
            job_id = f"benchmark-{self.market.nonce(8).hex()}"
            self._work_score = await measure_work_score(self.executor, self.market.store, job_id)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._restore()
            self.market.net.serve(NEGOTIATE, self._serve_negotiate)
            self.market.net.serve(PING, self._serve_ping)
            self.market.net.serve(STOP, lambda raw: answer_stop(raw, self._stop))
            self.market.net.serve(LOGS, lambda raw: answer_logs(raw, self._live_log))
            if self._pricing.moves:
                self._prices = self._asking()
            self._holds = await trio.to_thread.run_sync(held_now, self.market.store)
            await self._post_offer()
            nursery.start_soon(follow_holdings, self.market.store, lambda: self._holds, self._hold)
            nursery.start_soon(self._refresh_offer)
            nursery.start_soon(self._follow_prices)
            nursery.start_soon(self._deliver_loop)
            task_status.started()

    # -- the offer ---------------------------------------------------------------------

    def _offer(self) -> Offer:
        c = self.config
        trust = c.trust if self.attestor is not None else (TrustLevel.NONE,)
        return Offer(
            capacity=c.capacity,
            prices=self._prices,
            arch=c.arch,
            gpus=c.gpus,
            hardware=c.hardware,
            region=c.region,
            trust=trust,
            seal_key=self.seal.public,
            work_score=self._work_score,
            watts=c.cost.watts if c.cost else None,
            ingress_gib=c.ingress_gib,
            egress_gib=c.egress_gib,
            holds=self._holds,
        )

    async def _hold(self, holds: bytes | None) -> None:
        self._holds = holds
        await self._post_offer()

    async def _post_offer(self) -> None:
        """Post a fresh offer and cancel the ones before it."""
        old = [oid for oid, kind, _, _, _ in self.db.orders() if kind == "offer"]
        order = self.selling.post_offer(
            self._offer(),
            nonce=self.market.nonce(),
            now_ms=self.market.now_ms(),
            ttl_ms=self.config.offer_ttl_ms,
        )
        self.db.save_order(order.id, "offer", order.wire, order.expires_ms, None)
        self.market.touch()
        await self.market.publish(order)
        for offer_id in old:
            self.db.drop_order(offer_id)
            cancel = self.selling.withdraw(
                offer_id, nonce=self.market.nonce(), now_ms=self.market.now_ms()
            )
            if cancel is not None:
                await self.market.publish(cancel)

    async def set_offer(
        self, *, prices: Prices | None = None, capacity: Resources | None = None
    ) -> None:
        """Sell at new unit prices, or a new capacity, from now on: a fresh offer replaces the
        current one (jobs running keep the terms they agreed). New prices are fixed ones:
        the configured pricing policies stop moving them."""
        self.config = dataclasses.replace(
            self.config,
            prices=prices or self.config.prices,
            capacity=capacity or self.config.capacity,
            pricing=None if prices else self.config.pricing,
        )
        self._pricing = self.config.effective_pricing()
        self._prices = self._asking() if self._pricing.moves else self.config.prices
        await self._post_offer()

    def _asking(self) -> Prices:
        return asking_now(
            self._pricing, self.market, self.selling, self._offer(), self.config.capacity
        )

    async def _follow_prices(self) -> None:
        if not self._pricing.moves:
            return

        def current() -> tuple[Prices, int]:
            assert self.offer is not None
            return self.offer.payload.prices, self.offer.issued_ms

        def ask() -> Prices:  # set_offer may have fixed the prices since
            return self._asking() if self._pricing.moves else self._prices

        async def post(prices: Prices) -> None:
            self._prices = prices
            await self._post_offer()

        await follow_prices(self._pricing, self.market, current, ask, post)

    async def _refresh_offer(self) -> None:
        while True:
            assert self.offer is not None
            lifetime = self.offer.expires_ms - self.offer.issued_ms
            await trio.sleep(lifetime * self.timings.offer_refresh / 1000)
            await self._post_offer()
            if self.selling.quotas.groups:  # a new UTC day may have freed a credits quota
                self._invite()

    # -- negotiation -------------------------------------------------------------------

    async def _serve_negotiate(self, raw: Stream) -> None:
        """Negotiations one after another, for as long as the buyer keeps the stream
        (node/market/joblink.py); a stream left unused for ``NEGOTIATE_IDLE_S`` is closed."""
        stream = FramedStream(raw)
        while True:
            frame = None
            with trio.move_on_after(NEGOTIATE_IDLE_S):
                frame = await stream.receive_frame()
            if frame is None or not await self._negotiate(stream, raw.remote_peer, frame):
                return

    async def _negotiate(self, stream: FramedStream, buyer: PeerId, frame: bytes) -> bool:
        """Answer one proposal, and take the agreement that follows an accept; whether the
        stream may carry the buyer's next proposal."""
        try:
            proposal = self.selling.receive_proposal(frame, now_ms=self.market.now_ms())
            if proposal.signer.peer_id != buyer:
                raise ProtocolError(Reason.WRONG_PARTY, "the proposal's buyer is not this peer")
        except ProtocolError as exc:
            await stream.send_frame(control(error=exc.reason.value, detail=str(exc)))
            return False
        reply = await self._answer(proposal.id, proposal.payload.terms)
        if not isinstance(reply.payload, Accept):  # counted before the buyer can hear of it
            self.market.metrics.negotiation("provider", "rejected")
            if (quota := reply.payload.quota) is not None:
                self.market.metrics.quota_refusals.labels(quota.group, quota.quota.value).inc()
            await stream.send_frame(reply.wire)
            return True
        await stream.send_frame(reply.wire)
        try:
            with trio.fail_after(self.timings.agreement_timeout_s):
                wire = await stream.receive_frame()
            if wire is None:
                raise ProtocolError(Reason.MALFORMED, "the buyer left without agreeing")
            agreement = self.selling.receive_agreement(wire)
        except (NetworkError, trio.TooSlowError, ProtocolError) as exc:
            log.info("no agreement for proposal %s: %s", proposal.id.hex()[:12], exc)
            self.selling.timed_out(proposal.id)
            self.market.metrics.negotiation("provider", "failed")
            return False
        self.db.save_agreement(
            agreement.id,
            role="provider",
            wire=agreement.to_wire(),
            state=JobState.AGREED.value,
            peer=buyer,
            job_id=None,
            created_ms=self.market.now_ms(),
        )
        self.market.metrics.negotiation("provider", "agreed")
        kept = True
        try:
            await stream.send_frame(control(ok=True))
        except NetworkError as exc:
            log.info("agreement ack lost (%s); the buyer holds the agreement already", exc)
            kept = False
        credentials: Credentials | None = Credentials()
        if agreement.terms.job.secrets:
            try:
                credentials = await receive_secrets(stream, agreement, self.seal)
            except (ProtocolError, NetworkError, trio.TooSlowError) as exc:
                log.info("no secrets for %s: %s", agreement.id.hex()[:16], exc)
                credentials, kept = None, False
        assert self._nursery is not None
        self._nursery.start_soon(self._run_job, agreement, credentials)
        return kept

    async def _answer(self, proposal_id: MessageId, terms: Terms) -> Signed[Any]:
        """Refuse, or make room and accept with evidence when the terms need it."""
        feed_spend(self.selling, self.db, self.market.now_ms())
        refusal = self.selling.screen(proposal_id)
        if refusal is None:
            victims = self.selling.preemption_for(proposal_id)
            if victims:
                await self._preempt(victims)
        evidence = None
        if refusal is None and terms.trust.level is TrustLevel.TPM and self.attestor is not None:
            evidence = await self.attestor.evidence(
                provider_key=self.key.public_key.raw,
                nonce=terms.attestation_nonce,
                terms_hash=terms_hash(terms),
            )
        # accept() screens again and holds the capacity, or rejects with the reason
        reply: Signed[Any] = self.selling.accept(
            proposal_id, evidence=evidence, nonce=self.market.nonce(), now_ms=self.market.now_ms()
        )
        return reply

    async def _preempt(self, victims: list[bytes]) -> None:
        """Stop the chosen jobs (their declared signal, grace, kill) and wait for them."""
        running = [self._running[v] for v in victims if v in self._running]
        for victim in running:
            log.info("preempting %s for a better-paying job", victim.job_id)
            self.executor.preempt(victim.job_id)
        grace = max((v.agreement.terms.checkpoint or Checkpoint()).grace_ms for v in running)
        with trio.move_on_after(grace / 1000 + 5):
            for victim in running:
                await victim.done.wait()

    # -- running a job -----------------------------------------------------------------

    async def _run_job(self, agreement: Agreement, credentials: Credentials | None) -> None:
        running = _Running(agreement, agreement.id.hex()[:16])
        self._running[agreement.id] = running
        try:
            await self._run(agreement, running, credentials)
        except Exception as exc:
            # Top of a per-job task: the node keeps serving, and the buyer hears of it.
            log.exception("job %s failed inside the provider", running.job_id)
            with contextlib.suppress(ProtocolError):
                self._fault(agreement, f"internal error: {exc}")
        finally:
            running.done.set()
            del self._running[agreement.id]
            self._queued_now(agreement.id)  # its lane stops waiting for more messages

    async def _run(
        self, agreement: Agreement, running: _Running, credentials: Credentials | None
    ) -> None:
        terms = agreement.terms
        if credentials is None:
            self._fault(agreement, "the job's sealed secrets did not arrive")
            return
        self._tell(agreement, JobState.TRANSFERRING, "fetching the image and inputs")
        fetching = self.market.now_ms()
        sources = Sources(net=self.market.net, buyer=PublicKey(terms.buyer).peer_id, s3=self.s3)
        resume = terms.checkpoint.resume_from if terms.checkpoint is not None else None
        try:
            with trio.fail_after(self.timings.provider_fetch_timeout_s):
                job = await fetch_job_content(
                    self.market.store, terms.job, sources, resume_from=resume,
                    credentials=credentials, now=self._now(),
                )  # fmt: skip
        except (ContentError, trio.TooSlowError) as exc:
            why = f"could not fetch the job's content: {exc or 'timed out'}"
            if isinstance(exc, ContentError) and exc.buyer_fault:
                self._bad_input(agreement, why, self.market.now_ms() - fetching)
            else:
                self._fault(agreement, why)
            return
        if running.stopped:  # asked while its content was on its way: nothing ran
            self._issue(
                agreement,
                usage=Usage(wall_ms=0, cpu_us=0),
                exit_reason=ExitReason.STOPPED,
                exit_code=-1,
            )
            return
        with self.db.atomic():  # one commit: started, and the status that says so queued
            self.db.mark_started(agreement.id, self.market.now_ms())
            self._tell(agreement, JobState.RUNNING, "container started")
        try:
            with self.market.store.holding(job_blobs(self.market.store, job, resume)):
                result = await self.executor.run_job(
                    job,
                    terms.resources,
                    job_id=running.job_id,
                    checkpoint=terms.checkpoint,
                    elastic=terms.elastic,
                )
        except CapacityExceeded as exc:
            self._fault(agreement, str(exc))
            return
        if result.start_s is not None:
            self.market.metrics.container_start.observe(result.start_s)
        if running.stopped and result.exit_reason is ExitReason.PREEMPTED:  # it was stopped
            result = dataclasses.replace(result, exit_reason=ExitReason.STOPPED)
        if terms.job.output_to is not None and result.outputs:
            outputs = await upload_outputs(
                self.market.store, result.outputs, output_path=job.output_path,
                output_to=terms.job.output_to, s3=self.s3, keys=credentials.s3,
                now=self._now(),
            )  # fmt: skip
            result = dataclasses.replace(result, outputs=outputs)
        self._receipt(agreement, result)

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.market.now_ms() / 1000, UTC)

    def _tell(self, agreement: Agreement, state: JobState, detail: str = "") -> None:
        status = self.selling.status(
            agreement.id,
            state,
            nonce=self.market.nonce(),
            now_ms=self.market.now_ms(),
            detail=detail,
        )
        self._send(agreement, state, status.wire)

    def _send(self, agreement: Agreement, state: JobState, wire: bytes) -> None:
        """Record the job's new state and queue the message that says so, atomically."""
        peer = PublicKey(agreement.terms.buyer).peer_id
        with self.db.atomic():
            self.db.set_agreement_state(agreement.id, state.value)
            self.db.queue(agreement.id, peer, wire)
        self._wake.set()
        self._queued_now(agreement.id)
        self.market.touch()

    def _queued_now(self, agreement_id: bytes) -> None:
        wake = self._queued.pop(agreement_id, None)
        if wake is not None:
            wake.set()

    def _receipt(self, agreement: Agreement, result: JobResult) -> None:
        logs = tuple(
            DataRef(digest=digest, path=f"/dev/{name}", size=self.market.store.size(digest))
            for name, digest in (("stdout", result.stdout), ("stderr", result.stderr))
            if digest is not None
        )
        self._issue(
            agreement,
            usage=result.usage,
            exit_reason=result.exit_reason,
            exit_code=result.exit_code,
            outputs=result.outputs,
            logs=logs,
            truncated_logs=result.truncated_logs,
            checkpoint=result.checkpoint,
        )

    def _fault(self, agreement: Agreement, why: str) -> None:
        log.warning("job %s: provider fault: %s", agreement.id.hex()[:16], why)
        self._tell(agreement, JobState.PROVIDER_FAULT, why)  # the receipt cannot say why
        self._issue(
            agreement,
            usage=Usage(wall_ms=0, cpu_us=0),
            exit_reason=ExitReason.PROVIDER_FAULT,
            exit_code=-1,
        )

    def _bad_input(self, agreement: Agreement, why: str, wall_ms: int) -> None:
        """The job named content that could not be had: the buyer's fault; it pays for the
        time the reservation was held (spec/settlement.md)."""
        log.warning("job %s: bad input: %s", agreement.id.hex()[:16], why)
        self._tell(agreement, JobState.FAILED, why)
        self._issue(
            agreement,
            usage=Usage(wall_ms=wall_ms, cpu_us=0),
            exit_reason=ExitReason.BAD_INPUT,
            exit_code=-1,
        )

    def _issue(self, agreement: Agreement, **receipt: Any) -> None:  # noqa: ANN401
        signed = self.selling.issue_receipt(
            agreement.id, nonce=self.market.nonce(), now_ms=self.market.now_ms(), **receipt
        )
        usage = signed.payload.usage
        self.market.metrics.metered(cpu_us=usage.cpu_us, wall_ms=usage.wall_ms)
        with self.db.atomic():
            self.db.save_receipt(agreement.id, signed.wire)
            self._send(agreement, JobState.RECEIPTED, signed.wire)
        self._invite()  # its capacity is free again

    def set_quotas(self, quotas: Quotas) -> None:
        """Apply new quotas from now on (jobs held keep running); bids a looser quota
        admits now are invited."""
        self.config = dataclasses.replace(self.config, quotas=quotas)
        self.selling.quotas = quotas
        self._invite()
        self.market.touch()  # the dashboard shows the groups

    def quota_use(self) -> list[tuple[Quota, GroupUse]]:
        """Each quota group with what it holds and spent now."""
        feed_spend(self.selling, self.db, self.market.now_ms())
        return group_uses(self.selling)

    def _invite(self) -> None:
        """Invite the waiting bids our free capacity and the quotas admit now."""
        if self._nursery is not None:
            feed_spend(self.selling, self.db, self.market.now_ms())
            self._nursery.start_soon(send_invitations, self.market, self.selling)

    def _stop(self, agreement_id: bytes, buyer: PeerId) -> bool:
        """Stop a running job for its buyer (spec/peer.md rule 13); False if there is none."""
        running = self._running.get(agreement_id)
        if running is None or PublicKey(running.agreement.terms.buyer).peer_id != buyer:
            return False
        running.stopped = True
        self.executor.preempt(running.job_id)  # False before it starts: _run checks the flag
        log.info("job %s: stopping at its buyer's request", running.job_id)
        return True

    def _live_log(self, agreement_id: bytes, buyer: PeerId, name: str, offset: int) -> bytes | None:
        """A running job's log from ``offset`` for its buyer (spec/peer.md rule 14)."""
        running = self._running.get(agreement_id)
        if running is None or PublicKey(running.agreement.terms.buyer).peer_id != buyer:
            return None
        return self.executor.live_log(running.job_id, name, offset, CHUNK)

    async def _serve_ping(self, raw: Stream) -> None:
        stream = FramedStream(raw)
        asked = read_control(await stream.receive_frame())
        agreement_id = bytes(asked.get("agreement", b""))
        job = self.selling.jobs.get(agreement_id)
        agreement = self.selling.agreements.get(agreement_id)
        mine = agreement is not None and PublicKey(agreement.terms.buyer).peer_id == raw.remote_peer
        await stream.send_frame(control(state=job.state.value if job and mine else None))

    # -- the outbox --------------------------------------------------------------------

    async def _deliver_loop(self) -> None:
        assert self._nursery is not None
        while True:
            self._wake = trio.Event()
            # One lane per job: its messages go in order, and jobs do not wait for each other.
            for lane in {(peer, job) for _, job, peer, _ in self.db.outbox()} - self._delivering:
                self._delivering.add(lane)
                self._nursery.start_soon(self._deliver_to, lane)
            with trio.move_on_after(self.timings.retry_s):
                await self._wake.wait()

    async def _deliver_to(self, lane: tuple[str, bytes]) -> None:
        """Deliver one job's queued messages to its buyer in order, on one stream while the
        job runs, kept for the next job afterwards (node/market/joblink.py); stop at the
        first that fails."""
        peer, agreement_id = lane
        delivered = False
        try:
            async with self.market.job_links.borrow(PeerId(peer)) as link:
                delivered = await self._deliver_lane(lane, link)
        finally:
            self._delivering.discard(lane)
            self._queued.pop(agreement_id, None)
            if delivered:  # a message queued while we delivered goes now, not at the retry
                self._wake.set()

    async def _deliver_lane(self, lane: tuple[str, bytes], link: JobLink) -> bool:
        """Deliver the lane's messages until its job has ended and none is left (True), or
        one failed (False)."""
        agreement_id = lane[1]
        while True:
            # Taken before looking: a message queued after it wakes us.
            queued = self._queued.setdefault(agreement_id, trio.Event())
            items = _in_lane(self.db.outbox(), lane)
            if not items and agreement_id not in self._running:
                return True
            if not items:  # the job runs: its next status or receipt comes on this stream
                await queued.wait()
            for item_id, _, _, wire in items:
                if not await self._deliver(item_id, agreement_id, link, wire):
                    return False

    async def _deliver(self, item_id: int, agreement_id: bytes, link: JobLink, wire: bytes) -> bool:
        try:
            is_receipt = isinstance(open_signed(wire).payload, UsageReceipt)
        except ProtocolError as exc:
            self.db.quarantine("outbox", item_id, f"unreadable: {exc}", self.market.now_ms())
            return True  # the next message may go

        try:
            with trio.fail_after(self.timings.delivery_timeout_s):
                answer = await link.ask(wire)
            read_control(answer)  # raises PeerRefused for an error answer
            if is_receipt:  # the answer is the countersigned receipt
                # Acknowledged to no one: its fsync may leave the event loop to the next job.
                async with self.db.synced_off_loop():
                    self._settle(item_id, answer)
            else:
                self.db.delivered(item_id)
            return True
        except PeerRefused as exc:
            final = not is_receipt or exc.reason in {r.value for r in _FINAL_REFUSALS}
            log.warning(
                "%s refused %s for %s: %s",
                link.peer,
                "receipt" if is_receipt else "status",
                agreement_id.hex()[:16],
                exc,
            )
            if final:
                self.db.delivered(item_id)
            return final
        except (NetworkError, trio.TooSlowError, ProtocolError) as exc:
            log.info("delivery to %s failed, will retry: %s", link.peer, exc)
            return False

    def _settle(self, item_id: int, countersigned: bytes) -> None:
        settled, entry = self.selling.receive_countersigned(countersigned)
        receipt = self.db.receipt(entry.agreement_id)
        assert receipt is not None  # saved when it was queued
        with self.db.atomic():
            self.db.settle(entry, receipt[0], countersigned, self.market.now_ms())
            self.db.set_agreement_state(entry.agreement_id, JobState.SETTLED.value)
            self.db.delivered(item_id)
        self.market.on_settled(self.selling.agreements[entry.agreement_id], settled)
        self.market.touch()

    # -- restart -----------------------------------------------------------------------

    def _restore(self) -> None:
        """Take back our offers (so that :meth:`_post_offer` cancels them where they are
        still held) and unsettled agreements; a job the crash interrupted ends as our fault."""
        now = self.market.now_ms()
        for order_id, kind, wire, expires_ms, _ in self.db.orders():
            if kind != "offer" or expires_ms <= now:
                continue
            try:
                self.market.trader.repost(open_signed(wire, Offer), now_ms=now)
            except ProtocolError as exc:
                self.db.quarantine("orders", order_id, f"unreadable offer: {exc}", now)
        for row in self.db.agreements():
            if row.role != "provider":
                continue
            try:
                state = JobState(row.state)
                agreement = Agreement.from_wire(row.wire)
            except (ProtocolError, ValueError) as exc:
                reason = f"unreadable agreement: {exc}"
                self.db.quarantine("agreements", row.id, reason, self.market.now_ms())
                continue
            if state in (JobState.SETTLED, JobState.ERROR):
                continue
            self.selling.resume(agreement, state)
            if state in (JobState.AGREED, JobState.TRANSFERRING, JobState.RUNNING):
                started = " after its container started" if row.started_ms else ""
                self._fault(agreement, f"interrupted by a provider restart{started}")


def _in_lane(
    items: Iterable[tuple[int, bytes, str, bytes]], lane: tuple[str, bytes]
) -> list[tuple[int, bytes, str, bytes]]:
    return [item for item in items if (item[2], item[1]) == lane]
