"""protocol/units.py: the one grammar of sizes, CPU, durations and credits that every
command and config value reads (SI and binary suffixes alike, no silent surprises)."""

from __future__ import annotations

import pytest

from protocol.units import (
    UnitError,
    parse_cpu_milli,
    parse_credits,
    parse_duration_ms,
    parse_size,
)

Ki, Mi, Gi = 1 << 10, 1 << 20, 1 << 30


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("4096B", 4096),
        ("128Mi", 128 * Mi),
        ("128MiB", 128 * Mi),
        ("1Gi", Gi),
        ("1gi", Gi),
        ("64Ki", 64 * Ki),
        ("128M", 128_000_000),
        ("128MB", 128_000_000),
        ("0.5G", 500_000_000),
        ("0.5Gi", Gi // 2),
        ("2g", 2_000_000_000),
        ("1k", 1000),
        ("1K", 1000),
        ("1T", 10**12),
        (" 8 Gi ", 8 * Gi),
    ],
)
def test_sizes_read_si_and_binary_suffixes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("128m", "ambiguous: write 128M (megabytes, 10^6) or 128Mi (mebibytes, 2^20)"),
        ("1.5", "not a whole number of bytes"),
        ("lots", "not a size like 512Mi"),
        ("12Q", "not a size like 512Mi"),
        ("-1G", "not a size like 512Mi"),
        ("", "not a size like 512Mi"),
    ],
)
def test_sizes_that_do_not_read_say_why(text, says):
    with pytest.raises(UnitError) as caught:
        parse_size(text)
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("text", "expected"), [("0.5", 500), ("2", 2000), ("500m", 500), ("1.25", 1250)]
)
def test_cpu_in_cores_or_millicores(text, expected):
    assert parse_cpu_milli(text) == expected


@pytest.mark.parametrize("text", ["0", "-1", "abc", "0m", "nan", "inf", "0.0005"])
def test_cpu_refuses_nothing_negative_and_noise(text):
    with pytest.raises(UnitError):
        parse_cpu_milli(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5", 5000),
        ("30s", 30_000),
        ("500ms", 500),
        ("10m", 600_000),
        ("10min", 600_000),
        ("1.5h", 5_400_000),
        ("1h30m", 5_400_000),
        ("1m5s", 65_000),
        ("1d", 86_400_000),
    ],
)
def test_durations(text, expected):
    assert parse_duration_ms(text) == expected


@pytest.mark.parametrize("text", ["soon", "5x", "h", "1h 30m", "0.0001s", "-5s"])
def test_durations_that_do_not_read(text):
    with pytest.raises(UnitError):
        parse_duration_ms(text)


def test_credits():
    assert parse_credits("1.5") == 1_500_000
    assert parse_credits("0.000001") == 1
    for bad in ("-1", "0.0000001", "one", "nan"):
        with pytest.raises(UnitError):
            parse_credits(bad)
