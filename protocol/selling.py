"""The provider's side of a trade, sans-IO, over a node's shared :class:`Trader`.

    post_offer(offer) -> receive_proposal() -> screen() -> [preemption_for()] -> accept()
    -> receive_agreement() -> status(...) -> issue_receipt() -> receive_countersigned()

Rules:
- A provider has one current offer; a proposal for any other (one it replaced, or one a
  book sync handed back after a restart) is refused as ``unknown-order``, so the same
  capacity is never sold twice.
- Capacity is *held* from the accept until the job's receipt (or until the buyer fails to
  agree in time). Holds live on the current offer: posting a new offer moves every hold
  onto it, and a released hold goes back to whatever offer is current then.
- Preemption (:func:`choose_preemption`) reclaims capacity only from preemptible jobs that
  pay less per core-hour than the proposal, cheapest first, and only if that frees enough.
- Fair share: with ``max_share_ppm`` below a million, no buyer may hold more than that
  share of the offer's CPU or memory (``no-capacity``, saying so). When capacity frees, the
  provider *invites* resting bids its offer fits (:meth:`Selling.invitations`): highest CPU
  limit first, then the buyer with the least recent usage (CPU reserved by its agreements
  of the last hour), then the oldest bid; as many as the free capacity holds, each bid once
  per offer, and never a bid already agreed here (its job ran or runs).
- Quotas and priorities (protocol/quotas.py): a proposal past a quota of its buyer's group
  is rejected ``quota``, naming the quota, the group and the limit; no bid is invited past
  one, and bids of a higher-priority group are invited first. The shell sets
  :attr:`Selling.spent_today` from its ledger before it screens or invites.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from protocol.elastic import ceiling
from protocol.envelope import MessageId, Signed
from protocol.errors import InvalidMessage, LocalProtocolError, Reason
from protocol.job import END_STATE, JOB_TABLE, job_machine
from protocol.machine import Machine
from protocol.messages import (
    Accept,
    Bid,
    Cancel,
    DataRef,
    Evidence,
    ExitReason,
    Invitation,
    JobState,
    JobStatus,
    Offer,
    Proposal,
    QuotaRefusal,
    Reject,
    RejectReason,
    Resources,
    SignedInt,
    Terms,
    TrustLevel,
    Usage,
    UsageReceipt,
)
from protocol.negotiation import (
    Agreement,
    NegotiationState,
    ProviderEvent,
    check_terms_against_offer,
    provider_machine,
    sign_terms,
)
from protocol.pricing import PPM
from protocol.quotas import GroupUse, Quotas, describe, refusal
from protocol.receipts import CountersignedReceipt, agreed_charge
from protocol.settlement import LedgerEntry, quote
from protocol.tape import print_of, sign_print
from protocol.trader import NEGOTIATION_TTL_MS, Trader

__all__ = [
    "FAIR_SHARE_WINDOW_MS",
    "LIVE",
    "ProviderDeal",
    "Refusal",
    "Selling",
    "choose_preemption",
]

# Job states in which a job holds the provider's capacity.
LIVE = frozenset({JobState.AGREED, JobState.TRANSFERRING, JobState.RUNNING})
FAIR_SHARE_WINDOW_MS = 3_600_000  # a buyer's recent usage: its agreements of the last hour


def choose_preemption(
    incoming: Terms, free: Resources, running: Mapping[bytes, Terms]
) -> list[bytes] | None:
    """Which running jobs (by agreement id) to preempt so ``incoming`` fits: none when it
    fits in ``free`` already, None when no allowed choice frees enough.

    Only preemptible jobs paying less per core-hour than ``incoming`` may go, cheapest
    first (ties by agreement id, so every node decides alike), and no more than needed.
    """
    need = incoming.resources
    if need.fits_in(free):
        return []
    victims = []
    for agreement_id, terms in sorted(
        running.items(), key=lambda item: (item[1].prices.cpu_core_hour, item[0])
    ):
        if need.fits_in(free):
            break
        if terms.preemptible and terms.prices.cpu_core_hour < incoming.prices.cpu_core_hour:
            victims.append(agreement_id)
            free = free.plus(terms.resources)
    return victims if need.fits_in(free) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """Why a provider refuses a proposal: the reject's reason, detail and quota."""

    reason: RejectReason
    detail: str
    quota: QuotaRefusal | None = None


@dataclass(slots=True)
class ProviderDeal:
    proposal: Signed[Proposal]
    machine: Machine[NegotiationState, ProviderEvent] = field(default_factory=provider_machine)

    @property
    def terms(self) -> Terms:
        return self.proposal.payload.terms


@dataclass(slots=True)
class Selling:
    trader: Trader
    offer: Signed[Offer] | None = None  # the current offer
    deals: dict[MessageId, ProviderDeal] = field(default_factory=dict)  # by proposal id
    agreements: dict[bytes, Agreement] = field(default_factory=dict)
    jobs: dict[bytes, Machine[JobState, JobState]] = field(default_factory=dict)
    _holds: dict[bytes, Resources] = field(default_factory=dict)  # proposal or agreement id
    max_share_ppm: int = PPM  # the most of the offer one buyer may hold
    _invited: dict[MessageId, MessageId] = field(default_factory=dict)  # bid -> offer
    quotas: Quotas = field(default_factory=Quotas)
    # buyer -> micro-credits its receipts settled with us this UTC day (the shell's ledger)
    spent_today: dict[bytes, int] = field(default_factory=dict)

    # -- the offer ---------------------------------------------------------------------

    def post_offer(self, offer: Offer, *, nonce: bytes, now_ms: int, ttl_ms: int) -> Signed[Offer]:
        """Sign ``offer`` as the current one; every hold moves onto it. The offers it
        replaces stay in the book until :meth:`withdraw`."""
        order, matches = self.trader.post(offer, nonce=nonce, now_ms=now_ms, ttl_ms=ttl_ms)
        for match in matches:
            # bids we could serve: their buyers propose when they see our offer
            self.trader.book.release(match, rest_bid=True)
        for held in self._holds.values():
            self.trader.book.reserve(order.id, held)
        self.offer = order
        return order

    def held(self) -> Resources:
        """The capacity committed now: accepted proposals and live agreements."""
        total = Resources(cpu_milli=0, memory_bytes=0)
        for resources in self._holds.values():
            total = total.plus(resources)
        return total

    def withdraw(self, offer_id: bytes, *, nonce: bytes, now_ms: int) -> Signed[Cancel] | None:
        """A cancel to gossip for one of our replaced offers still in the book, else None."""
        if offer_id not in self.trader.book.offers:
            return None
        return self.trader.cancel(MessageId(offer_id), nonce=nonce, now_ms=now_ms)

    # -- negotiation -------------------------------------------------------------------

    def receive_proposal(self, wire: bytes, *, now_ms: int) -> Signed[Proposal]:
        """Admit a proposal; then :meth:`screen` it, and :meth:`accept` or :meth:`reject`."""
        proposal = self.trader.open(wire, Proposal, now_ms)
        if proposal.signer.raw != proposal.payload.terms.buyer:
            raise InvalidMessage(Reason.WRONG_PARTY, "a proposal is signed by its buyer")
        deal = ProviderDeal(proposal=proposal)
        deal.machine.fire(ProviderEvent.RECEIVE_PROPOSAL, remote=True)
        self.deals[proposal.id] = deal
        return proposal

    def screen(self, proposal_id: MessageId) -> Refusal | None:
        """Why we must refuse this proposal whatever our capacity, or None."""
        terms = self.deals[proposal_id].terms
        if self.offer is None or terms.offer_id != self.offer.id:
            return Refusal(
                reason=RejectReason.UNKNOWN_ORDER, detail="that offer was replaced by a newer one"
            )
        level = terms.trust.level
        if level is not TrustLevel.NONE and level not in self.offer.payload.trust:
            detail = f"this provider cannot attest {level}"
            return Refusal(reason=RejectReason.TRUST_UNAVAILABLE, detail=detail)
        try:
            check_terms_against_offer(terms, self.offer, self.trader.me)
        except InvalidMessage as exc:
            return Refusal(reason=RejectReason.BAD_TERMS, detail=str(exc))
        if terms.job.secrets and self.offer.payload.seal_key is None:
            # spec/messages.md rule 6: nowhere to seal them to
            detail = "this provider takes no sealed secrets"
            return Refusal(reason=RejectReason.BAD_TERMS, detail=detail)
        if not self._within_share(terms.buyer, terms.resources):
            detail = f"fair share: one buyer may hold {self.max_share_ppm / 10_000:g} % at most"
            return Refusal(reason=RejectReason.NO_CAPACITY, detail=detail)
        over = self.over_quota(terms.buyer, GroupUse.of(terms.resources, terms.max_cost))
        if over is not None:
            return Refusal(reason=RejectReason.QUOTA, detail=describe(over), quota=over)
        return None

    def over_quota(
        self, buyer: bytes, more: GroupUse, uses: list[tuple[bytes, GroupUse]] | None = None
    ) -> QuotaRefusal | None:
        """The quota of ``buyer``'s group that ``more`` would pass, or None; ``uses``
        (default :meth:`uses`) may add uses not held yet, such as bids invited in the same
        round."""
        group = self.quotas.group_of(buyer)
        if group is None:
            return None
        return refusal(group, self.quotas.use(group, self.uses() if uses is None else uses), more)

    def uses(self) -> list[tuple[bytes, GroupUse]]:
        """Each buyer's use here, item by item (protocol/quotas.py): accepted proposals and
        live agreements hold capacity; agreements not settled yet count their ``max_cost``;
        then what each buyer's receipts settled this UTC day."""
        out = [(t.buyer, GroupUse.of(held, t.max_cost)) for t, held in self._held_terms()]
        for agreement_id, agreement in self.agreements.items():
            unsettled = self.jobs[agreement_id].state not in (JobState.SETTLED, JobState.ERROR)
            if agreement_id not in self._holds and unsettled:
                out.append((agreement.terms.buyer, GroupUse(credits=agreement.terms.max_cost)))
        out += [(buyer, GroupUse(credits=spent)) for buyer, spent in self.spent_today.items()]
        return out

    def _within_share(self, buyer: bytes, more: Resources) -> bool:
        if self.max_share_ppm >= PPM or self.offer is None:
            return True
        capacity, held = self.offer.payload.capacity, self.held_by(buyer).plus(more)
        return (
            held.cpu_milli * PPM <= capacity.cpu_milli * self.max_share_ppm
            and held.memory_bytes * PPM <= capacity.memory_bytes * self.max_share_ppm
        )

    def held_by(self, buyer: bytes) -> Resources:
        """The capacity ``buyer``'s accepted proposals and live agreements hold."""
        total = Resources(cpu_milli=0, memory_bytes=0)
        for terms, resources in self._held_terms():
            if terms.buyer == buyer:
                total = total.plus(resources)
        return total

    def _held_terms(self) -> list[tuple[Terms, Resources]]:
        """The terms of each accepted proposal and live agreement, with what it holds."""
        out = []
        for key, resources in self._holds.items():
            deal = self.deals.get(MessageId(key))
            agreement = self.agreements.get(key)
            terms = deal.terms if deal is not None else agreement.terms if agreement else None
            if terms is not None:
                out.append((terms, resources))
        return out

    def recent_usage(self, buyer: bytes, now_ms: int) -> int:
        """The CPU (milli-cores) ``buyer``'s agreements of the last hour reserved here."""
        since = now_ms - FAIR_SHARE_WINDOW_MS
        return sum(
            a.terms.resources.cpu_milli
            for a in self.agreements.values()
            if a.terms.buyer == buyer and a.terms.created_ms >= since
        )

    def invitations(self, *, now_ms: int) -> list[Signed[Bid]]:
        """The resting bids to invite to our offer now, in the order of the rules above."""
        book = self.trader.book
        self._invited = {b: o for b, o in self._invited.items() if b in book.bids}
        resting = book.offers.get(self.offer.id) if self.offer else None
        if resting is None:
            return []
        offer_id = resting.order.id
        traded = {a.terms.bid_id for a in self.agreements.values()}  # its job ran here
        candidates = [
            b
            for bid_id, b in book.bids.items()
            if not b.active
            and b.order.expires_ms > now_ms
            and bid_id not in traded
            and self._invited.get(bid_id) != offer_id
            and book.fits(bid_id, offer_id, reputation=self.trader.reputation)
        ]
        candidates.sort(
            key=lambda b: (
                -self.quotas.priority(b.order.signer.raw),
                -b.bid.max_prices.cpu_core_hour,
                self.recent_usage(b.order.signer.raw, now_ms),
                b.order.issued_ms,
            )
        )
        free, chosen = resting.remaining, []
        uses = self.uses() if self.quotas.groups else []  # and the bids invited below
        for b in candidates:
            buyer, need = b.order.signer.raw, b.bid.resources
            cost = quote(
                resting.order.payload.prices, ceiling(need, b.bid.elastic), b.bid.job.wall_ms
            )
            use = GroupUse.of(need, cost)
            if (
                need.fits_in(free)
                and self._within_share(buyer, need)
                and self.over_quota(buyer, use, uses) is None
            ):
                free = free.minus(need)
                chosen.append(b.order)
                uses.append((buyer, use))
                self._invited[b.order.id] = offer_id
        return chosen

    def invite(self, bid: Signed[Bid], *, nonce: bytes, now_ms: int) -> Signed[Invitation]:
        """The signed invitation of ``bid``'s buyer to our current offer."""
        assert self.offer is not None
        payload = Invitation(offer_id=self.offer.id, bid_id=bid.id)
        return self.trader.seal(payload, nonce, now_ms, NEGOTIATION_TTL_MS)

    def preemption_for(self, proposal_id: MessageId) -> list[bytes] | None:
        """The running jobs to preempt so the proposal fits (see :func:`choose_preemption`)."""
        resting = self.trader.book.offers.get(self.offer.id) if self.offer else None
        if resting is None:
            return None
        running = {
            agreement_id: agreement.terms
            for agreement_id, agreement in self.agreements.items()
            if self.jobs[agreement_id].state in LIVE
        }
        return choose_preemption(self.deals[proposal_id].terms, resting.remaining, running)

    def accept(
        self, proposal_id: MessageId, *, evidence: Evidence | None, nonce: bytes, now_ms: int
    ) -> Signed[Accept] | Signed[Reject]:
        """Hold the capacity and accept; rejects instead if the proposal fails
        :meth:`screen` or no longer fits."""
        refused = self.screen(proposal_id)
        terms, offer = self.deals[proposal_id].terms, self.offer
        if refused is None and offer is not None:  # screen() refuses without an offer
            try:
                self.trader.book.reserve(offer.id, terms.resources)
            except LocalProtocolError as exc:
                refused = Refusal(reason=RejectReason.NO_CAPACITY, detail=str(exc))
        if refused is not None or offer is None:
            refused = refused or Refusal(reason=RejectReason.UNKNOWN_ORDER, detail="no offer")
            return self.reject(
                proposal_id,
                refused.reason,
                refused.detail,
                quota=refused.quota,
                nonce=nonce,
                now_ms=now_ms,
            )
        self._holds[proposal_id] = terms.resources
        self.deals[proposal_id].machine.fire(ProviderEvent.SEND_ACCEPT)
        payload = Accept(
            proposal_id=proposal_id,
            terms_signature=sign_terms(self.trader.key, terms),
            evidence=evidence,
            print_signature=sign_print(self.trader.key, print_of(terms, offer.payload)),
        )
        return self.trader.seal(payload, nonce, now_ms, NEGOTIATION_TTL_MS)

    def reject(
        self,
        proposal_id: MessageId,
        reason: RejectReason,
        detail: str = "",
        *,
        quota: QuotaRefusal | None = None,
        nonce: bytes,
        now_ms: int,
    ) -> Signed[Reject]:
        self.deals.pop(proposal_id).machine.fire(ProviderEvent.SEND_REJECT)
        payload = Reject(proposal_id=proposal_id, reason=reason, detail=detail, quota=quota)
        return self.trader.seal(payload, nonce, now_ms, NEGOTIATION_TTL_MS)

    def receive_agreement(self, wire: bytes) -> Agreement:
        """The buyer's agreement to terms we accepted; the job starts.

        Raises:
            DecodeError, InvalidMessage: not both signatures over terms we accepted.
        """
        agreement = Agreement.from_wire(wire)
        found = next(
            (
                (proposal_id, deal)
                for proposal_id, deal in self.deals.items()
                if deal.terms == agreement.terms and deal.machine.state is NegotiationState.ACCEPTED
            ),
            None,
        )
        if found is None:
            raise InvalidMessage(Reason.TERMS_MISMATCH, "agreement to terms we did not accept")
        proposal_id, deal = found
        deal.machine.fire(ProviderEvent.RECEIVE_AGREEMENT, remote=True)
        del self.deals[proposal_id]
        self._holds[agreement.id] = self._holds.pop(proposal_id)
        self.agreements[agreement.id] = agreement
        self.jobs[agreement.id] = job_machine()
        return agreement

    def timed_out(self, proposal_id: MessageId) -> None:
        """Input event: no agreement came after our accept. The capacity goes back."""
        self.deals.pop(proposal_id).machine.fire(ProviderEvent.TIMEOUT)
        self._release(proposal_id)

    # -- the job ---------------------------------------------------------------------

    def status(
        self, agreement_id: bytes, state: JobState, *, nonce: bytes, now_ms: int, detail: str = ""
    ) -> Signed[JobStatus]:
        """Move the job and sign the status event for the buyer."""
        self.jobs[agreement_id].fire(state)
        payload = JobStatus(agreement_id=agreement_id, state=state, detail=detail)
        return self.trader.seal(payload, nonce, now_ms, NEGOTIATION_TTL_MS)

    def issue_receipt(
        self,
        agreement_id: bytes,
        *,
        usage: Usage,
        exit_reason: ExitReason,
        exit_code: int,
        outputs: tuple[DataRef, ...] = (),
        logs: tuple[DataRef, ...] = (),
        truncated_logs: tuple[str, ...] = (),
        checkpoint: str | None = None,
        nonce: bytes,
        now_ms: int,
    ) -> Signed[UsageReceipt]:
        """Sign the usage receipt; its cost follows from the terms. The job's capacity is
        free for the next buyer now, not at settlement.

        ``logs`` are the job's stdout and stderr blobs (paths ``/dev/stdout``,
        ``/dev/stderr``), so the buyer can fetch them; ``truncated_logs`` those of them cut
        at LOG_CAP_BYTES; raises ValueError for other paths.
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
            truncated_logs=truncated_logs,
            checkpoint=checkpoint,
            cost=agreed_charge(agreement, usage, exit_reason),
        )
        job.fire(JobState.RECEIPTED)
        self._release(agreement_id)
        lifetime = self.trader.policy.max_lifetime_ms["usage-receipt"]
        return self.trader.seal(receipt, nonce, now_ms, lifetime)

    def receive_countersigned(self, wire: bytes) -> tuple[CountersignedReceipt, LedgerEntry]:
        """The buyer's countersignature arrived; settle. The receipt, verified, and what it
        wrote in the ledger.

        Raises:
            DecodeError, InvalidMessage: not our receipt, countersigned by its buyer.
        """
        countersigned = CountersignedReceipt.from_wire(wire, self.agreements)
        agreement = self.agreements[countersigned.receipt.payload.agreement_id]
        entry = self.trader.settle(agreement, countersigned)
        self.jobs[agreement.id].fire(JobState.SETTLED)
        return countersigned, entry

    def resume(self, agreement: Agreement, state: JobState) -> None:
        """Take an agreement back from the node's database after a restart."""
        self.agreements[agreement.id] = agreement
        self.jobs[agreement.id] = Machine(JOB_TABLE, state, JobState.ERROR)
        if state in LIVE:
            self._holds[agreement.id] = agreement.terms.resources

    def _release(self, key: bytes) -> None:
        held = self._holds.pop(key, None)
        if held is not None and self.offer is not None:
            self.trader.book.give_back(self.offer.id, held)
