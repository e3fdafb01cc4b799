"""A provider's quotas and priorities per group of buyers (protocol/quotas.py, applied by
protocol/selling.py), and the buyer's side of a quota refusal (protocol/buying.py)."""

from __future__ import annotations

import pytest
from factories import GIB, HOUR_MS, T0, Nonces, bid, end_job, key, offer

from protocol.buying import Buying
from protocol.envelope import open_signed
from protocol.errors import InvalidMessage
from protocol.messages import (
    Accept,
    QuotaKind,
    QuotaRefusal,
    Reject,
    RejectReason,
)
from protocol.quotas import (
    DAY_MS,
    GroupUse,
    Quota,
    Quotas,
    day_start,
    describe,
    held_back,
    refusal,
    why_rejected,
)
from protocol.schema import from_value, to_value
from protocol.selling import Selling
from protocol.trader import Trader

PROVIDER = key("provider")
ALICE, BOB, CAROL = key("alice"), key("bob"), key("carol")


def _group(name: str, *members: bytes, **limits: int) -> Quota:
    return Quota(name=name, members=frozenset(members), **limits)


# -- the rules, pure -----------------------------------------------------------------------


def test_a_buyer_is_in_the_first_group_naming_it_else_the_default_else_none():
    students = _group("students", ALICE.public_key.raw)
    staff = _group("staff", ALICE.public_key.raw, BOB.public_key.raw)
    default = _group("everyone")
    assert Quotas(groups=(students, staff, default)).group_of(ALICE.public_key.raw) == students
    assert Quotas(groups=(students, staff, default)).group_of(BOB.public_key.raw) == staff
    assert Quotas(groups=(students, staff, default)).group_of(CAROL.public_key.raw) == default
    assert Quotas(groups=(students, staff)).group_of(CAROL.public_key.raw) is None


@pytest.mark.parametrize(
    ("limits", "used", "more", "expected"),
    [
        ({"cpu_milli": 2000}, GroupUse(cpu_milli=1000), GroupUse(cpu_milli=1000), None),
        (
            {"cpu_milli": 2000},
            GroupUse(cpu_milli=1500),
            GroupUse(cpu_milli=1000),
            (QuotaKind.CORES, 2000, 1500),
        ),
        (
            {"memory_bytes": GIB},
            GroupUse(),
            GroupUse(memory_bytes=2 * GIB),
            (QuotaKind.MEMORY, GIB, 0),
        ),
        ({"gpus": 0}, GroupUse(), GroupUse(gpus=1), (QuotaKind.GPUS, 0, 0)),
        ({"jobs": 1}, GroupUse(jobs=1), GroupUse(jobs=1), (QuotaKind.JOBS, 1, 1)),
        (
            {"credits_per_day": 5_000_000},
            GroupUse(credits=4_000_000),
            GroupUse(credits=1_000_001),
            (QuotaKind.CREDITS_PER_DAY, 5_000_000, 4_000_000),
        ),
        # the first quota passed is named, in the order of QuotaKind
        (
            {"jobs": 0, "cpu_milli": 0},
            GroupUse(),
            GroupUse(cpu_milli=1, jobs=1),
            (QuotaKind.CORES, 0, 0),
        ),
        ({}, GroupUse(cpu_milli=10**9), GroupUse(cpu_milli=10**9, jobs=9), None),
    ],
)
def test_the_first_quota_a_request_would_pass_is_named(limits, used, more, expected):
    got = refusal(_group("g", **limits), used, more)
    if expected is None:
        assert got is None
    else:
        assert (got.quota, got.limit, got.used, got.group) == (*expected, "g")


def test_a_refusal_reads_as_one_line_naming_quota_group_and_limit():
    line = describe(QuotaRefusal(quota=QuotaKind.CORES, group="students", limit=2000, used=1500))
    assert line == "quota:cores: group 'students' may hold 2 cores; it has 1.5 cores"
    jobs = QuotaRefusal(quota=QuotaKind.JOBS, group="guests", limit=1, used=1)
    assert describe(jobs) == "quota:jobs: group 'guests' may run 1 job(s) at once; it runs 1"
    reject = Reject(proposal_id=b"p", reason=RejectReason.QUOTA, quota=jobs)
    assert why_rejected(reject) == describe(jobs)
    plain = Reject(proposal_id=b"p", reason=RejectReason.NO_CAPACITY, detail="full")
    assert why_rejected(plain) == "no-capacity full"
    assert held_back({}) is None
    assert held_back({PROVIDER.public_key.raw: jobs}).startswith(
        f"{PROVIDER.public_key.peer_id} refused it, quota:jobs"
    )


def test_the_day_is_the_utc_calendar_day():
    midnight = T0 - T0 % DAY_MS
    assert day_start(midnight) == midnight
    assert day_start(midnight + DAY_MS - 1) == midnight
    assert day_start(midnight + DAY_MS) == midnight + DAY_MS


def test_a_reject_names_a_quota_exactly_when_its_reason_is_quota():
    quota = QuotaRefusal(quota=QuotaKind.JOBS, group="g", limit=1, used=1)
    with pytest.raises(ValueError, match="quota"):
        Reject(proposal_id=b"p", reason=RejectReason.QUOTA)
    with pytest.raises(ValueError, match="quota"):
        Reject(proposal_id=b"p", reason=RejectReason.NO_CAPACITY, quota=quota)
    value = to_value(Reject(proposal_id=b"p", reason=RejectReason.QUOTA, quota=quota))
    assert value["quota"] == {"quota": "jobs", "group": "g", "limit": 1, "used": 1}
    value["reason"] = "no-capacity"
    with pytest.raises(InvalidMessage):
        from_value(Reject, value)


# -- the provider's core -------------------------------------------------------------------


def _provider(quotas: Quotas) -> tuple[Selling, Nonces]:
    selling, nonce = Selling(Trader(PROVIDER), quotas=quotas), Nonces()
    selling.post_offer(offer(cpu_milli=4000), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    return selling, nonce


def _buyer(who, selling: Selling) -> Buying:
    buying = Buying(Trader(who))
    buying.trader.receive_order(selling.offer.wire, now_ms=T0)
    return buying


def _propose(buying: Buying, selling: Selling, nonce: Nonces, *, cpu_milli: int):
    """Bid, propose and let the provider answer (agreeing after an accept); the reply."""
    _, matches = buying.trader.post(
        bid(cpu_milli=cpu_milli), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS
    )
    [match] = matches
    proposal = buying.propose(match, nonce=nonce(), attestation_nonce=nonce(32), now_ms=T0)
    selling.receive_proposal(proposal.wire, now_ms=T0)
    reply = selling.accept(proposal.id, evidence=None, nonce=nonce(), now_ms=T0)
    buying.receive_reply(reply.wire, now_ms=T0)
    if isinstance(reply.payload, Accept):
        selling.receive_agreement(buying.agree(proposal.id).to_wire())
    return reply, match


def test_a_group_past_its_cores_quota_is_refused_naming_it_while_others_are_served():
    students = _group("students", ALICE.public_key.raw, BOB.public_key.raw, cpu_milli=2000)
    selling, nonce = _provider(Quotas(groups=(students,)))
    alice, bob, carol = (_buyer(k, selling) for k in (ALICE, BOB, CAROL))
    assert isinstance(_propose(alice, selling, nonce, cpu_milli=1500)[0].payload, Accept)
    reply, _ = _propose(bob, selling, nonce, cpu_milli=1000)  # the group's, not bob's own
    assert isinstance(reply.payload, Reject)
    assert reply.payload.reason is RejectReason.QUOTA
    assert reply.payload.quota == QuotaRefusal(
        quota=QuotaKind.CORES, group="students", limit=2000, used=1500
    )
    assert reply.payload.detail == describe(reply.payload.quota)
    # the reject travels signed: the buyer reads the same quota from the bytes
    assert open_signed(reply.wire).payload.quota == reply.payload.quota
    # carol is in no group: no quota limits her
    assert isinstance(_propose(carol, selling, nonce, cpu_milli=2500)[0].payload, Accept)


def test_jobs_at_once_counts_accepted_and_live_jobs_and_frees_with_the_receipt():
    default = _group("everyone", jobs=1)
    selling, nonce = _provider(Quotas(groups=(default,)))
    alice = _buyer(ALICE, selling)
    assert isinstance(_propose(alice, selling, nonce, cpu_milli=500)[0].payload, Accept)
    refused, _ = _propose(alice, selling, nonce, cpu_milli=500)
    assert refused.payload.quota.quota is QuotaKind.JOBS
    end_job(selling, nonce, next(iter(selling.agreements)))
    assert isinstance(_propose(alice, selling, nonce, cpu_milli=500)[0].payload, Accept)


def test_credits_per_day_count_settled_spend_and_the_cap_of_unsettled_jobs():
    default = _group("everyone", credits_per_day=300_000)
    selling, nonce = _provider(Quotas(groups=(default,)))
    alice = _buyer(ALICE, selling)
    # one core for an hour at 0.10 credit per core-hour + 1 GiB at 0.01: max_cost 110_000
    first, _ = _propose(alice, selling, nonce, cpu_milli=1000)
    assert isinstance(first.payload, Accept)
    selling.spent_today = {ALICE.public_key.raw: 100_000}  # settled today, from the ledger
    refused, _ = _propose(alice, selling, nonce, cpu_milli=1000)
    assert refused.payload.quota == QuotaRefusal(
        quota=QuotaKind.CREDITS_PER_DAY, group="everyone", limit=300_000, used=210_000
    )
    selling.spent_today = {}  # a new UTC day
    assert isinstance(_propose(alice, selling, nonce, cpu_milli=1000)[0].payload, Accept)


def test_invitations_skip_bids_past_a_quota_and_put_higher_priority_groups_first():
    gold = _group("gold", CAROL.public_key.raw, priority=10)
    capped = _group("capped", ALICE.public_key.raw, jobs=1)
    selling, nonce = _provider(Quotas(groups=(gold, capped)))
    alice, bob, carol = (_buyer(k, selling) for k in (ALICE, BOB, CAROL))
    _propose(alice, selling, nonce, cpu_milli=3000)  # alice holds her one job
    resting = {}
    for name, buying, limit in (("alice", alice, 300_000), ("bob", bob, 250_000),
                                ("carol", carol, 150_000)):  # fmt: skip
        order, _ = buying.trader.post(
            bid(cpu_milli=1000, cpu_limit=limit), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS
        )
        selling.trader.receive_order(order.wire, now_ms=T0)
        resting[name] = order.id
    # one core free: carol's group has priority over bob's higher limit; alice is capped
    assert [o.id for o in selling.invitations(now_ms=T0)] == [resting["carol"]]
    end_job(selling, nonce, next(iter(selling.agreements)))
    # alice's job ended: her quota and capacity are free, and the highest limit goes first
    assert [o.id for o in selling.invitations(now_ms=T0)] == [resting["alice"], resting["bob"]]


def test_one_round_of_invitations_counts_the_bids_it_invites_against_the_quota():
    capped = _group("capped", ALICE.public_key.raw, jobs=1)
    selling, nonce = _provider(Quotas(groups=(capped,)))
    alice = _buyer(ALICE, selling)
    for _ in range(2):
        order, _ = alice.trader.post(bid(cpu_milli=1000), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
        selling.trader.receive_order(order.wire, now_ms=T0)
    assert len(selling.invitations(now_ms=T0)) == 1


# -- the buyer's side ----------------------------------------------------------------------


def test_a_buyer_refused_for_a_quota_holds_its_bid_back_from_that_provider_until_invited():
    capped = _group("capped", ALICE.public_key.raw, jobs=1)
    selling, nonce = _provider(Quotas(groups=(capped,)))
    alice = _buyer(ALICE, selling)
    _propose(alice, selling, nonce, cpu_milli=1000)
    refused, match = _propose(alice, selling, nonce, cpu_milli=1000)
    bid_id = match.bid.id
    assert alice.over_quota[bid_id] == {PROVIDER.public_key.raw: refused.payload.quota}
    # the provider's next offer matches the resting bid in alice's book: held back
    newer = selling.post_offer(offer(cpu_milli=4000), nonce=nonce(), now_ms=T0 + 1,
                               ttl_ms=HOUR_MS)  # fmt: skip
    _, [again] = alice.trader.receive_order(newer.wire, now_ms=T0 + 1)
    assert alice.held_back(again)
    assert alice.trader.book.bids[bid_id].order.id == bid_id  # it rests again
    assert alice.next_match(bid_id, now_ms=T0 + 1) == []
    # the job ends; the provider invites the bid and alice may propose again
    end_job(selling, nonce, next(iter(selling.agreements)))
    selling.trader.receive_order(match.bid.wire, now_ms=T0 + 1)
    [invited] = selling.invitations(now_ms=T0 + 1)
    invitation = selling.invite(invited, nonce=nonce(), now_ms=T0 + 1)
    match_now = alice.receive_invitation(invitation.wire, now_ms=T0 + 1)
    assert match_now is not None
    assert not alice.held_back(match_now)


def test_a_bid_that_already_traded_here_is_not_invited_and_takes_no_quota():
    """Seen in a real run: the provider's book still held the bid of the job that had just
    ended; inviting it again used the group's one job, and the waiting bid stayed out."""
    capped = _group("capped", ALICE.public_key.raw, jobs=1)
    selling, nonce = _provider(Quotas(groups=(capped,)))
    alice = _buyer(ALICE, selling)
    _, first = _propose(alice, selling, nonce, cpu_milli=1000)
    _, second = _propose(alice, selling, nonce, cpu_milli=1000)  # refused for the quota
    for match in (first, second):  # both bids reached the provider by gossip
        selling.trader.receive_order(match.bid.wire, now_ms=T0)
    end_job(selling, nonce, next(iter(selling.agreements)))
    assert [o.id for o in selling.invitations(now_ms=T0)] == [second.bid.id]
