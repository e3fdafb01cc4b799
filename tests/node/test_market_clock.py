"""Whole markets under trio's MockClock: virtual time drives every expiry, heartbeat and
retry, with the production timings (node.clock.Timings' defaults) and no patching.

Each node is a real ``serve_peer`` (SQLite, store, transfer, outbox) on the in-memory
network; only the job runner is the fake of tests/node/fake_runner.py, whose jobs last the
seconds their command sleeps in virtual time. So an hour of market passes in well under a
second, and the tests say exactly how many heartbeats a vanished provider gets.
"""

from __future__ import annotations

from pathlib import Path

import trio
from fake_runner import FakeRunner
from market_support import (
    PRICE,
    events,
    finished,
    ledger,
    market,
    state,
    submit,
    until,
    virtual,
)

from node.clock import Timings
from protocol.messages import Prices


async def test_a_vanished_provider_is_at_fault_after_three_silent_heartbeats(
    clock: trio.testing.MockClock, image_layout: Path
) -> None:
    """A provider that goes silent mid-job misses its buyer's heartbeats (1 s apart, each
    with 2 s to answer); after the third the job is bid again and runs elsewhere, the
    silent one unpaid: all in virtual seconds."""
    runners: dict[Path, FakeRunner] = {}
    async with virtual(image_layout, runners) as c:
        cheap = await c.provider("cheap", price=80_000_000)
        dear = await c.provider("dear", price=PRICE)
        buyer = await c.buyer("buyer")
        for provider in (cheap, dear):
            await buyer.peer.join(provider.addr)
        await until(lambda: market(buyer)["offers"] == 2, buyer)

        job_id = (await submit(buyer, c.image, "sleep 120"))["id"]
        assert (await state(buyer, job_id, "running"))["provider"] == cheap.peer_id
        stopped_at = trio.current_time()
        await cheap.stop()

        await state(buyer, job_id, "provider-fault")
        silent_for = trio.current_time() - stopped_at
        # three missed heartbeats: at most 1 s wait + 2 s timeout each
        assert 3 <= silent_for <= 3 * (1 + 2) + 1, silent_for
        done = await finished(buyer, job_id)
        assert done["state"] == "succeeded", "\n".join(events(buyer, job_id))
        assert done["provider"] == dear.peer_id
        assert trio.current_time() - stopped_at >= 120  # the whole job ran on dear
        assert [e["payee"] for e in ledger(buyer)["entries"]] == [dear.peer_id]


async def test_offers_are_reposted_before_they_expire_and_the_old_ones_withdrawn(
    clock: trio.testing.MockClock, image_layout: Path
) -> None:
    """Over ten virtual minutes a provider's offer (a minute's lifetime) is re-posted at nine
    tenths of its life and the one it replaces withdrawn: the buyer never goes without it,
    and at the end holds exactly the current one, which is all the provider keeps."""
    runners: dict[Path, FakeRunner] = {}
    async with virtual(image_layout, runners) as c:
        provider = await c.provider("provider", offer_ttl_ms=60_000)
        buyer = await c.buyer("buyer")
        await buyer.peer.join(provider.addr)
        await until(lambda: market(buyer)["offers"] == 1, buyer)
        seen = {provider.peer.provider.offer.id}
        end = trio.current_time() + 600
        while trio.current_time() < end:
            await buyer.peer.changed()
            assert market(buyer)["offers"] >= 1  # the new offer comes before the old goes
            seen.add(provider.peer.provider.offer.id)
        assert len(seen) >= 600 // 54  # one offer each 54 s
        await trio.testing.wait_all_tasks_blocked()
        current = provider.peer.provider.offer.id
        book = buyer.peer.market.trader.book
        assert [o.order.id for o in book.live_offers(buyer.peer.market.now_ms())] == [current]
        kept = [row for row in provider.peer.db.orders() if row[1] == "offer"]
        assert [row[0] for row in kept] == [current]


async def test_a_better_paying_bid_preempts_in_virtual_time_and_the_victim_runs_again(
    clock: trio.testing.MockClock, image_layout: Path
) -> None:
    """The provider's preemption decision (protocol.selling) acted on by the node: once the
    full provider asks more, the preemptible job agreed at the old price stops, is settled
    for its run and bid again at its own limit, and runs to its end once the dear job has
    finished and the provider asks its old price again."""
    runners: dict[Path, FakeRunner] = {}
    async with virtual(image_layout, runners) as c:
        provider = await c.provider("provider", price=PRICE, cpu_milli=500, offer_ttl_ms=60_000)
        thrifty, eager = await c.buyer("thrifty"), await c.buyer("eager")
        await thrifty.peer.join(provider.addr)
        cheap = (await submit(thrifty, c.image, "sleep 30", preemptible=True))["id"]
        await state(thrifty, cheap, "running")
        assert provider.peer.provider is not None
        await provider.peer.provider.set_offer(prices=Prices(cpu_core_hour=150_000_000))
        urgent = (await submit(eager, c.image, "sleep 10", price=200_000_000))["id"]
        await eager.peer.join(provider.addr)

        assert (await finished(eager, urgent))["state"] == "succeeded"
        # Demand falls again; the provider's ask with it, and the preempted job comes back.
        await provider.peer.provider.set_offer(prices=Prices(cpu_core_hour=PRICE))
        done = await finished(thrifty, cheap)
        log = events(thrifty, cheap)
        assert done["state"] == "succeeded", "\n".join(log)
        assert done["attempts"] == 2
        assert any(e.startswith("preempted: ") for e in log), log
        runner = runners[provider.home.root]
        assert len(runner.started) == 3  # cheap, urgent, cheap again


async def test_nothing_is_left_to_do_after_a_job_and_ten_quiet_minutes(
    clock: trio.testing.MockClock, image_layout: Path
) -> None:
    """After a job settles and ten quiet minutes pass, the buyer's book holds no bid and the
    provider's outbox is empty: nothing was left to retry or expire by hand."""
    runners: dict[Path, FakeRunner] = {}
    async with virtual(image_layout, runners) as c:
        provider = await c.provider("provider", timings=Timings())
        buyer = await c.buyer("buyer")
        await buyer.peer.join(provider.addr)
        job_id = (await submit(buyer, c.image, "sleep 5"))["id"]
        assert (await finished(buyer, job_id))["state"] == "succeeded"
        await until(lambda: ledger(provider)["entries"], provider)
        await trio.sleep(600)
        assert market(buyer)["bids"] == 0
        assert provider.peer.db.outbox() == []


async def test_a_quick_job_settles_without_waiting_for_an_outbox_retry(
    clock: trio.testing.MockClock, image_layout: Path
) -> None:
    """A receipt queued while the provider still delivers the job's last status to the same
    buyer goes right after it, not at the next retry of the outbox. The retry is set to an
    hour: far more virtual time than the clock's jumps add while worker threads run."""
    runners: dict[Path, FakeRunner] = {}
    retry_s = 3600.0
    async with virtual(image_layout, runners) as c:
        provider = await c.provider("provider", timings=Timings(retry_s=retry_s))
        buyer = await c.buyer("buyer")
        await buyer.peer.join(provider.addr)
        for _ in range(3):
            submitted = trio.current_time()
            job_id = (await submit(buyer, c.image, "true"))["id"]
            assert (await finished(buyer, job_id))["state"] == "succeeded"
            assert trio.current_time() - submitted < retry_s
