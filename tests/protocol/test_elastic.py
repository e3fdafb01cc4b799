"""Elastic jobs' pure rules: ceilings, what a buyer accepts of the growth, what it costs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.elastic import ceiling, check_elastic, check_grants, cpu_grant, memory_step
from protocol.errors import InvalidMessage, Reason
from protocol.limits import OutOfBounds
from protocol.messages import Elastic, Grant, Prices, Resources, Usage
from protocol.settlement import cost, quote

MIB = 1 << 20
RES = Resources(cpu_milli=1000, memory_bytes=64 * MIB)
ELASTIC = Elastic(memory_bytes=256 * MIB, cpu_milli=4000)


def test_ceiling_and_its_bounds() -> None:
    assert ceiling(RES, ELASTIC) == Resources(cpu_milli=4000, memory_bytes=256 * MIB)
    assert ceiling(RES, None) == RES
    check_elastic(RES, ELASTIC)
    with pytest.raises(OutOfBounds) as exc:
        check_elastic(RES, Elastic(memory_bytes=32 * MIB))
    assert exc.value.field == "elastic.memory_bytes"
    with pytest.raises(OutOfBounds) as exc:
        check_elastic(RES, Elastic(cpu_milli=10**9))
    assert exc.value.field == "elastic.cpu_milli"


@pytest.mark.parametrize(
    ("grants", "why"),
    [
        ((Grant(at_ms=5, cpu_milli=1000, memory_bytes=512 * MIB),), "memory beyond"),
        ((Grant(at_ms=5, cpu_milli=8000, memory_bytes=64 * MIB),), "CPU beyond"),
        ((Grant(at_ms=5, cpu_milli=500, memory_bytes=64 * MIB),), "CPU beyond"),
        ((Grant(at_ms=2000, cpu_milli=1000, memory_bytes=64 * MIB),), "out of order"),
        (
            (
                Grant(at_ms=9, cpu_milli=1000, memory_bytes=96 * MIB),
                Grant(at_ms=5, cpu_milli=1000, memory_bytes=128 * MIB),
            ),
            "out of order",
        ),
    ],
)
def test_a_buyer_refuses_grants_the_terms_do_not_allow(grants: tuple[Grant, ...], why: str) -> None:
    usage = Usage(wall_ms=1000, cpu_us=0, grants=grants)
    with pytest.raises(InvalidMessage) as exc:
        check_grants(RES, ELASTIC, usage)
    assert exc.value.reason is Reason.TERMS_MISMATCH
    assert why in str(exc.value)
    with pytest.raises(InvalidMessage):
        check_grants(RES, None, Usage(wall_ms=1000, cpu_us=0, grants=grants[:1]))


def test_allowed_grants_pass() -> None:
    grants = (
        Grant(at_ms=5, cpu_milli=1000, memory_bytes=96 * MIB),
        Grant(at_ms=9, cpu_milli=4000, memory_bytes=256 * MIB),
    )
    check_grants(RES, ELASTIC, Usage(wall_ms=1000, cpu_us=0, grants=grants))


@given(
    limit=st.integers(4 * MIB, 1 << 40),
    used=st.integers(0, 1 << 41),
    top=st.integers(0, 1 << 41),
    free=st.integers(-(1 << 30), 1 << 41),
)
def test_memory_never_shrinks_nor_passes_the_ceiling_or_the_free_capacity(
    limit: int, used: int, top: int, free: int
) -> None:
    step = memory_step(limit=limit, used=used, top=top, free=free)
    assert step.limit >= limit
    if step.limit > limit:
        assert step.limit <= top
        assert step.limit - limit <= free
        assert not step.exhausted


@given(
    asked=st.integers(0, 10**7),
    current=st.integers(10, 10**6),
    top=st.integers(10, 10**6),
    free=st.integers(-(10**6), 10**6),
)
def test_cpu_grants_stay_between_what_it_has_and_what_is_allowed(
    asked: int, current: int, top: int, free: int
) -> None:
    got = cpu_grant(asked=asked, current=current, top=top, free=free)
    assert got >= current
    if got > current:
        assert got <= min(asked, top, current + free)


def test_memory_is_billed_for_the_limit_in_force_and_the_quote_covers_the_ceiling() -> None:
    prices = Prices(cpu_core_hour=0, memory_gib_hour=1_000_000)
    one_gib = Resources(cpu_milli=1000, memory_bytes=1 << 30)
    hour = 3_600_000
    grown = Usage(
        wall_ms=hour,
        cpu_us=0,
        grants=(Grant(at_ms=hour // 4, cpu_milli=1000, memory_bytes=3 << 30),),
    )
    # a quarter hour at 1 GiB, three quarters at 3 GiB: 2.5 GiB-hours
    assert cost(prices, one_gib, grown) == 2_500_000
    top = ceiling(one_gib, Elastic(memory_bytes=3 << 30))
    assert quote(prices, top, hour) >= cost(prices, one_gib, grown)
