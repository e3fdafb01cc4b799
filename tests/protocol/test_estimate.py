"""Resource estimation's pure rules: the image label, scaling a sampled run, headroom."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.estimate import (
    MIN_MEMORY,
    BadEstimateLabel,
    EstimateRule,
    Observed,
    parse_estimate_label,
    recommend,
)
from protocol.limits import check_resources
from protocol.messages import Prices

MIB = 1 << 20


def test_label_parses_command_sample_and_memory_rule() -> None:
    rule = parse_estimate_label(
        '{"command": ["sh", "-c", "run --quick"], "sample_bytes": 4096, "memory": "linear"}'
    )
    assert rule == EstimateRule(
        command=("sh", "-c", "run --quick"), sample_bytes=4096, memory_scales=True
    )
    assert parse_estimate_label("{}") == EstimateRule()


@pytest.mark.parametrize(
    ("label", "key"),
    [
        ("not json", ""),
        ("[1]", ""),
        ('{"cmd": ["x"]}', "cmd"),
        ('{"command": "sh -c x"}', "command"),
        ('{"command": []}', "command"),
        ('{"command": ["sh", ""]}', "command"),
        ('{"sample_bytes": 0}', "sample_bytes"),
        ('{"sample_bytes": true}', "sample_bytes"),
        ('{"sample_bytes": 1.5}', "sample_bytes"),
        ('{"memory": "quadratic"}', "memory"),
    ],
)
def test_label_refusals_name_the_key(label: str, key: str) -> None:
    with pytest.raises(BadEstimateLabel) as exc:
        parse_estimate_label(label)
    assert exc.value.key == key
    assert exc.value.reason == "bad-estimate-label"
    assert str(exc.value).startswith("org.computeexchange.estimate")


def test_headroom_on_a_full_run() -> None:
    # 2 s of wall time, 1.5 s of CPU (0.75 cores), 100 MiB peak, 10 MiB of scratch.
    rec = recommend(
        Observed(
            wall_ms=2000, cpu_us=1_500_000, memory_peak_bytes=100 * MIB, scratch_bytes=10 * MIB
        )
    )
    assert rec.scale == 1
    assert rec.resources.cpu_milli == 900  # 0.75 x 1.1 = 0.825 -> 900m
    assert rec.resources.memory_bytes == 125 * MIB
    assert rec.resources.disk_bytes == 13 * MIB  # 12.5 rounded up
    assert rec.wall_ms == 14_000  # 2 x 2 s + 10 s
    assert rec.expected.cpu_us == 1_500_000


def test_a_sampled_run_scales_cpu_wall_and_io_but_fixed_memory_stays() -> None:
    seen = Observed(wall_ms=1000, cpu_us=900_000, memory_peak_bytes=40 * MIB, io_read_bytes=10)
    rec = recommend(seen, full_input_bytes=4000, sampled_input_bytes=1000)
    assert rec.scale == 4
    assert (rec.expected.wall_ms, rec.expected.cpu_us, rec.expected.io_read_bytes) == (
        4000,
        3_600_000,
        40,
    )
    assert rec.expected.memory_peak_bytes == 40 * MIB
    assert rec.resources.memory_bytes == 50 * MIB
    linear = recommend(seen, full_input_bytes=4000, sampled_input_bytes=1000, memory_scales=True)
    assert linear.resources.memory_bytes == 200 * MIB


def test_expected_and_worst_cost_come_from_settlement() -> None:
    rec = recommend(Observed(wall_ms=3_600_000, cpu_us=3_600_000_000, memory_peak_bytes=800 * MIB))
    prices = Prices(cpu_core_hour=1_000_000, memory_gib_hour=100_000)
    # one core-hour of CPU, 1000 MiB (800 MiB x 1.25) for an hour: 1 + 0.1 x 1000/1024
    assert rec.expected_cost(prices) == 1_097_656
    assert rec.worst_cost(prices) > rec.expected_cost(prices)


@given(
    wall_ms=st.integers(0, 40 * 24 * 3_600_000),
    cpu_us=st.integers(0, 10**13),
    memory=st.integers(0, 1 << 48),
    scratch=st.integers(0, 1 << 48),
    full=st.integers(0, 1 << 40),
    sampled=st.integers(0, 1 << 40),
    memory_scales=st.booleans(),
)
def test_a_recommendation_is_always_a_usable_request_covering_what_was_seen(
    wall_ms: int,
    cpu_us: int,
    memory: int,
    scratch: int,
    full: int,
    sampled: int,
    memory_scales: bool,
) -> None:
    seen = Observed(wall_ms=wall_ms, cpu_us=cpu_us, memory_peak_bytes=memory, scratch_bytes=scratch)
    rec = recommend(
        seen, full_input_bytes=full, sampled_input_bytes=sampled, memory_scales=memory_scales
    )
    check_resources(rec.resources)  # never OutOfBounds
    assert rec.scale >= 1
    assert rec.resources.memory_bytes >= min(MIN_MEMORY, 64 << 40)
    # Within the bounds, every figure covers the run it was derived from.
    if rec.expected.memory_peak_bytes <= 50 << 40:
        assert rec.resources.memory_bytes >= rec.expected.memory_peak_bytes
    if rec.wall_ms < 30 * 24 * 3_600_000:
        assert rec.wall_ms > rec.expected.wall_ms
        cores = Fraction(rec.expected.cpu_us, rec.expected.wall_ms * 1000)
        if cores * 1000 < 1_000_000:
            assert rec.resources.cpu_milli >= cores * 1000
