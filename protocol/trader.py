"""The sans-IO market participant: one per node, buyer and provider alike.

A :class:`Trader` turns received bytes into verified events and intents into bytes to send;
it never touches a socket, a clock or a random source: ``now_ms`` and nonces are arguments.
It owns the node's order book, its negotiations, its jobs' state machines and its ledger.
The trio node wraps it; tests drive two of them against each other with no event loop.

Buyer:    post(bid) -> propose(match) -> receive_reply(accept) -> [verify evidence] -> agree()
          -> receive_status(...) -> receive_receipt(receipt) -> countersigned receipt, settled
Provider: post(offer) -> receive_proposal() -> accept()/reject() -> receive_agreement()
          -> status(...) -> issue_receipt() -> receive_countersigned() -> settled
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from protocol.admission import AdmissionPolicy, ReplayGuard, admit
from protocol.book import Match, OrderBook
from protocol.envelope import MessageId, Signed, open_signed, seal
from protocol.errors import InvalidMessage, LocalProtocolError, Reason
from protocol.identity import PrivateKey, PublicKey
from protocol.job import END_STATE, JOB_TABLE, job_machine
from protocol.machine import Machine
from protocol.messages import (
    Accept,
    Bid,
    Cancel,
    DataRef,
    Evidence,
    ExitReason,
    JobState,
    JobStatus,
    Offer,
    Proposal,
    Reject,
    RejectReason,
    SignedInt,
    Usage,
    UsageReceipt,
)
from protocol.negotiation import (
    AGREEMENT_DOMAIN,
    Agreement,
    BuyerEvent,
    NegotiationState,
    ProviderEvent,
    buyer_machine,
    check_terms_against_offer,
    provider_machine,
    sign_terms,
    terms_bytes,
    terms_from_match,
)
from protocol.receipts import CountersignedReceipt, agreed_charge
from protocol.settlement import Ledger, LedgerEntry

__all__ = ["BuyerDeal", "ProviderDeal", "Trader"]

T = TypeVar("T")
NEGOTIATION_TTL_MS = 60_000


@dataclass(slots=True)
class BuyerDeal:
    match: Match
    proposal: Signed[Proposal]
    machine: Machine[NegotiationState, BuyerEvent] = field(default_factory=buyer_machine)
    accept: Signed[Accept] | None = None


@dataclass(slots=True)
class ProviderDeal:
    proposal: Signed[Proposal]
    machine: Machine[NegotiationState, ProviderEvent] = field(default_factory=provider_machine)


@dataclass(slots=True)
class Trader:
    key: PrivateKey
    policy: AdmissionPolicy = field(default_factory=AdmissionPolicy)
    book: OrderBook = field(default_factory=OrderBook)
    ledger: Ledger = field(default_factory=Ledger)
    reputation: dict[bytes, int] = field(default_factory=dict)
    guard: ReplayGuard = field(default_factory=ReplayGuard)
    buying: dict[MessageId, BuyerDeal] = field(default_factory=dict)
    selling: dict[MessageId, ProviderDeal] = field(default_factory=dict)
    agreements: dict[bytes, Agreement] = field(default_factory=dict)
    jobs: dict[bytes, Machine[JobState, JobState]] = field(default_factory=dict)
    refused: dict[MessageId, set[MessageId]] = field(default_factory=dict)  # bid -> offers

    @property
    def me(self) -> PublicKey:
        return self.key.public_key

    def _seal(self, payload: T, nonce: bytes, now_ms: int, ttl_ms: int) -> Signed[T]:
        return seal(self.key, payload, nonce=nonce, issued_ms=now_ms, expires_ms=now_ms + ttl_ms)

    def _open(self, wire: bytes, expect: type[T], now_ms: int) -> Signed[T]:
        msg = open_signed(wire, expect)
        admit(msg, now_ms, self.guard, self.policy)
        return msg

    # -- orders ----------------------------------------------------------------------

    def post(
        self, payload: Offer | Bid, *, nonce: bytes, now_ms: int, ttl_ms: int
    ) -> tuple[Signed[Any], list[Match]]:
        """Sign one of our own orders, rest it actively; returns it (to gossip) and matches."""
        order: Signed[Any] = self._seal(payload, nonce, now_ms, ttl_ms)
        return order, self._add(order, now_ms=now_ms, active=True)

    def receive_order(self, wire: bytes, *, now_ms: int) -> tuple[Signed[Any], list[Match]]:
        """Admit a gossiped offer, bid or cancel (the topic validator's work).

        Raises:
            DecodeError, InvalidMessage: the message must not be forwarded.
        """
        order: Signed[Any] = open_signed(wire)
        if order.type not in ("offer", "bid", "cancel"):
            raise InvalidMessage(Reason.WRONG_TYPE, f"{order.type} is not gossiped")
        admit(order, now_ms, self.guard, self.policy)
        if isinstance(order.payload, Cancel):
            self.book.cancel(order.payload.order_id, order.signer.raw)
            return order, []
        matches = self._add(order, now_ms=now_ms, active=False)
        for match in matches:
            if match.provider == self.me.raw:
                # A bid our offer could serve: the buyer proposes, and accept() reserves
                # then; holding capacity now would count it twice.
                self.book.release(match, rest_bid=True)
        return order, matches

    def _add(self, order: Signed[Any], *, now_ms: int, active: bool) -> list[Match]:
        add = self.book.add_offer if isinstance(order.payload, Offer) else self.book.add_bid
        return add(order, now_ms=now_ms, active=active, reputation=self.reputation)

    def cancel(self, order_id: MessageId, *, nonce: bytes, now_ms: int) -> Signed[Cancel]:
        if not self.book.cancel(order_id, self.me.raw):
            raise LocalProtocolError(Reason.WRONG_PARTY, "no such order of ours in the book")
        return self._seal(Cancel(order_id=order_id), nonce, now_ms, NEGOTIATION_TTL_MS)

    # -- buyer: negotiation ----------------------------------------------------------

    def propose(
        self, match: Match, *, nonce: bytes, attestation_nonce: bytes, now_ms: int
    ) -> Signed[Proposal]:
        if match.buyer != self.me.raw:
            raise LocalProtocolError(Reason.WRONG_PARTY, "only the bid's owner proposes")
        terms = terms_from_match(match, attestation_nonce=attestation_nonce, created_ms=now_ms)
        proposal = self._seal(Proposal(terms=terms), nonce, now_ms, NEGOTIATION_TTL_MS)
        deal = BuyerDeal(match=match, proposal=proposal)
        deal.machine.fire(BuyerEvent.SEND_PROPOSAL)
        self.buying[proposal.id] = deal
        return proposal

    def receive_reply(self, wire: bytes, *, now_ms: int) -> Signed[Accept] | Signed[Reject]:
        """A provider's accept or reject. After an accept, verify its evidence and call
        :meth:`agree` or :meth:`evidence_failed`; after a reject, :meth:`next_match`."""
        reply: Signed[Any] = open_signed(wire)
        if not isinstance(reply.payload, Accept | Reject):
            raise InvalidMessage(Reason.WRONG_TYPE, f"expected accept or reject, got {reply.type}")
        admit(reply, now_ms, self.guard, self.policy)
        deal = self.buying.get(MessageId(reply.payload.proposal_id))
        if deal is None:
            raise InvalidMessage(Reason.TERMS_MISMATCH, "reply to no proposal of ours")
        terms = deal.proposal.payload.terms
        if reply.signer.raw != terms.provider:
            raise InvalidMessage(Reason.WRONG_PARTY, "reply from someone else than the provider")
        if isinstance(reply.payload, Reject):
            deal.machine.fire(BuyerEvent.RECEIVE_REJECT, remote=True)
            self._refused(deal)
            return reply
        reply.signer.verify(AGREEMENT_DOMAIN, terms_bytes(terms), reply.payload.terms_signature)
        deal.machine.fire(BuyerEvent.RECEIVE_ACCEPT, remote=True)
        deal.accept = reply
        return reply

    def agree(self, proposal_id: MessageId) -> Agreement:
        """The evidence verified (or none was needed): sign the terms; send the result."""
        deal = self.buying[proposal_id]
        if deal.accept is None:
            raise LocalProtocolError(Reason.ILLEGAL_TRANSITION, "no accept to agree to")
        deal.machine.fire(BuyerEvent.EVIDENCE_VERIFIED)
        terms = deal.proposal.payload.terms
        agreement = Agreement.assemble(
            terms, sign_terms(self.key, terms), deal.accept.payload.terms_signature
        )
        self._start_job(agreement)
        return agreement

    def evidence_failed(self, proposal_id: MessageId) -> None:
        deal = self.buying[proposal_id]
        deal.machine.fire(BuyerEvent.EVIDENCE_FAILED)
        self._refused(deal)

    def negotiation_timed_out(self, proposal_id: MessageId) -> None:
        """Input event: the provider stayed silent. The bid rests for the next candidate."""
        deal = self.buying[proposal_id]
        deal.machine.fire(BuyerEvent.TIMEOUT)
        self._refused(deal)

    def _refused(self, deal: BuyerDeal) -> None:
        self.refused.setdefault(deal.match.bid.id, set()).add(deal.match.offer.id)
        self.book.release(deal.match, rest_bid=True)

    def next_match(self, bid_id: MessageId, *, now_ms: int) -> list[Match]:
        """The next candidate for a bid whose last proposal failed."""
        return self.book.rematch(
            bid_id,
            now_ms=now_ms,
            exclude=frozenset(self.refused.get(bid_id, ())),
            reputation=self.reputation,
        )

    # -- provider: negotiation -------------------------------------------------------

    def receive_proposal(self, wire: bytes, *, now_ms: int) -> Signed[Proposal]:
        """Admit a proposal and re-check its terms against our own offer; then call
        :meth:`accept` (with evidence when the terms demand trust) or :meth:`reject`."""
        proposal = self._open(wire, Proposal, now_ms)
        terms = proposal.payload.terms
        if proposal.signer.raw != terms.buyer:
            raise InvalidMessage(Reason.WRONG_PARTY, "a proposal is signed by its buyer")
        deal = ProviderDeal(proposal=proposal)
        deal.machine.fire(ProviderEvent.RECEIVE_PROPOSAL, remote=True)
        self.selling[proposal.id] = deal
        return proposal

    def accept(
        self, proposal_id: MessageId, *, evidence: Evidence | None, nonce: bytes, now_ms: int
    ) -> Signed[Accept] | Signed[Reject]:
        """Reserve capacity and accept; rejects instead if the terms no longer fit."""
        deal = self.selling[proposal_id]
        terms = deal.proposal.payload.terms
        offer = self.book.offers.get(MessageId(terms.offer_id))
        refusal: tuple[RejectReason, str] | None = None
        if offer is None:
            refusal = (RejectReason.UNKNOWN_ORDER, "that offer is no longer live")
        else:
            try:
                check_terms_against_offer(terms, offer.order, self.me)
                self.book.reserve(offer.order.id, terms.resources)
            except InvalidMessage as exc:
                refusal = (RejectReason.BAD_TERMS, str(exc))
            except LocalProtocolError as exc:
                refusal = (RejectReason.NO_CAPACITY, str(exc))
        if refusal is not None:
            return self.reject(proposal_id, *refusal, nonce=nonce, now_ms=now_ms)
        deal.machine.fire(ProviderEvent.SEND_ACCEPT)
        payload = Accept(
            proposal_id=proposal_id,
            terms_signature=sign_terms(self.key, terms),
            evidence=evidence,
        )
        return self._seal(payload, nonce, now_ms, NEGOTIATION_TTL_MS)

    def reject(
        self,
        proposal_id: MessageId,
        reason: RejectReason,
        detail: str = "",
        *,
        nonce: bytes,
        now_ms: int,
    ) -> Signed[Reject]:
        self.selling[proposal_id].machine.fire(ProviderEvent.SEND_REJECT)
        payload = Reject(proposal_id=proposal_id, reason=reason, detail=detail)
        return self._seal(payload, nonce, now_ms, NEGOTIATION_TTL_MS)

    def receive_agreement(self, wire: bytes) -> Agreement:
        agreement = Agreement.from_wire(wire)
        deal = next(
            (
                d
                for d in self.selling.values()
                if d.proposal.payload.terms == agreement.terms
                and d.machine.state is NegotiationState.ACCEPTED
            ),
            None,
        )
        if deal is None:
            raise InvalidMessage(Reason.TERMS_MISMATCH, "agreement to terms we did not accept")
        deal.machine.fire(ProviderEvent.RECEIVE_AGREEMENT, remote=True)
        self._start_job(agreement)
        return agreement

    def provider_timed_out(self, proposal_id: MessageId) -> None:
        """Input event: no agreement came after our accept. Capacity goes back."""
        deal = self.selling[proposal_id]
        was_accepted = deal.machine.state is NegotiationState.ACCEPTED
        deal.machine.fire(ProviderEvent.TIMEOUT)
        if was_accepted:
            terms = deal.proposal.payload.terms
            self.book.give_back(MessageId(terms.offer_id), terms.resources)

    # -- the job ---------------------------------------------------------------------

    def _start_job(self, agreement: Agreement) -> None:
        self.agreements[agreement.id] = agreement
        self.jobs[agreement.id] = job_machine()

    def status(
        self, agreement_id: bytes, state: JobState, *, nonce: bytes, now_ms: int, detail: str = ""
    ) -> Signed[JobStatus]:
        """Provider: move the job and sign the status event for the buyer."""
        self.jobs[agreement_id].fire(state)
        payload = JobStatus(agreement_id=agreement_id, state=state, detail=detail)
        return self._seal(payload, nonce, now_ms, NEGOTIATION_TTL_MS)

    def receive_status(self, wire: bytes, *, now_ms: int) -> Signed[JobStatus]:
        """Buyer: follow the provider's job status; it must follow the job table."""
        status = self._open(wire, JobStatus, now_ms)
        agreement = self._agreement_with(status.payload.agreement_id, status.signer)
        self.jobs[agreement.id].fire(status.payload.state, remote=True)
        return status

    def issue_receipt(
        self,
        agreement_id: bytes,
        *,
        usage: Usage,
        exit_reason: ExitReason,
        exit_code: int,
        outputs: tuple[DataRef, ...] = (),
        logs: tuple[DataRef, ...] = (),
        checkpoint: str | None = None,
        nonce: bytes,
        now_ms: int,
    ) -> Signed[UsageReceipt]:
        """Provider: sign the usage receipt; its cost follows from the terms.

        ``logs`` are the job's stdout and stderr blobs (paths ``/dev/stdout``,
        ``/dev/stderr``), so the buyer can fetch them; raises ValueError for other paths.
        """
        agreement = self.agreements[agreement_id]
        job = self.jobs[agreement_id]
        if job.state not in (END_STATE[exit_reason], JobState.RECEIPTED):
            job.fire(END_STATE[exit_reason])
        receipt = UsageReceipt(
            agreement_id=agreement_id,
            usage=usage,
            exit_reason=exit_reason,
            exit_code=SignedInt(exit_code),
            outputs=outputs,
            logs=logs,
            checkpoint=checkpoint,
            cost=agreed_charge(agreement, usage, exit_reason),
        )
        job.fire(JobState.RECEIPTED)
        # The container is gone: its capacity is free for the next buyer now, not at settlement.
        self.book.give_back(MessageId(agreement.terms.offer_id), agreement.terms.resources)
        return self._seal(receipt, nonce, now_ms, self.policy.max_lifetime_ms["usage-receipt"])

    def receive_receipt(self, wire: bytes, *, now_ms: int) -> CountersignedReceipt:
        """Buyer: check the receipt against the agreement, countersign it, and settle."""
        receipt = self._open(wire, UsageReceipt, now_ms)
        agreement = self._agreement_with(receipt.payload.agreement_id, receipt.signer)
        countersigned = CountersignedReceipt.countersign(self.key, receipt, agreement)
        job = self.jobs[agreement.id]
        end = END_STATE[receipt.payload.exit_reason]
        if job.state is not end:
            job.fire(end, remote=True)
        job.fire(JobState.RECEIPTED)
        self._settle(agreement, countersigned)
        return countersigned

    def receive_countersigned(self, wire: bytes) -> LedgerEntry:
        """Provider: the buyer's countersignature arrived; settle."""
        countersigned = CountersignedReceipt.from_wire(wire, self.agreements)
        agreement = self.agreements[countersigned.receipt.payload.agreement_id]
        return self._settle(agreement, countersigned)

    def _settle(self, agreement: Agreement, receipt: CountersignedReceipt) -> LedgerEntry:
        entry = receipt.ledger_entry(agreement)
        self.ledger.record(entry)
        self.jobs[agreement.id].fire(JobState.SETTLED)
        self._forget_deal(agreement)
        return entry

    def abandon(self, agreement_id: bytes) -> None:
        """Buyer: the provider vanished mid-job (missed heartbeats); the job ended by its
        fault. A provider-fault receipt may still follow; any other receipt is refused."""
        self.jobs[agreement_id].fire(JobState.PROVIDER_FAULT)
        self._forget_deal(self.agreements[agreement_id])

    def _forget_deal(self, agreement: Agreement) -> None:
        """The buyer's match for this agreement is over: its book view gets the capacity back."""
        for proposal_id, deal in list(self.buying.items()):
            if deal.proposal.payload.terms == agreement.terms:
                self.book.release(deal.match, rest_bid=False)
                del self.buying[proposal_id]

    # -- restart -----------------------------------------------------------------------

    def resume(self, agreement: Agreement, state: JobState) -> None:
        """Take an agreement back from the node's database after a restart."""
        self.agreements[agreement.id] = agreement
        self.jobs[agreement.id] = Machine(JOB_TABLE, state, JobState.ERROR)

    def repost(self, order: Signed[Any], *, now_ms: int) -> list[Match]:
        """Rest one of our own signed orders again after a restart; returns its matches."""
        return self._add(order, now_ms=now_ms, active=True)

    def _agreement_with(self, agreement_id: bytes, provider: PublicKey) -> Agreement:
        agreement = self.agreements.get(agreement_id)
        if agreement is None:
            raise InvalidMessage(Reason.TERMS_MISMATCH, "no such agreement")
        if agreement.terms.provider != provider.raw:
            raise InvalidMessage(Reason.WRONG_PARTY, "not signed by the agreement's provider")
        return agreement
