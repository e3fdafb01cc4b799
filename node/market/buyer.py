"""The buyer role of a node: from ``cx run`` to a countersigned receipt.

A job (what the user asked for, one row in ``jobs``) becomes a signed bid. The bid matches
locally against the node's book, now or when a fitting offer arrives by gossip; the buyer
proposes to the best provider, and on reject, bad evidence or silence moves to the next.
After the agreement it follows the job by heartbeat; a provider that stops answering is
declared at fault (it is paid nothing) and the job is bid again, from its last checkpoint if
a receipt carried one. A preempted job is bid again the same way. Statuses and the receipt
arrive on ``/cx/job/1``; the buyer fetches the outputs and logs the receipt names, checks
them (each blob against its digest), and only then countersigns and settles.

Every step is written to the database before it is acknowledged, so a restarted buyer
resumes: standing bids rest again, agreements in flight are followed again.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import UTC, datetime
from typing import Any

import trio

from attest.errors import EvidenceError
from attest.evidence import TPM_KIND, verify_evidence
from node.market import peering
from node.market.gossip import Market
from node.market.joblink import JobLink, JobLinks
from node.market.livelogs import ask_logs
from node.market.request import JobRequest, RequestError, bid_from_request, parse_request
from node.market.secrets import Vault, lost_secrets, send_secrets
from node.market.stopping import ask_stop
from node.net.transport import (
    FramedStream,
    NetworkError,
    PeerId,
    Stream,
)
from node.net.wire import (
    BIDS_TOPIC,
    INVITE,
    JOB,
    NEGOTIATE,
    PING,
    PeerRefused,
    control,
    read_control,
    request,
)
from node.storage import transfer
from node.storage.db import Database, JobRow
from node.storage.jobdata import Credentials
from node.tpm import attestor as attestation
from protocol.book import Match
from protocol.buying import Buying
from protocol.encoding import decode
from protocol.envelope import MessageId, Signed, open_signed
from protocol.errors import DecodeError, ProtocolError, Reason
from protocol.identity import PrivateKey, PublicKey
from protocol.job import END_STATE, ENDED
from protocol.messages import (
    Accept,
    Bid,
    Checkpoint,
    DataRef,
    ExitReason,
    JobState,
    JobStatus,
    UsageReceipt,
)
from protocol.negotiation import Agreement, terms_hash
from protocol.pricing import Rung, ladder
from protocol.quotas import held_back, why_rejected
from protocol.units import credits

__all__ = ["FINAL_STATES", "JOB_STATES", "RUNNING_STATES", "WAITING_STATES", "Buyer"]

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5  # agreements per job before the buyer stops bidding for it again

# The states of a buyer's job (its event log names them).
JOB_STATES = (
    "waiting",
    "negotiating",
    "agreed",
    "transferring",
    "running",
    "succeeded",
    "failed",
    "timed-out",
    "preempted",
    "provider-fault",
    "receipted",
    "settled",
    "cancelled",
    "error",
)
WAITING_STATES = frozenset({"waiting", "negotiating"})  # its bid looks for a provider
RUNNING_STATES = frozenset({"agreed", "transferring", "running"})  # a provider has it
# States a job never leaves. Not ``preempted`` or ``provider-fault`` (the node bids for the
# job again), nor ``settled`` (the receipt is recorded, then the job's end state follows).
FINAL_STATES = frozenset({"succeeded", "failed", "timed-out", "cancelled", "error"})
_RETRY = frozenset({ExitReason.PREEMPTED, ExitReason.PROVIDER_FAULT})
# A provider abandoned for silence is proposed to again after this long even if its fault
# receipt never arrives (a restarted node behind NAT may not reach us): spec/peer.md rule 10.
ABANDON_COOL_OFF_S = 60.0


class Buyer:
    def __init__(self, market: Market, key: PrivateKey, trust: attestation.AkTrust) -> None:
        self.market = market
        self.key = key
        self.trust = trust
        self.buying = Buying(market.trader)
        self.timings = market.timings
        self._nursery: trio.Nursery | None = None
        self._bid_jobs: dict[bytes, str] = {}  # bid id -> job id
        self._negotiating: set[bytes] = set()  # bid ids
        # matches the book made for a bid while it was negotiating (a new offer arrived):
        # the bid left the book with them, so they are its next candidates
        self._arrived: dict[bytes, list[Match]] = {}
        self._followed: dict[bytes, trio.Event] = {}  # agreement id -> job over
        self._held: dict[bytes, Signed[Bid]] = {}  # bid id -> bid proposed at once, not gossiped
        self.vault = Vault()  # the jobs' registry logins and S3 keys, in memory only
        self.distrusted: set[bytes] = set()  # providers whose work score a check refuted
        self.links = JobLinks(market.net, NEGOTIATE)  # negotiate streams kept open

    @property
    def db(self) -> Database:
        return self.market.db

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:  # noqa: ANN401
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self.links.run)
            self.market.on_match = self._on_match
            self.market.on_rescored = self._rematch_waiting
            self.market.net.serve(JOB, self._serve_job)
            self.market.net.serve(INVITE, self._serve_invite)
            self._restore()
            task_status.started()
            await trio.sleep_forever()

    # -- jobs --------------------------------------------------------------------------

    def _event(self, job_id: str, state: str, detail: str = "") -> None:
        self.db.add_event(job_id, self.market.now_ms(), state, detail)
        log.info("job %s: %s %s", job_id, state, detail)
        self.market.touch()

    async def submit(self, request: JobRequest, credentials: Credentials | None = None) -> JobRow:
        """Record a resolved request as a new job and bid for it; matching and negotiation
        continue in the background. ``credentials`` (the secrets the request's job names)
        stay in memory, never in the database.

        Raises:
            RequestError: the request cannot become a bid.
        """
        bid_from_request(request)  # refuse a request that makes no bid before storing it
        now = self.market.now_ms()
        job = JobRow(
            id=self.market.nonce(8).hex(),
            name=request.name,
            request=request.to_json(),
            state="waiting",
            created_ms=now,
            updated_ms=now,
        )
        bid = self.bid_of(job)
        if credentials is not None:
            self.vault.keep(job.id, credentials)
        with self.db.atomic():  # a job is never stored without its bid
            self.db.add_job(job)
            self._event(job.id, "waiting", "bid posted")
            posted = self._post(job.id, bid)
        await self._announce(*posted)
        if request.deadline_ms is not None and self._nursery is not None:
            self._nursery.start_soon(self._climb, job.id)
        return self._row(job.id)

    def bid_of(self, job: JobRow) -> Bid:
        """The bid a job's request makes now (the last one posted may add a checkpoint):
        with a deadline, at the ladder's current limit."""
        bid = bid_from_request(parse_request(job.request))
        rung = self.rung(job)
        return bid if rung is None else dataclasses.replace(bid, max_prices=rung.limit)

    def rung(self, job: JobRow) -> Rung | None:
        """Where a job with a deadline stands on its price ladder; None without one."""
        request = parse_request(job.request)
        if request.deadline_ms is None:
            return None
        return ladder(
            bid_from_request(request).max_prices,
            created_ms=job.created_ms,
            deadline_ms=request.deadline_ms,
            now_ms=self.market.now_ms(),
        )

    async def _climb(self, job_id: str) -> None:
        """Raise a deadline's bid at each rung of its ladder while the job waits."""
        while (rung := self._waiting_rung(job_id)) is not None and rung.next_rise_ms:
            await trio.sleep(max(0, rung.next_rise_ms - self.market.now_ms()) / 1000)
            job = self.db.job(job_id)
            if job is None or job.state not in WAITING_STATES:
                return
            if job.bid_id is None or job.bid_id in self._negotiating:
                continue  # its bid is being proposed: the next rung re-posts it
            bid = self.bid_of(job)
            cancel = self.buying.trader.cancel(
                MessageId(job.bid_id), nonce=self.market.nonce(), now_ms=self.market.now_ms()
            )
            self.db.drop_order(job.bid_id)
            await self.market.publish(cancel, topic=BIDS_TOPIC)
            price = credits(bid.max_prices.cpu_core_hour)
            self._event(job_id, "waiting", f"limit raised to {price} credits per CPU core-hour")
            await self._announce(*self._post(job_id, bid))

    def quota_held(self, bid_id: bytes) -> str | None:
        """Which providers' quotas hold the bid back, in one line (protocol/quotas.py)."""
        return held_back(self.buying.over_quota.get(MessageId(bid_id), {}))

    def _waiting_rung(self, job_id: str) -> Rung | None:
        """The ladder of a job that still waits (None: no deadline, gone, or unreadable:
        restoring sets such a row aside)."""
        job = self.db.job(job_id)
        if job is None or job.state not in WAITING_STATES:
            return None
        try:
            return self.rung(job)
        except RequestError:
            return None

    def _row(self, job_id: str) -> JobRow:
        job = self.db.job(job_id)
        if job is None:
            raise KeyError(f"no job {job_id}")
        return job

    def _post(self, job_id: str, bid: Bid) -> tuple[Signed[Bid], list[Match]]:
        order, matches = self.buying.trader.post(
            bid,
            nonce=self.market.nonce(),
            now_ms=self.market.now_ms(),
            ttl_ms=self.timings.bid_ttl_ms,
        )
        with self.db.atomic():
            self.db.save_order(order.id, "bid", order.wire, order.expires_ms, job_id)
            self.db.update_job(job_id, bid_id=order.id)
        self._bid_jobs[order.id] = job_id
        self.market.metrics.matched(len(matches))
        return order, matches

    async def _announce(self, order: Signed[Bid], matches: list[Match]) -> None:
        """Propose to the offers the bid matched in our book; gossip it now if it matched
        none, else only if no agreement comes of them (spec/peer.md rule 3)."""
        for match in matches:
            self._on_match(match)
        if order.id in self._negotiating:
            self._held[order.id] = order
        else:
            await self.market.publish(order)

    async def cancel(self, job_id: str) -> bool:
        """Withdraw a job's bid if it has not been agreed yet; False if it is too late."""
        job = self.db.job(job_id)
        if job is None or job.bid_id is None or job.state not in WAITING_STATES:
            return False
        if job.bid_id in self._negotiating:
            return False
        cancel = self.buying.trader.cancel(
            MessageId(job.bid_id), nonce=self.market.nonce(), now_ms=self.market.now_ms()
        )
        self.db.drop_order(job.bid_id)
        self._event(job_id, "cancelled", "bid withdrawn")
        await self.market.publish(cancel, topic=BIDS_TOPIC)
        return True

    async def stop(self, job_id: str) -> bool:
        """Ask the provider of an agreed or running job to stop it (node/market/stopping.py);
        its receipt (exit reason ``stopped``) then ends it. False if it is not under way.

        Raises:
            NetworkError: the provider could not be reached.
        """
        job = self.db.job(job_id)
        if job is None or job.state not in RUNNING_STATES or job.agreement_id is None:
            return False
        try:
            await ask_stop(self.market.net, PeerId(job.provider or ""), job.agreement_id)
        except PeerRefused:
            return False  # it ended meanwhile: its receipt is on its way
        self._event(job_id, job.state, "asked the provider to stop it")
        return True

    async def live_logs(self, job_id: str, offsets: tuple[int, int]) -> tuple[bytes, bytes]:
        """What a job under way has written to stdout and stderr since ``offsets``
        (node/market/livelogs.py); nothing when no provider runs it now.

        Raises:
            NetworkError: the provider could not be reached.
        """
        job = self.db.job(job_id)
        if job is None or job.state not in RUNNING_STATES or job.agreement_id is None:
            return b"", b""
        try:
            return await ask_logs(
                self.market.net, PeerId(job.provider or ""), job.agreement_id, offsets
            )
        except PeerRefused:
            return b"", b""  # it ended meanwhile: its receipt brings the whole logs

    # -- negotiation -------------------------------------------------------------------

    def _on_match(self, match: Match) -> None:
        bid_id = match.bid.id
        if bid_id in self._negotiating:
            self._arrived.setdefault(bid_id, []).append(match)
            return
        if self._nursery is None:
            return
        self._negotiating.add(bid_id)
        self._nursery.start_soon(self._negotiate, match)

    def _rematch_waiting(self) -> None:
        """Reputation scores changed: a bid that waits for a reputable provider (its
        ``min_reputation``) may match an offer it could not before."""
        now = self.market.now_ms()
        resting = self.buying.trader.book.bids
        for bid_id in [b for b in self._bid_jobs if b in resting and b not in self._negotiating]:
            for match in self.buying.next_match(MessageId(bid_id), now_ms=now):
                self._on_match(match)

    async def _negotiate(self, match: Match | None) -> None:
        assert match is not None
        bid_id = match.bid.id
        job_id = self._bid_jobs.get(bid_id)
        try:
            if job_id is not None and lost_secrets(match.bid.payload.job, self.vault.get(job_id)):
                self._event(job_id, "error", "its secrets were held in memory only and the node "
                            "restarted; submit the job again")  # fmt: skip
                return
            tried = False
            while match is not None and job_id is not None:
                if not self.buying.held_back(match):  # refused for a quota: not again
                    tried = True
                    if await self._try(job_id, match) is not None:
                        return
                match = self._next_candidate(bid_id)
            if job_id is not None and tried:
                why = self.quota_held(bid_id) or "no provider agreed yet; the bid waits for offers"
                self._event(job_id, "waiting", why)
            await self._publish_held(bid_id)
        except Exception:
            # Top of a per-bid task: the node keeps serving; the bid rests for new offers.
            log.exception("negotiation for bid %s failed", bid_id.hex()[:16])
            await self._publish_held(bid_id)
        finally:
            self._held.pop(bid_id, None)  # agreed, or its job ended: never gossiped
            self._negotiating.discard(bid_id)
            for unused in self._arrived.pop(bid_id, []):  # the offers get their capacity back
                self.buying.trader.book.give_back(unused.offer.id, unused.resources)

    async def _publish_held(self, bid_id: bytes) -> None:
        """Gossip a bid held back while it was proposed at once (spec/peer.md rule 3): no
        agreement came of it, so it rests, and other providers may invite it now."""
        held = self._held.pop(bid_id, None)
        if held is not None:
            await self.market.publish(held)

    async def _serve_invite(self, raw: Stream) -> None:
        """A provider invites one of our resting bids to its offer (node/market/invitations.py)."""
        stream = FramedStream(raw)
        try:
            wire = await stream.receive_frame()
            if wire is None:
                return
            match = self.buying.receive_invitation(wire, now_ms=self.market.now_ms())
        except ProtocolError as exc:
            await stream.send_frame(control(error=exc.reason.value, detail=str(exc)))
            return
        if match is None:
            await stream.send_frame(control(error="not-waiting", detail="the bid does not fit"))
            return
        self._on_match(match)
        await stream.send_frame(control(ok=True))

    def _next_candidate(self, bid_id: MessageId) -> Match | None:
        """A match that arrived during the last proposal, else the book's next one."""
        if arrived := self._arrived.get(bid_id):
            return arrived.pop(0)
        return next(iter(self.buying.next_match(bid_id, now_ms=self.market.now_ms())), None)

    async def _try(self, job_id: str, match: Match) -> Agreement | None:
        """Propose ``match``; the agreement, or None if this provider would not or could not."""
        provider = PublicKey(match.provider)
        who = provider.peer_id
        self._event(job_id, "negotiating", f"proposing to {who}")
        proposal = self.buying.propose(
            match,
            nonce=self.market.nonce(),
            attestation_nonce=self.market.nonce(32),
            now_ms=self.market.now_ms(),
        )
        terms = proposal.payload.terms
        accepted = False
        try:
            with trio.fail_after(self.timings.negotiation_timeout_s):
                await peering.reach(self.market, who)
                # A stream kept from the last negotiation with this provider, if one is
                # idle (node/market/joblink.py): kept again after a clean end.
                async with self.links.borrow(who) as link:
                    answer = await link.ask(proposal.wire)
                    reply = self.buying.receive_reply(answer, now_ms=self.market.now_ms())
                    if not isinstance(reply.payload, Accept):
                        why = why_rejected(reply.payload)
                        self._event(job_id, "negotiating", f"{who} rejected: {why}")
                        self.market.metrics.negotiation("buyer", "rejected")
                        return None
                    accepted = True
                    await self._check_evidence(provider, terms, reply.payload.evidence)
                    agreement: Agreement = self.buying.agree(proposal.id)
                    self._agreed(job_id, match, agreement)  # durable before the provider runs
                    self.market.metrics.negotiation("buyer", "agreed")
                    try:
                        read_control(await link.ask(agreement.to_wire(), retry=False))
                        await self._send_secrets(link, job_id, agreement, match)
                    except (NetworkError, PeerRefused) as exc:
                        log.warning("agreement %s unacknowledged (%s)", agreement.id.hex(), exc)
                        await link.aclose()  # not kept: the provider may wait for more
                    if (trade := self.buying.trade_print(proposal.id)) is not None:
                        await self.market.record_print(trade)
                    return agreement
        except (EvidenceError, attestation.EnrolmentError) as exc:
            self.buying.evidence_failed(proposal.id)
            self._event(job_id, "negotiating", f"{who}: evidence refused: {exc}")
            self.market.metrics.negotiation("buyer", "failed")
        except (NetworkError, trio.TooSlowError, ProtocolError, PeerRefused) as exc:
            self._event(job_id, "negotiating", f"{who} did not agree: {exc or 'no answer'}")
            self.market.metrics.negotiation("buyer", "failed")
            if accepted:
                self.buying.evidence_failed(proposal.id)
            else:
                self.buying.negotiation_timed_out(proposal.id)
        return None

    async def _send_secrets(
        self, link: JobLink, job_id: str, agreement: Agreement, match: Match
    ) -> None:
        credentials, seal_key = self.vault.get(job_id), match.offer.payload.seal_key
        if agreement.terms.job.secrets and credentials is not None and seal_key is not None:
            assert link.stream is not None  # the agreement went on it
            await send_secrets(
                link.stream, self.key, agreement, seal_key, credentials,
                nonce=self.market.nonce(), now_ms=self.market.now_ms(),
            )  # fmt: skip

    async def _check_evidence(self, provider: PublicKey, terms: Any, evidence: Any) -> None:  # noqa: ANN401
        """Verify the accept's evidence against the bid's trust requirement.

        A TPM quote counts only from an AK that passed credential activation with this
        buyer: the first time, the buyer enrols the provider's TPM.
        """
        if (
            evidence is not None
            and evidence.kind == TPM_KIND
            and not self.trust.trusted(provider.raw)
        ):
            await attestation.enrol(
                self.market.net,
                provider.peer_id,
                provider,
                self.trust,
                self.key,
                self.market.now_ms(),
                entropy=self.market.entropy,
            )
        verify_evidence(
            evidence,
            terms.trust,
            provider_key=provider.raw,
            nonce=terms.attestation_nonce,
            terms_hash=terms_hash(terms),
            at=datetime.fromtimestamp(self.market.now_ms() / 1000, UTC),
            trusted_aks=self.trust.trusted(provider.raw),
        )

    def _agreed(self, job_id: str, match: Match, agreement: Agreement) -> None:
        terms = agreement.terms
        job = self._row(job_id)
        with self.db.atomic():
            self.db.save_agreement(
                agreement.id,
                role="buyer",
                wire=agreement.to_wire(),
                state=JobState.AGREED.value,
                peer=PublicKey(terms.provider).peer_id,
                job_id=job_id,
                created_ms=self.market.now_ms(),
            )
            self.db.update_job(
                job_id,
                agreement_id=agreement.id,
                provider=PublicKey(terms.provider).peer_id,
                attempts=job.attempts + 1,
                max_cost=terms.max_cost,
                prices=dataclasses.asdict(terms.prices),
            )
            self.db.drop_order(match.bid.id)
            self._event(
                job_id,
                "agreed",
                f"with {PublicKey(terms.provider).peer_id}, "
                f"max cost {credits(terms.max_cost)} credits",
            )
        self._follow(agreement)

    # -- following the job -------------------------------------------------------------

    def _follow(self, agreement: Agreement) -> None:
        over = self._followed.setdefault(agreement.id, trio.Event())
        assert self._nursery is not None
        self._nursery.start_soon(self._heartbeat, agreement, over)

    async def _heartbeat(self, agreement: Agreement, over: trio.Event) -> None:
        """Ask the provider about the job until it ends; silence means provider fault."""
        peer = PublicKey(agreement.terms.provider).peer_id
        missed = 0
        while not over.is_set():
            with trio.move_on_after(self.timings.heartbeat_s):
                await over.wait()
            if over.is_set():
                return
            try:
                with trio.fail_after(self.timings.heartbeat_s * 2):
                    ping = control(agreement=agreement.id)
                    answer = read_control(await request(self.market.net, peer, PING, ping))
                missed = 0 if answer.get("state") is not None else self.timings.missed_heartbeats
            except (NetworkError, trio.TooSlowError, PeerRefused):
                missed += 1
            if missed >= self.timings.missed_heartbeats and not over.is_set():
                await self._provider_lost(agreement, f"{peer} stopped answering heartbeats")
                return

    async def _provider_lost(self, agreement: Agreement, why: str) -> None:
        if self.buying.jobs[agreement.id].state in ENDED:
            return  # its end came meanwhile (the provider's own fault report, a receipt)
        self.buying.abandon(agreement.id)
        self.buying.trader.reputation[agreement.terms.provider] = -1  # not again, with this buyer
        if self._nursery is not None:  # ... for a while: its fault receipt may never reach us
            self._nursery.start_soon(self._forgive_later, agreement.terms.provider)
        self.db.set_agreement_state(agreement.id, JobState.PROVIDER_FAULT.value)
        self._followed[agreement.id].set()
        row = self.db.agreement(agreement.id)
        if row is not None and row.job_id is not None:
            # no longer the job's attempt: a receipt that still comes for it is a late one
            self.db.update_job(row.job_id, agreement_id=None)
            self._event(row.job_id, "provider-fault", why)
            await self._bid_again(row.job_id, checkpoint=None)

    async def _bid_again(self, job_id: str, checkpoint: str | None) -> None:
        """Bid for the job again after a fault or preemption, resuming from ``checkpoint``."""
        job = self._row(job_id)
        if job.attempts >= MAX_ATTEMPTS:
            self._event(job_id, "error", f"gave up after {job.attempts} attempts; see `cx jobs`")
            return
        bid = self.bid_of(job)
        if checkpoint is not None:
            bid = dataclasses.replace(
                bid,
                checkpoint=dataclasses.replace(
                    bid.checkpoint or Checkpoint(), resume_from=checkpoint
                ),
            )
        self._event(
            job_id,
            "waiting",
            "bidding again" + (f" from checkpoint {checkpoint[:19]}" if checkpoint else ""),
        )
        await self._announce(*self._post(job_id, bid))

    # -- statuses and receipts from providers -----------------------------------------

    async def _serve_job(self, raw: Stream) -> None:
        """Answer a job's statuses and receipt, one frame each, for as long as the provider
        keeps the stream (node/market/joblink.py)."""
        stream = FramedStream(raw)
        try:
            while (frame := await stream.receive_frame()) is not None:
                await stream.send_frame(await self._job_message(frame, raw.remote_peer))
        except NetworkError as exc:
            log.info("job stream from %s ended: %s", raw.remote_peer, exc)

    async def _job_message(self, frame: bytes, peer: PeerId) -> bytes:
        if _is_control(frame):  # a receipt summary to sign (spec/reputation.md rule 6)
            return await self.market.on_summary_ask(frame, peer)
        try:
            message: Signed[Any] = open_signed(frame)
            if isinstance(message.payload, JobStatus):
                self._status(frame, message.payload)
                return control(ok=True)
            if isinstance(message.payload, UsageReceipt):
                return await self._receipt(frame, message, peer)
            return control(error=Reason.WRONG_TYPE.value, detail=message.type)
        except ProtocolError as exc:
            log.warning("refused %s from %s: %s", "job message", peer, exc)
            return control(error=exc.reason.value, detail=str(exc))
        except transfer.TransferError as exc:
            return control(error="outputs-unavailable", detail=str(exc))

    def _status(self, wire: bytes, payload: JobStatus) -> None:
        job = self.buying.jobs.get(payload.agreement_id)
        if job is not None and job.state in (JobState.PROVIDER_FAULT, payload.state):
            # We gave up on this provider (only its zero receipt still matters), or we stored
            # this status before a crash cut off our answer and the outbox sends it again.
            return
        try:
            status = self.buying.receive_status(wire, now_ms=self.market.now_ms())
        except ProtocolError as exc:
            if exc.reason is Reason.REPLAYED:
                return  # a retry of one we took: its acknowledgement was lost
            raise
        agreement_id = status.payload.agreement_id
        with self.db.atomic():  # one commit: the agreement's state and the job's event
            self.db.set_agreement_state(agreement_id, status.payload.state.value)
            row = self.db.agreement(agreement_id)
            if row is not None and row.job_id is not None:
                self._event(row.job_id, status.payload.state.value, status.payload.detail)

    async def _receipt(self, wire: bytes, message: Signed[Any], peer: PeerId) -> bytes:
        """Fetch and check what the receipt names, then countersign and settle it."""
        receipt: UsageReceipt = message.payload
        stored = self.db.receipt(receipt.agreement_id)
        if stored is not None and stored[1] is not None:
            return bytes(stored[1])  # settled already; the provider missed our answer
        with trio.fail_after(self.timings.buyer_fetch_timeout_s):
            for ref in (*receipt.outputs, *receipt.logs):
                if ref.url is None:  # the others went to the job's object-store prefix
                    await transfer.fetch_blob(
                        self.market.net, self.market.store, ref.digest, [peer]
                    )
            if receipt.checkpoint is not None:
                await transfer.fetch_blob(
                    self.market.net, self.market.store, receipt.checkpoint, [peer]
                )
        countersigned = self.buying.receive_receipt(wire, now_ms=self.market.now_ms())
        agreement = self.buying.agreements[receipt.agreement_id]
        entry = countersigned.ledger_entry(agreement)
        row = self.db.agreement(receipt.agreement_id)
        job_id = row.job_id if row is not None else None
        with self.db.atomic():
            self.db.settle(entry, wire, countersigned.to_wire(), self.market.now_ms())
            self.db.set_agreement_state(agreement.id, JobState.SETTLED.value)
            if job_id is not None:
                self._record_outcome(job_id, receipt)
        self.market.on_settled(agreement, countersigned)
        if agreement.id in self._followed:
            self._followed[agreement.id].set()
        if receipt.exit_reason is ExitReason.PROVIDER_FAULT:
            self._forgive(agreement.terms.provider)
        if (
            job_id is not None
            and receipt.exit_reason in _RETRY
            and self._current(job_id, agreement.id)
        ):
            await self._bid_again(job_id, receipt.checkpoint)
        return countersigned.to_wire()

    async def _forgive_later(self, provider: bytes) -> None:
        await trio.sleep(ABANDON_COOL_OFF_S)
        self._forgive(provider)

    def _forgive(self, provider: bytes) -> None:
        """A provider we abandoned admitted the fault (a crash, a restart): propose to it
        again, and let the bids that waited for want of it try it now (spec/peer.md 10)."""
        trader = self.buying.trader
        if trader.reputation.get(provider, 0) >= 0:  # a score, not our verdict: keep it
            return
        if provider in self.distrusted:  # it lied about its work score: no fault forgives that
            return
        del trader.reputation[provider]
        now = self.market.now_ms()
        for bid_id, job_id in list(self._bid_jobs.items()):
            job = self.db.job(job_id)
            if bid_id in trader.book.bids and job is not None and job.state == "waiting":
                for match in self.buying.next_match(MessageId(bid_id), now_ms=now):
                    self._on_match(match)

    def _current(self, job_id: str, agreement_id: bytes) -> bool:
        """Is this agreement still the job's live attempt (not one abandoned before)?"""
        job = self.db.job(job_id)
        return job is not None and job.agreement_id == agreement_id

    def _record_outcome(self, job_id: str, receipt: UsageReceipt) -> None:
        job = self._row(job_id)
        if not self._current(job_id, receipt.agreement_id):
            paid = f"paid {credits(receipt.cost)} credits"
            self._event(job_id, job.state, f"late receipt settled: {paid}")
            return
        self.db.update_job(
            job_id,
            cost=(job.cost or 0) + receipt.cost,
            exit_reason=receipt.exit_reason.value,
            exit_code=int(receipt.exit_code),
            outputs=_refs(receipt.outputs),
            logs=_refs(receipt.logs),
            checkpoint=receipt.checkpoint,
        )
        paid = f"paid {credits(receipt.cost)} credits"
        self._event(job_id, "settled", f"receipt countersigned: {paid}")
        if receipt.exit_reason not in _RETRY:
            self.vault.forget(job_id)
        state = END_STATE[receipt.exit_reason].value
        self._event(job_id, state, f"exit {int(receipt.exit_code)} ({receipt.exit_reason.value})")

    # -- restart -----------------------------------------------------------------------

    def _restore(self) -> None:
        """Rest our bids again and follow the agreements still in flight. A stored row that
        does not read is set aside (its job ends in ``error``, saying so); the rest go on."""
        now = self.market.now_ms()
        for order_id, kind, wire, expires_ms, job_id in self.db.orders():
            if kind != "bid" or job_id is None:
                continue
            if expires_ms <= now:
                self.db.drop_order(order_id)
                continue
            try:
                matches = self.buying.trader.repost(open_signed(wire, Bid), now_ms=now)
            except ProtocolError as exc:
                self._set_aside("orders", order_id, job_id, f"its stored bid ({exc})")
                continue
            self._bid_jobs[order_id] = job_id
            for match in matches:
                self._on_match(match)
            if self._nursery is not None:
                self._nursery.start_soon(self._climb, job_id)  # returns at once without one
        for row in self.db.agreements():
            if row.role != "buyer":
                continue
            try:
                state = JobState(row.state)
                agreement = Agreement.from_wire(row.wire)
            except (ProtocolError, ValueError) as exc:
                self._set_aside("agreements", row.id, row.job_id, f"its agreement ({exc})")
                continue
            if state in (JobState.SETTLED, JobState.ERROR):
                continue
            self.buying.resume(agreement, state)
            if state not in ENDED and state is not JobState.RECEIPTED:
                self._follow(agreement)
        for job in self.db.jobs():
            if job.state == "negotiating":
                self._event(job.id, "waiting", "node restarted; the bid waits for offers")

    def _set_aside(self, table: str, key: bytes, job_id: str | None, what: str) -> None:
        self.db.quarantine(table, key, f"unreadable: {what}", self.market.now_ms())
        if job_id is not None and self.db.job(job_id) is not None:
            self._event(job_id, "error", f"{what} could not be read; submit the job again")


def _refs(items: tuple[DataRef, ...]) -> list[dict[str, Any]]:
    return [
        {"path": r.path, "digest": r.digest, "size": r.size, **({"url": r.url} if r.url else {})}
        for r in items
    ]


def _is_control(frame: bytes) -> bool:
    """Is this a control frame rather than a signed message? A control frame decodes whole
    as one map; a signed message opens with 64 signature bytes, so it does not."""
    try:
        return isinstance(decode(frame), dict)
    except DecodeError:
        return False
