"""How the protocol's integer units read to people: money in credits (the protocol counts
micro-credits), memory in binary units, CPU in cores. Pure formatting, exact: no floats."""

from __future__ import annotations

__all__ = ["MICRO", "cores", "credits", "size"]

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
