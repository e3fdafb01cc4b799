"""The buyer's side of a trade, sans-IO, over a node's shared :class:`Trader`.

    trader.post(bid) -> propose(match) -> receive_reply(accept) -> [verify evidence]
    -> agree() -> receive_status(...) -> receive_receipt() -> countersigned receipt, settled

After a reject, bad evidence or silence the match is released, the provider is remembered as
having refused this bid, and :meth:`Buying.next_match` offers the next candidate. A reject
for a quota (spec/matching.md) rules out every offer of that provider for this bid, its new
offers too (:meth:`Buying.held_back`), until the provider invites the bid: its quota freed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from protocol.book import Match
from protocol.encoding import encode
from protocol.envelope import MessageId, Signed, open_signed
from protocol.errors import InvalidMessage, LocalProtocolError, Reason
from protocol.identity import PublicKey
from protocol.job import END_STATE, JOB_TABLE, job_machine
from protocol.machine import Machine
from protocol.messages import (
    Accept,
    Invitation,
    JobState,
    JobStatus,
    Proposal,
    QuotaRefusal,
    Reject,
    UsageReceipt,
)
from protocol.negotiation import (
    AGREEMENT_DOMAIN,
    Agreement,
    BuyerEvent,
    NegotiationState,
    buyer_machine,
    terms_bytes,
    terms_from_match,
)
from protocol.receipts import CountersignedReceipt
from protocol.schema import to_value
from protocol.tape import TRADE_PRINT_DOMAIN, SignedPrint, print_of, sign_print
from protocol.trader import NEGOTIATION_TTL_MS, Trader

__all__ = ["BuyerDeal", "Buying"]


@dataclass(slots=True)
class BuyerDeal:
    match: Match
    proposal: Signed[Proposal]
    machine: Machine[NegotiationState, BuyerEvent] = field(default_factory=buyer_machine)
    accept: Signed[Accept] | None = None


@dataclass(slots=True)
class Buying:
    trader: Trader
    deals: dict[MessageId, BuyerDeal] = field(default_factory=dict)  # by proposal id
    agreements: dict[bytes, Agreement] = field(default_factory=dict)
    jobs: dict[bytes, Machine[JobState, JobState]] = field(default_factory=dict)
    refused: dict[MessageId, set[MessageId]] = field(default_factory=dict)  # bid -> offers
    # bid -> provider key -> the quota it refused the bid for
    over_quota: dict[MessageId, dict[bytes, QuotaRefusal]] = field(default_factory=dict)

    # -- negotiation -----------------------------------------------------------------

    def propose(
        self, match: Match, *, nonce: bytes, attestation_nonce: bytes, now_ms: int
    ) -> Signed[Proposal]:
        if match.buyer != self.trader.me.raw:
            raise LocalProtocolError(Reason.WRONG_PARTY, "only the bid's owner proposes")
        terms = terms_from_match(match, attestation_nonce=attestation_nonce, created_ms=now_ms)
        proposal = self.trader.seal(Proposal(terms=terms), nonce, now_ms, NEGOTIATION_TTL_MS)
        deal = BuyerDeal(match=match, proposal=proposal)
        deal.machine.fire(BuyerEvent.SEND_PROPOSAL)
        self.deals[proposal.id] = deal
        return proposal

    def receive_reply(self, wire: bytes, *, now_ms: int) -> Signed[Accept] | Signed[Reject]:
        """A provider's accept or reject. After an accept, verify its evidence and call
        :meth:`agree` or :meth:`evidence_failed`; after a reject, :meth:`next_match`."""
        reply: Signed[Any] = open_signed(wire)
        if not isinstance(reply.payload, Accept | Reject):
            raise InvalidMessage(Reason.WRONG_TYPE, f"expected accept or reject, got {reply.type}")
        self.trader.admit(reply, now_ms)
        deal = self.deals.get(MessageId(reply.payload.proposal_id))
        if deal is None:
            raise InvalidMessage(Reason.TERMS_MISMATCH, "reply to no proposal of ours")
        terms = deal.proposal.payload.terms
        if reply.signer.raw != terms.provider:
            raise InvalidMessage(Reason.WRONG_PARTY, "reply from someone else than the provider")
        if isinstance(reply.payload, Reject):
            deal.machine.fire(BuyerEvent.RECEIVE_REJECT, remote=True)
            if reply.payload.quota is not None:
                by_provider = self.over_quota.setdefault(deal.match.bid.id, {})
                by_provider[terms.provider] = reply.payload.quota
            self._refused(deal)
            return reply
        reply.signer.verify(AGREEMENT_DOMAIN, terms_bytes(terms), reply.payload.terms_signature)
        if reply.payload.print_signature is not None:
            trade = print_of(terms, deal.match.offer.payload)
            reply.signer.verify(
                TRADE_PRINT_DOMAIN, encode(to_value(trade)), reply.payload.print_signature
            )
        deal.machine.fire(BuyerEvent.RECEIVE_ACCEPT, remote=True)
        deal.accept = reply
        return reply

    def agree(self, proposal_id: MessageId) -> Agreement:
        """The evidence verified (or none was needed): sign the terms; send the result."""
        deal = self.deals[proposal_id]
        if deal.accept is None:
            raise LocalProtocolError(Reason.ILLEGAL_TRANSITION, "no accept to agree to")
        deal.machine.fire(BuyerEvent.EVIDENCE_VERIFIED)
        terms = deal.proposal.payload.terms
        raw = terms_bytes(terms)
        # Not Agreement.assemble, which verifies both signatures: ours is new, and
        # receive_reply verified the provider's.
        agreement = Agreement(
            terms=terms,
            terms_bytes=raw,
            buyer_signature=self.trader.key.sign(AGREEMENT_DOMAIN, raw),
            provider_signature=deal.accept.payload.terms_signature,
        )
        self.agreements[agreement.id] = agreement
        self.jobs[agreement.id] = job_machine()
        return agreement

    def trade_print(self, proposal_id: MessageId) -> SignedPrint | None:
        """After :meth:`agree`: the trade's print signed by both, for the tape; None when
        the provider signed none."""
        deal = self.deals[proposal_id]
        if deal.accept is None or deal.accept.payload.print_signature is None:
            return None
        trade = print_of(deal.proposal.payload.terms, deal.match.offer.payload)
        mine = sign_print(self.trader.key, trade)
        return SignedPrint.assemble(trade, mine, deal.accept.payload.print_signature)

    def evidence_failed(self, proposal_id: MessageId) -> None:
        deal = self.deals[proposal_id]
        deal.machine.fire(BuyerEvent.EVIDENCE_FAILED)
        self._refused(deal)

    def negotiation_timed_out(self, proposal_id: MessageId) -> None:
        """Input event: the provider stayed silent. The bid rests for the next candidate."""
        deal = self.deals[proposal_id]
        deal.machine.fire(BuyerEvent.TIMEOUT)
        self._refused(deal)

    def _refused(self, deal: BuyerDeal) -> None:
        self.refused.setdefault(deal.match.bid.id, set()).add(deal.match.offer.id)
        self.trader.book.release(deal.match, rest_bid=True)

    def receive_invitation(self, wire: bytes, *, now_ms: int) -> Match | None:
        """A provider's invitation to one of our resting bids: the match to propose, or
        None when the bid no longer rests here or the offer (in our book) does not fit it.
        An invitation lifts an earlier refusal of that offer: its capacity came back.

        Raises:
            DecodeError, InvalidMessage: not a valid invitation by the offer's signer.
        """
        invitation = self.trader.open(wire, Invitation, now_ms)
        bid_id, offer_id = (
            MessageId(invitation.payload.bid_id),
            MessageId(invitation.payload.offer_id),
        )
        resting = self.trader.book.offers.get(offer_id)
        if resting is not None and resting.order.signer.raw != invitation.signer.raw:
            raise InvalidMessage(
                Reason.WRONG_PARTY, "an invitation is signed by the offer's provider"
            )
        bid = self.trader.book.bids.get(bid_id)
        if bid is None or not bid.active:
            return None
        self.refused.get(bid_id, set()).discard(offer_id)
        self.over_quota.get(bid_id, {}).pop(invitation.signer.raw, None)
        return self.trader.book.match_invited(
            bid_id, offer_id, now_ms=now_ms, reputation=self.trader.reputation
        )

    def next_match(self, bid_id: MessageId, *, now_ms: int) -> list[Match]:
        """The next candidate for a bid whose last proposal failed."""
        over = self.over_quota.get(bid_id, {})
        book = self.trader.book
        by_quota = {o for o, r in book.offers.items() if r.order.signer.raw in over}
        return book.rematch(
            bid_id,
            now_ms=now_ms,
            exclude=frozenset(self.refused.get(bid_id, set()) | by_quota),
            reputation=self.trader.reputation,
        )

    def held_back(self, match: Match) -> bool:
        """True, and the match released, when its provider refused its bid for a quota and
        has not invited it since: proposing again would only be refused again."""
        if match.provider not in self.over_quota.get(match.bid.id, {}):
            return False
        self.trader.book.release(match, rest_bid=True)
        return True

    # -- the job ---------------------------------------------------------------------

    def receive_status(self, wire: bytes, *, now_ms: int) -> Signed[JobStatus]:
        """Follow the provider's job status; it must follow the job table."""
        status = self.trader.open(wire, JobStatus, now_ms)
        agreement = self._agreement_with(status.payload.agreement_id, status.signer)
        self.jobs[agreement.id].fire(status.payload.state, remote=True)
        return status

    def receive_receipt(self, wire: bytes, *, now_ms: int) -> CountersignedReceipt:
        """Check the receipt against the agreement, countersign it, and settle."""
        receipt = self.trader.open(wire, UsageReceipt, now_ms)
        agreement = self._agreement_with(receipt.payload.agreement_id, receipt.signer)
        countersigned = CountersignedReceipt.countersign(self.trader.key, receipt, agreement)
        job = self.jobs[agreement.id]
        end = END_STATE[receipt.payload.exit_reason]
        if job.state is not end:
            job.fire(end, remote=True)
        job.fire(JobState.RECEIPTED)
        self.trader.settle(agreement, countersigned)
        job.fire(JobState.SETTLED)
        self._forget_deal(agreement)
        return countersigned

    def abandon(self, agreement_id: bytes) -> None:
        """The provider vanished mid-job (missed heartbeats); the job ended by its fault. A
        provider-fault receipt may still follow; any other receipt is refused."""
        self.jobs[agreement_id].fire(JobState.PROVIDER_FAULT)
        self._forget_deal(self.agreements[agreement_id])

    def _forget_deal(self, agreement: Agreement) -> None:
        """The match for this agreement is over: our book gets the capacity back."""
        for proposal_id, deal in list(self.deals.items()):
            if deal.proposal.payload.terms == agreement.terms:
                self.trader.book.release(deal.match, rest_bid=False)
                del self.deals[proposal_id]

    def resume(self, agreement: Agreement, state: JobState) -> None:
        """Take an agreement back from the node's database after a restart."""
        self.agreements[agreement.id] = agreement
        self.jobs[agreement.id] = Machine(JOB_TABLE, state, JobState.ERROR)

    def _agreement_with(self, agreement_id: bytes, provider: PublicKey) -> Agreement:
        agreement = self.agreements.get(agreement_id)
        if agreement is None:
            raise InvalidMessage(Reason.TERMS_MISMATCH, "no such agreement")
        if agreement.terms.provider != provider.raw:
            raise InvalidMessage(Reason.WRONG_PARTY, "not signed by the agreement's provider")
        return agreement
