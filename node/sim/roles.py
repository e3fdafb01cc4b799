"""What simulated nodes do: honest buyers and providers, and the adversaries.

Each role drives the real sans-IO roles, :class:`protocol.buying.Buying` and
:class:`protocol.selling.Selling`, over the node's :class:`protocol.trader.Trader`, the way
``node/market/buyer.py`` and ``provider.py`` do, with the world's clock and bytes in place
of trio and streams. Rules they follow from the node (spec/peer.md):
- A buyer negotiates one match of a bid at a time; a reject, or silence for
  ``NEGOTIATION_TIMEOUT_MS``, moves it to the bid's next candidate.
- A buyer pings the provider of each running job every ``HEARTBEAT_MS``; after
  ``MISSED_HEARTBEATS`` unanswered it abandons the job (the provider's fault: unpaid), stops
  trading with that provider (reputation -1) and bids again, up to ``MAX_ATTEMPTS``.
- A provider that accepted holds the capacity until the agreement or
  ``AGREEMENT_TIMEOUT_MS``.

Adversaries are honest nodes with one behaviour changed; what each achieves is counted in
:class:`AdversaryScore`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from node.sim.scenario import Hardware, JobClass
from node.sim.world import SimNode, World
from protocol.book import Match
from protocol.buying import Buying
from protocol.envelope import MessageId, Signed, seal
from protocol.errors import ProtocolError
from protocol.messages import (
    Accept,
    Arch,
    Bid,
    Constraints,
    ExitReason,
    JobSpec,
    JobState,
    Offer,
    Prices,
    Resources,
    Usage,
    UsageReceipt,
)
from protocol.negotiation import Agreement, NegotiationState
from protocol.pricing import PPM, Policy, Pricing, ResourcePricing, asking, should_repost
from protocol.selling import Selling
from protocol.tape import resource_class

__all__ = ["AdversaryScore", "Buyer", "Provider", "Role", "SimJob", "Spammer"]

GIB = 1 << 30
IMAGE = "sha256:" + "5e" * 32
NEGOTIATION_TIMEOUT_MS = 10_000
AGREEMENT_TIMEOUT_MS = 30_000
HEARTBEAT_MS = 10_000
MISSED_HEARTBEATS = 3
MAX_ATTEMPTS = 3
ESCALATE_AFTER_MS = 60_000  # an escalating buyer raises its limit after this long unmatched
ESCALATE_STEP = 1.2
ESCALATE_CAP = 2.0  # times the class's limit
_ANYWHERE = Constraints()
STATUS_STEPS_MS = ((JobState.TRANSFERRING, 500), (JobState.RUNNING, 1000))


@dataclass(slots=True)
class SimJob:
    """One job of the workload, followed from submission to settlement."""

    id: int
    cls: JobClass
    buyer: int
    submitted_ms: int
    run_ms: int
    limit: int  # the bid's CPU price limit now
    matched_ms: int | None = None
    settled_ms: int | None = None
    price: int | None = None  # agreed CPU price per core-hour
    provider: int | None = None
    cost: int = 0
    attempts: int = 0
    escalations: int = 0
    gave_up: bool = False
    faults: int = 0


@dataclass(slots=True)
class AdversaryScore:
    kind: str
    nodes: int = 0
    sent: int = 0  # spam orders sent
    agreements: int = 0  # agreements the adversary entered
    paid: int = 0  # micro-credits it received
    unpaid_work_core_s: float = 0.0  # compute it got without paying
    ring_trades: int = 0  # trades inside a sybil ring
    honest_trades: int = 0  # trades with honest nodes
    excluded_by: int = 0  # honest nodes that will not trade with it again
    overcharged: int = 0  # micro-credits paid for work a lied-about score never did
    wasted_ms: int = 0  # honest buyers' time lost to it

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "kind"}


class Role:
    """The base: a node's behaviour, called by the world."""

    def __init__(self, world: World, node: SimNode) -> None:
        self.world = world
        self.node = node
        node.role = self
        self.score: AdversaryScore | None = None

    def start(self) -> None:
        """Called once at the start of the run."""

    def on_matches(self, matches: list[Match]) -> None:
        """Matches our book made for our own orders."""

    def on_direct(self, kind: str, wire: bytes, src: SimNode) -> None:
        """A direct message from ``src``."""

    def answers_ping(self, agreement_id: bytes) -> bool:
        return False


# -- providers -----------------------------------------------------------------------------


class Provider(Role):
    def __init__(self, world: World, node: SimNode, hardware: Hardware, price: int) -> None:
        super().__init__(world, node)
        self.selling = Selling(node.trader)
        self.hardware = hardware
        self.price = price
        self.offer_region = node.region
        self.pricing = pricing_of(hardware, price)
        self.work_score = hardware.work_score  # what its offers state
        self.posted_ms = 0
        self.running: set[bytes] = set()  # agreement ids whose job is running here
        self.earned = 0
        self.jobs_done = 0

    def start(self) -> None:
        self.world.at(self.world.rng.randrange(30_000), self._post, None)

    def offer(self, prices: Prices | None = None) -> Offer:
        hw = self.hardware
        return Offer(
            capacity=self.capacity,
            prices=prices or Prices(cpu_core_hour=self.price, memory_gib_hour=hw.mem_price),
            arch=Arch.AMD64,
            region=self.offer_region,
            work_score=self.work_score or None,
        )

    @property
    def capacity(self) -> Resources:
        hw = self.hardware
        return Resources(cpu_milli=hw.cpu * 1000, memory_bytes=hw.memory_gib * GIB)

    def _post(self, _: None, __: None) -> None:
        self._post_at(None)
        if self.pricing.moves:
            self.world.at(self.pricing.min_interval_ms, self._reprice, None)

    def _post_at(self, prices: Prices | None) -> None:
        w = self.world
        ttl = min(int(w.scenario.minutes * 60_000) + 600_000, 24 * 3_600_000)
        old = self.selling.offer
        order = self.selling.post_offer(
            self.offer(prices), nonce=w.nonce(), now_ms=w.now_ms, ttl_ms=ttl
        )
        self.posted_ms = w.now_ms
        w.publish(self.node, order)
        if old is not None:
            cancel = self.selling.withdraw(old.id, nonce=w.nonce(), now_ms=w.now_ms)
            if cancel is not None:
                w.publish(self.node, cancel)

    def _reprice(self, _: None, __: None) -> None:
        """protocol/pricing.py's asking price now; a fresh offer when it moved enough (what
        node/market/repricing.py does in a node)."""
        w = self.world
        current = self.selling.offer
        if current is not None and not self.node.down:
            offer = current.payload
            since = w.now - self.pricing.window_ms
            prints = w.prints(resource_class(offer), since)
            new = asking(
                self.pricing,
                held=self.selling.held(),
                capacity=self.capacity,
                prints={"cpu_core_hour": prints},
            )
            if should_repost(
                offer.prices,
                new,
                step_ppm=self.pricing.step_ppm,
                posted_ms=self.posted_ms,
                now_ms=w.now_ms,
                min_interval_ms=self.pricing.min_interval_ms,
            ):
                self._post_at(new)
        w.at(self.pricing.min_interval_ms, self._reprice, None)

    def on_direct(self, kind: str, wire: bytes, src: SimNode) -> None:
        w = self.world
        try:
            if kind == "proposal":
                proposal = self.selling.receive_proposal(wire, now_ms=w.now_ms)
                reply = self.selling.accept(
                    proposal.id, evidence=None, nonce=w.nonce(), now_ms=w.now_ms
                )
                if isinstance(reply.payload, Accept):
                    w.at(AGREEMENT_TIMEOUT_MS, self._agreement_due, proposal.id)
                w.send(self.node, src.trader.me.raw, "reply", reply.wire)
            elif kind == "agreement":
                self.on_agreement(self.selling.receive_agreement(wire), src)
            elif kind == "countersigned":
                _, entry = self.selling.receive_countersigned(wire)
                self.earned += entry.amount
                if self.score is not None:
                    self.score.paid += entry.amount
                    self.score.overcharged += self.overcharge(entry.amount)
        except ProtocolError:
            return  # a real node answers with an error frame; nothing else changes

    def overcharge(self, amount: int) -> int:
        """What a payment bought beyond the work the provider's true score delivers."""
        true = self.hardware.work_score
        if not true or self.work_score <= true:
            return 0
        return amount - amount * true // self.work_score

    def _agreement_due(self, proposal_id: MessageId, _: None) -> None:
        if proposal_id in self.selling.deals:
            self.selling.timed_out(proposal_id)

    def on_agreement(self, agreement: Agreement, buyer: SimNode) -> None:
        self.running.add(agreement.id)
        if self.score is not None:
            self.score.agreements += 1
        for state, delay in STATUS_STEPS_MS:
            self.world.at(delay, self._status, (agreement.id, buyer), state)
        job = self.world.jobs_by_agreement.get(agreement.id)
        run_ms = job.run_ms if job is not None else 60_000
        self.world.at(run_ms, self._finish, (agreement, buyer), run_ms)

    def _status(self, where: tuple[bytes, SimNode], state: JobState) -> None:
        agreement_id, buyer = where
        if self.node.down or agreement_id not in self.running:
            return
        w = self.world
        status = self.selling.status(agreement_id, state, nonce=w.nonce(), now_ms=w.now_ms)
        w.send(self.node, buyer.trader.me.raw, "status", status.wire)

    def _finish(self, where: tuple[Agreement, SimNode], run_ms: int) -> None:
        agreement, buyer = where
        if agreement.id not in self.running:
            return  # lost while this node was down
        self.running.discard(agreement.id)
        w = self.world
        cpu_us = agreement.terms.resources.cpu_milli * run_ms * 9 // 10
        receipt = self.selling.issue_receipt(
            agreement.id,
            usage=Usage(wall_ms=run_ms, cpu_us=cpu_us),
            exit_reason=ExitReason.SUCCESS,
            exit_code=0,
            nonce=w.nonce(),
            now_ms=w.now_ms,
        )
        self.jobs_done += 1
        w.send(self.node, buyer.trader.me.raw, "receipt", receipt.wire)

    def went_down(self) -> None:
        """Running jobs die with the node; their buyers find out by heartbeat."""
        self.running.clear()

    def answers_ping(self, agreement_id: bytes) -> bool:
        return agreement_id in self.running


def pricing_of(hw: Hardware, price: int) -> Pricing:
    """The provider's CPU pricing as the scenario says, around its drawn ``price``."""
    policy = Policy(hw.pricing)
    cpu = ResourcePricing(
        policy=policy,
        price=price,
        floor=round(price * hw.floor_factor) if policy is not Policy.FIXED else 0,
        ceiling=round(price * hw.ceiling_factor) if policy is not Policy.FIXED else price,
        undercut_ppm=round(hw.undercut * PPM),
    )
    return Pricing(
        resources={"cpu_core_hour": cpu, "memory_gib_hour": ResourcePricing(price=hw.mem_price)}
    )


class NoShowProvider(Provider):
    """Accepts, agrees, and never runs the job nor answers about it."""

    def on_agreement(self, agreement: Agreement, buyer: SimNode) -> None:
        if self.score is not None:
            self.score.agreements += 1


# -- buyers --------------------------------------------------------------------------------


class Buyer(Role):
    def __init__(self, world: World, node: SimNode, constraints: Constraints = _ANYWHERE) -> None:
        super().__init__(world, node)
        self.buying = Buying(node.trader)
        self.constraints = constraints
        self.bid_jobs: dict[MessageId, SimJob] = {}
        self.negotiating: dict[MessageId, MessageId] = {}  # bid -> proposal
        self.following: dict[bytes, tuple[SimJob, int]] = {}  # agreement -> job, missed

    # -- bidding -----------------------------------------------------------------------

    def submit(self, job: SimJob) -> None:
        job.attempts += 1
        self._post(job)

    def bid_for(self, job: SimJob) -> Bid:
        cls = job.cls
        return Bid(
            job=JobSpec(image=IMAGE, command=("sim", str(job.id)), wall_ms=2 * job.run_ms + 60_000),
            resources=Resources(
                cpu_milli=round(cls.cpu * 1000), memory_bytes=round(cls.memory_gib * GIB)
            ),
            max_prices=Prices(cpu_core_hour=job.limit, memory_gib_hour=cls.max_mem_price),
            constraints=self.constraints,
            max_work_price=(
                round(cls.max_work_price * job.limit / cls.max_cpu_price)
                if cls.max_work_price
                else None
            ),
        )

    def _post(self, job: SimJob) -> None:
        w = self.world
        ttl = int(w.scenario.bid_ttl_min * 60_000)
        order, matches = self.buying.trader.post(
            self.bid_for(job), nonce=w.nonce(), now_ms=w.now_ms, ttl_ms=ttl
        )
        self.bid_jobs[order.id] = job
        w.publish(self.node, order)
        self.on_matches(matches)
        if job.cls.strategy == "escalate":
            w.at(ESCALATE_AFTER_MS, self._escalate, order.id)

    def _escalate(self, bid_id: MessageId, _: None) -> None:
        """Still unmatched: withdraw the bid and bid higher."""
        job = self.bid_jobs.get(bid_id)
        book = self.buying.trader.book
        if job is None or bid_id not in book.bids or bid_id in self.negotiating:
            return
        cap = round(job.cls.max_cpu_price * ESCALATE_CAP)
        if job.limit >= cap:
            return
        w = self.world
        cancel = self.buying.trader.cancel(bid_id, nonce=w.nonce(), now_ms=w.now_ms)
        w.publish(self.node, cancel)
        job.limit = min(cap, round(job.limit * ESCALATE_STEP))
        job.escalations += 1
        self._post(job)

    # -- negotiation -------------------------------------------------------------------

    def on_matches(self, matches: list[Match]) -> None:
        for match in matches:
            if match.bid.id in self.negotiating:
                self.buying.trader.book.release(match, rest_bid=True)
            else:
                self._propose(match)

    def _propose(self, match: Match) -> None:
        w = self.world
        proposal = self.buying.propose(
            match, nonce=w.nonce(), attestation_nonce=w.nonce(32), now_ms=w.now_ms
        )
        self.negotiating[match.bid.id] = proposal.id
        w.send(self.node, match.provider, "proposal", proposal.wire)
        w.at(NEGOTIATION_TIMEOUT_MS, self._negotiation_due, proposal.id)

    def _negotiation_due(self, proposal_id: MessageId, _: None) -> None:
        deal = self.buying.deals.get(proposal_id)
        if deal is not None and deal.machine.state is NegotiationState.PROPOSED:
            self.buying.negotiation_timed_out(proposal_id)
            self._next(deal.match.bid.id)

    def _next(self, bid_id: MessageId) -> None:
        self.negotiating.pop(bid_id, None)
        if bid_id in self.buying.trader.book.bids:
            self.on_matches(self.buying.next_match(bid_id, now_ms=self.world.now_ms))

    def on_direct(self, kind: str, wire: bytes, src: SimNode) -> None:
        w = self.world
        try:
            if kind == "reply":
                reply: Signed[Any] = self.buying.receive_reply(wire, now_ms=w.now_ms)
                proposal_id = MessageId(reply.payload.proposal_id)
                deal = self.buying.deals[proposal_id]
                if isinstance(reply.payload, Accept):
                    self._agreed(deal.match, self.buying.agree(proposal_id), src)
                else:
                    self._next(deal.match.bid.id)
            elif kind == "status":
                self.buying.receive_status(wire, now_ms=w.now_ms)
            elif kind == "receipt":
                self.on_receipt(wire, src)
        except (ProtocolError, KeyError):
            return  # late or stray: a real node refuses it with an error frame

    def _agreed(self, match: Match, agreement: Agreement, provider: SimNode) -> None:
        w = self.world
        self.negotiating.pop(match.bid.id, None)
        job = self.bid_jobs.pop(match.bid.id)
        if job.matched_ms is None:
            job.matched_ms = w.now
        job.price = agreement.terms.prices.cpu_core_hour
        job.provider = provider.index
        w.agreed(job, agreement, self, provider, resource_class(match.offer.payload))
        w.send(self.node, match.provider, "agreement", agreement.to_wire())
        self.following[agreement.id] = (job, 0)
        w.at(HEARTBEAT_MS, self._heartbeat, agreement)

    def _heartbeat(self, agreement: Agreement, _: None) -> None:
        followed = self.following.get(agreement.id)
        if followed is None:
            return
        job, missed = followed
        w = self.world
        provider = w.nodes[w.by_key[agreement.terms.provider]]
        w.stats.direct[self.node.index] += 2  # the ping and its answer
        w.stats.direct[provider.index] += 2
        alive = (
            w.reachable(self.node.index, provider.index)
            and provider.role is not None
            and provider.role.answers_ping(agreement.id)
        )
        missed = 0 if alive else missed + 1
        if missed < MISSED_HEARTBEATS:
            self.following[agreement.id] = (job, missed)
            w.at(HEARTBEAT_MS, self._heartbeat, agreement)
            return
        del self.following[agreement.id]
        self.buying.abandon(agreement.id)
        self.buying.trader.reputation[agreement.terms.provider] = -1
        job.faults += 1
        w.abandoned(job, agreement, provider)
        if job.attempts < MAX_ATTEMPTS:
            self.submit(job)
        else:
            job.gave_up = True

    def on_receipt(self, wire: bytes, provider: SimNode) -> None:
        w = self.world
        countersigned = self.buying.receive_receipt(wire, now_ms=w.now_ms)
        agreement_id = countersigned.receipt.payload.agreement_id
        followed = self.following.pop(agreement_id, None)
        if followed is None:
            return
        job = followed[0]
        job.settled_ms = w.now
        job.cost = countersigned.receipt.payload.cost
        w.send(self.node, provider.trader.me.raw, "countersigned", countersigned.to_wire())

    def answers_ping(self, agreement_id: bytes) -> bool:
        return True


class NoCountersignBuyer(Buyer):
    """Takes the work and never countersigns the receipt, so never pays."""

    def on_receipt(self, wire: bytes, provider: SimNode) -> None:
        receipt = self.buying.trader.open(wire, UsageReceipt, self.world.now_ms)
        followed = self.following.pop(receipt.payload.agreement_id, None)
        if followed is not None and self.score is not None:
            job = followed[0]
            self.score.unpaid_work_core_s += job.cls.cpu * job.run_ms / 1000
            self.score.agreements += 1


# -- spam ----------------------------------------------------------------------------------


class Spammer(Role):
    """Floods its mesh peers with orders no node may admit, one kind after another."""

    KINDS = ("bad-signature", "expired", "ttl-too-long", "garbage")

    def __init__(self, world: World, node: SimNode, per_min: float) -> None:
        super().__init__(world, node)
        self.every_ms = max(1, round(60_000 / per_min))
        self.count = 0

    def start(self) -> None:
        self.world.at(self.world.rng.randrange(self.every_ms), self._spam, None)

    def _spam(self, _: None, __: None) -> None:
        w = self.world
        kind = self.KINDS[self.count % len(self.KINDS)]
        self.count += 1
        w.publish(self.node, self.junk(kind))
        if self.score is not None:
            self.score.sent += 1
        w.at(self.every_ms, self._spam, None)

    def junk(self, kind: str) -> bytes:
        w = self.world
        bid = Bid(
            job=JobSpec(image=IMAGE, command=("spam",)),
            resources=Resources(cpu_milli=1000, memory_bytes=GIB),
            max_prices=Prices(cpu_core_hour=1),
        )
        key, now = self.node.trader.key, w.now_ms
        if kind == "garbage":
            return w.nonce(200)
        if kind == "expired":
            return seal(
                key, bid, nonce=w.nonce(), issued_ms=now - 7_200_000, expires_ms=now - 3_600_000
            ).wire
        if kind == "ttl-too-long":
            return seal(
                key, bid, nonce=w.nonce(), issued_ms=now, expires_ms=now + 30 * 24 * 3_600_000
            ).wire
        wire = seal(key, bid, nonce=w.nonce(), issued_ms=now, expires_ms=now + 600_000).wire
        return bytes([wire[0] ^ 1]) + wire[1:]
