"""Pricing policies (protocol/pricing.py): what a provider asks, and when it says so."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from protocol.messages import Prices, Resources
from protocol.pricing import (
    Policy,
    Pricing,
    ResourcePricing,
    asking,
    cost_floor,
    should_repost,
)

GIB = 1 << 30
CAPACITY = Resources(cpu_milli=4000, memory_bytes=8 * GIB, disk_bytes=0)
NONE = Resources(cpu_milli=0, memory_bytes=0)


def utilization(floor: int = 50, ceiling: int = 150) -> Pricing:
    rule = ResourcePricing(policy=Policy.UTILIZATION, price=floor, floor=floor, ceiling=ceiling)
    return Pricing(resources={"cpu_core_hour": rule, "memory_gib_hour": rule})


def test_fixed_pricing_asks_the_configured_prices_whatever_is_held():
    prices = Prices(cpu_core_hour=90, memory_gib_hour=9)
    pricing = Pricing.fixed(prices)
    assert asking(pricing, held=NONE, capacity=CAPACITY) == prices
    assert asking(pricing, held=CAPACITY, capacity=CAPACITY) == prices


def test_utilization_rises_with_what_is_held_and_falls_as_it_empties():
    pricing = utilization()
    empty = asking(pricing, held=NONE, capacity=CAPACITY)
    half = asking(pricing, held=Resources(cpu_milli=2000, memory_bytes=GIB), capacity=CAPACITY)
    full = asking(pricing, held=CAPACITY, capacity=CAPACITY)
    assert (empty.cpu_core_hour, half.cpu_core_hour, full.cpu_core_hour) == (50, 100, 150)
    assert half.memory_gib_hour == 50 + 100 * GIB // (8 * GIB)
    # disk is not sold (capacity 0): its rule is free, so it asks nothing
    assert half.disk_gib_hour == 0


@given(
    held=st.integers(min_value=-10, max_value=10_000),
    floor=st.integers(min_value=0, max_value=10**9),
    spread=st.integers(min_value=0, max_value=10**9),
)
def test_utilization_never_leaves_floor_and_ceiling_and_never_falls_as_more_is_held(
    held, floor, spread
):
    pricing = utilization(floor, floor + spread)
    capacity = Resources(cpu_milli=4000, memory_bytes=GIB)
    price = asking(pricing, held=Resources(cpu_milli=held, memory_bytes=0), capacity=capacity)
    more = asking(pricing, held=Resources(cpu_milli=held + 1, memory_bytes=0), capacity=capacity)
    assert floor <= price.cpu_core_hour <= floor + spread
    assert more.cpu_core_hour >= price.cpu_core_hour


def test_market_follows_the_median_print_less_its_undercut_within_floor_and_ceiling():
    rule = ResourcePricing(
        policy=Policy.MARKET, price=80, floor=60, ceiling=200, undercut_ppm=100_000
    )
    pricing = Pricing(resources={"cpu_core_hour": rule})

    def cpu(prints):
        return asking(
            pricing, held=NONE, capacity=CAPACITY, prints={"cpu_core_hour": prints}
        ).cpu_core_hour

    assert cpu([]) == 80  # no prints yet: the configured price
    assert cpu([100, 120, 110]) == 99  # median 110, 10 % under
    assert cpu([10, 20, 30]) == 60  # never under the floor
    assert cpu([1000]) == 200  # never over the ceiling


def test_a_cost_floor_pays_for_power_and_wear():
    # 400 W at 0.30 credits/kWh = 0.12 credits/h; wear 0.08 credits/h; over 4 cores:
    # 0.05 credits per core-hour = 50,000 micro-credits
    floor = cost_floor(watts=400, kwh_price=300_000, depreciation_per_hour=80_000, cpu_milli=4000)
    assert floor == 50_000
    assert cost_floor(watts=1, kwh_price=1, depreciation_per_hour=0, cpu_milli=3) == 1  # up


def test_reposting_waits_for_a_real_move_and_for_the_interval():
    old = Prices(cpu_core_hour=1_000_000, memory_gib_hour=0)
    small = Prices(cpu_core_hour=1_040_000, memory_gib_hour=0)
    big = Prices(cpu_core_hour=1_060_000, memory_gib_hour=0)
    rules = {"step_ppm": 50_000, "min_interval_ms": 10_000}
    assert not should_repost(old, small, posted_ms=0, now_ms=20_000, **rules)
    assert should_repost(old, big, posted_ms=0, now_ms=20_000, **rules)
    assert not should_repost(old, big, posted_ms=15_000, now_ms=20_000, **rules)
    free_to_paid = Prices(cpu_core_hour=1_000_000, memory_gib_hour=1)
    assert should_repost(old, free_to_paid, posted_ms=0, now_ms=20_000, **rules)
