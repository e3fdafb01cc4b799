"""The exchange in whole markets under MockClock (see test_market_clock.py): real nodes,
fake job runners, virtual time.

A provider on the ``utilization`` policy asks more as its capacity fills and less as it
empties; every trade leaves a print signed by both parties on every node's tape, and the
market view and candles are built from it; a deadline's bid climbs its ladder; a provider
whose capacity frees invites the bid it refused.
"""

from __future__ import annotations

from pathlib import Path

import trio
from fake_runner import FakeRunner
from market_support import PRICE, events, finished, market, state, submit, until, virtual

from node.api import views
from protocol.messages import Prices
from protocol.pricing import Policy, Pricing, ResourcePricing

FLOOR, CEILING = 50_000_000, 150_000_000


def utilization() -> Pricing:
    cpu = ResourcePricing(policy=Policy.UTILIZATION, price=PRICE, floor=FLOOR, ceiling=CEILING)
    fixed = Pricing.fixed(Prices(cpu_core_hour=PRICE, memory_gib_hour=9_000_000))
    return Pricing(resources={**fixed.resources, "cpu_core_hour": cpu}, min_interval_ms=1000)


def offer_price(node) -> int:
    offer = node.peer.provider.offer
    assert offer is not None
    return offer.payload.prices.cpu_core_hour


async def test_a_utilization_priced_provider_asks_more_as_it_fills_and_the_tape_shows_it(
    clock: trio.testing.MockClock, image_layout: Path
) -> None:
    runners: dict[Path, FakeRunner] = {}
    async with virtual(image_layout, runners) as c:
        provider = await c.provider("provider", pricing=utilization())
        buyer = await c.buyer("buyer")
        observer = await c.buyer("observer")  # trades nothing, keeps the tape
        for node in (buyer, observer):
            await node.peer.join(provider.addr)
        await observer.peer.join(buyer.addr)
        assert offer_price(provider) == FLOOR  # empty: at its floor

        first = (await submit(buyer, c.image, "sleep 120", cpu_milli=1000, price=CEILING))["id"]
        await state(buyer, first, "running")
        # half its CPU held: the price moves half way, and a fresh offer says so
        await until(lambda: offer_price(provider) == (FLOOR + CEILING) // 2, provider)
        second = (await submit(buyer, c.image, "sleep 60", cpu_milli=500, price=CEILING))["id"]
        assert (await finished(buyer, second))["price"]["cpu_core_hour"] == 100_000_000
        assert (await finished(buyer, first))["price"]["cpu_core_hour"] == FLOOR
        await until(lambda: offer_price(provider) == FLOOR, provider)  # empty again

        # Every node's tape holds both prints, signed by both parties, in time order.
        for node in (buyer, provider, observer):
            await until(lambda n=node: len(n.peer.market.tape) == 2, node)  # type: ignore[misc]
            prices = [t.prices.cpu_core_hour for t in node.peer.market.tape.prints()]
            assert prices == [FLOOR, 100_000_000], node.name
        view = market(observer)
        (cls,) = view["classes"]
        assert (cls["last_cpu_core_hour"], cls["volume"]) == (100_000_000, 2)
        assert cls["last_prices"] == [FLOOR, 100_000_000]
        assert cls["volume_cpu_milli"] == 1500
        prints = list(observer.peer.market.tape.prints())
        history = views.history(prints, interval_ms=3_600_000, price_field="cpu_core_hour")
        (candle,) = history["classes"][0]["candles"]
        assert (candle["open"], candle["high"], candle["low"], candle["close"]) == (
            FLOOR, 100_000_000, FLOOR, 100_000_000,
        )  # fmt: skip


async def test_a_late_joiner_pulls_the_tape_and_a_restart_keeps_it(
    clock: trio.testing.MockClock, image_layout: Path
) -> None:
    runners: dict[Path, FakeRunner] = {}
    async with virtual(image_layout, runners) as c:
        provider = await c.provider("provider")
        buyer = await c.buyer("buyer")
        await buyer.peer.join(provider.addr)
        job_id = (await submit(buyer, c.image, "sleep 5"))["id"]
        await finished(buyer, job_id)
        await until(lambda: len(provider.peer.market.tape) == 1, provider)

        late = await c.buyer("late")
        await late.peer.join(provider.addr)  # the tape exchange brings the print
        assert [t.prices.cpu_core_hour for t in late.peer.market.tape.prints()] == [PRICE]

        await provider.stop()
        restarted = await c.start(provider.home)
        assert len(restarted.peer.market.tape) == 1  # from its database


async def test_a_deadline_bid_climbs_its_ladder_until_an_offer_fits(
    clock: trio.testing.MockClock, image_layout: Path
) -> None:
    """Max 120 (CPU) and 10 (memory) within 10 minutes: the bid starts at half, and rises
    every 2.5 minutes; the offer (90 and 9) fits only the last rung's memory limit, so it
    trades at the deadline, at the offer's prices."""
    runners: dict[Path, FakeRunner] = {}
    async with virtual(image_layout, runners) as c:
        provider = await c.provider("provider", price=90_000_000)
        buyer = await c.buyer("buyer")
        await buyer.peer.join(provider.addr)
        job_id = (await submit(buyer, c.image, "sleep 5", price=120_000_000, deadline_ms=600_000))[
            "id"
        ]
        why = views.why(buyer.peer.why(job_id))
        assert why["deadline_limit"]["cpu_core_hour"] == 60_000_000
        assert why["next_rise_ms"] == buyer.peer.job(job_id).created_ms + 150_000
        assert (
            "limit is 60.00 credits per CPU core-hour now, rising in 150 s." in why["explanation"]
        )

        started = trio.current_time()
        done = await finished(buyer, job_id)
        assert done["state"] == "succeeded"
        assert done["price"]["cpu_core_hour"] == 90_000_000
        assert 600 <= trio.current_time() - started < 700  # matched at the last rise
        raised = [e["detail"] for e in buyer.peer.db.events(job_id) if "raised" in e["detail"]]
        assert raised == [
            f"limit raised to {price} credits per CPU core-hour"
            for price in ("75.00", "90.00", "105.00", "120.00")
        ]


async def test_a_bid_refused_for_capacity_is_invited_when_the_capacity_frees(
    clock: trio.testing.MockClock, image_layout: Path
) -> None:
    """One core, fixed price: the second job's proposal is refused (no capacity) and its
    bid rests, that offer excluded. No new offer comes (the price never moves); when the
    first job ends the provider invites the resting bid, and it runs at once."""
    runners: dict[Path, FakeRunner] = {}
    async with virtual(image_layout, runners) as c:
        provider = await c.provider("provider", cpu_milli=1000)
        alice, bob = await c.buyer("alice"), await c.buyer("bob")
        for buyer in (alice, bob):
            await buyer.peer.join(provider.addr)
        first = (await submit(alice, c.image, "sleep 60", cpu_milli=1000))["id"]
        await state(alice, first, "running")
        second = (await submit(bob, c.image, "sleep 5", cpu_milli=1000))["id"]
        await until(lambda: any("no-capacity" in e for e in events(bob, second)), bob)
        ended = (await finished(alice, first))["updated_ms"]
        done = await finished(bob, second)
        assert done["state"] == "succeeded"
        started = next(e["at_ms"] for e in bob.peer.db.events(second) if e["state"] == "running")
        assert started - ended < 10_000  # invited, not left waiting for a new offer
