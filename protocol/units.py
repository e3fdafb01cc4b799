"""How the protocol's integer units read to people and are read from them: money in
credits (the protocol counts micro-credits), sizes in bytes, CPU in cores, time in
milliseconds. Pure and exact: no floats.

One grammar for every command and config value (``cx run``, ``cx exec``, ``cx init``):
- sizes: a number and an optional suffix, SI (``k``/``K``, ``M``, ``G``, ``T``, ``P``,
  with or without ``B``: powers of 1000) or binary (``Ki``, ``Mi``, ``Gi``, ``Ti``, ``Pi``,
  with or without ``B``: powers of 1024), as Kubernetes writes them; ``0.5G`` is fine when
  it comes to whole bytes. A lone lowercase ``m`` is refused: Kubernetes reads it as
  thousandths and docker as MiB, so either reading would surprise someone;
- CPU: cores (``0.5``, ``2``) or millicores (``500m``);
- durations: ``500ms``, ``30s``, ``10m``, ``2h``, ``1d``, ``1.5h``, or ``1h30m``; a bare
  number is seconds;
- credits: a decimal with at most 6 places.
Parsers raise :class:`UnitError` (a ``ValueError``) whose message says what was expected.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = [
    "MICRO",
    "UnitError",
    "cores",
    "credits",
    "parse_cpu_milli",
    "parse_credits",
    "parse_duration_ms",
    "parse_size",
    "size",
]

MICRO = 1_000_000  # micro-credits per credit
_BINARY = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def credits(micro: int | None) -> str:
    """Micro-credits as credits, exact: 1500000 -> "1.50", 1 -> "0.000001", None -> "-"."""
    if micro is None:
        return "-"
    whole, frac = divmod(abs(micro), MICRO)
    digits = f"{frac:06d}".rstrip("0").ljust(2, "0")
    return f"{'-' if micro < 0 else ''}{whole}.{digits}"


def size(n: int) -> str:
    """Bytes in the largest binary unit that keeps one decimal honest: 1.5 GiB, 512 MiB."""
    for unit, scale in _BINARY:
        if n >= scale:
            tenths = n * 10 // scale
            return f"{tenths // 10}{'' if tenths % 10 == 0 else f'.{tenths % 10}'} {unit}"
    return f"{n} B"


def cores(milli: int) -> str:
    """Millicores as cores: 4000 -> "4 cores", 500 -> "0.5 core"."""
    whole, frac = divmod(milli, 1000)
    text = str(whole) if frac == 0 else f"{whole}.{f'{frac:03d}'.rstrip('0')}"
    return f"{text} {'core' if milli <= 1000 else 'cores'}"


# -- parsing --------------------------------------------------------------------------------


class UnitError(ValueError):
    """A quantity that does not read as its unit; the message says what would."""


_SI = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15}
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_SIZE = re.compile(_NUMBER + r"\s*([a-zA-Z]*)")
_DURATION_PART = re.compile(_NUMBER + r"(ms|s|min|m|h|d)")
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _scale(suffix: str) -> int | None:
    """Bytes per unit of a size suffix, None when it is not one."""
    if suffix in ("", "b", "B"):
        return 1
    if suffix == "m":
        return None  # ambiguous: see the module docstring
    stem = suffix.lower().removesuffix("b")
    if stem in _SI:
        return _SI[stem]
    if len(stem) == 2 and stem[1] == "i" and stem[0] in _SI:
        return 1 << (10 * ("kmgtp".index(stem[0]) + 1))
    return None


def parse_size(text: str) -> int:
    """``128Mi``, ``1Gi``, ``0.5G``, ``512MB``, ``4096`` as bytes.

    Raises:
        UnitError: not a size, an ambiguous ``m``, or not a whole number of bytes.
    """
    m = _SIZE.fullmatch(text.strip())
    scale = None if m is None else _scale(m.group(2))
    if m is not None and m.group(2) == "m":
        raise UnitError(
            f"{text!r} is ambiguous: write {m.group(1)}M (megabytes, 10^6) or "
            f"{m.group(1)}Mi (mebibytes, 2^20)"
        )
    if m is None or scale is None:
        raise UnitError(f"{text!r} is not a size like 512Mi, 2Gi, 500M or 1G")
    value = Decimal(m.group(1)) * scale
    if value != value.to_integral_value():
        raise UnitError(f"{text!r} is not a whole number of bytes")
    return int(value)


def parse_cpu_milli(text: str) -> int:
    """Cores (``0.5``, ``2``) or millicores (``500m``) as millicores, more than 0.

    Raises:
        UnitError: not a CPU amount, zero, or finer than a millicore.
    """
    raw = text.strip()
    milli: Decimal | None
    try:
        milli = Decimal(raw[:-1]) if raw.endswith("m") else Decimal(raw) * 1000
    except InvalidOperation:
        milli = None
    if milli is None or not milli.is_finite() or milli <= 0:
        raise UnitError(f"{text!r} is not a CPU amount like 0.5, 2 or 500m")
    if milli != milli.to_integral_value():
        raise UnitError(f"{text!r} is finer than a thousandth of a core (1m)")
    return int(milli)


def parse_duration_ms(text: str) -> int:
    """``500ms``, ``30s``, ``10m``, ``1.5h``, ``1h30m``, ``1d``; a bare number is seconds.

    Raises:
        UnitError: not a duration, or finer than a millisecond.
    """
    raw = text.strip()
    if re.fullmatch(_NUMBER, raw):
        raw += "s"
    parts = _DURATION_PART.findall(raw)
    if not parts or "".join(n + u for n, u in parts) != raw:
        raise UnitError(f"{text!r} is not a duration like 30s, 10m, 1.5h or 500ms")
    total = sum((Decimal(n) * _DURATION_MS[u] for n, u in parts), Decimal(0))
    if total != total.to_integral_value():
        raise UnitError(f"{text!r} is finer than a millisecond")
    return int(total)


def parse_credits(text: str) -> int:
    """Credits (``1.5``) as micro-credits, not negative.

    Raises:
        UnitError: not an amount, negative, or more than 6 decimals.
    """
    try:
        value = Decimal(text.strip()) * MICRO
    except InvalidOperation:
        value = Decimal("NaN")
    if not value.is_finite() or value < 0 or value != value.to_integral_value():
        raise UnitError(f"{text!r} is not an amount of credits like 1.5 (at most 6 decimals)")
    return int(value)
