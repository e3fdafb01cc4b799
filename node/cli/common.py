"""What the commands that talk to a running node share: ``--home``/``--json``, the client,
error reporting, unit parsing and formatting, and tables.

Exit status of every such command: 0 done, 1 the node refused (unknown job, bad request;
its message on stderr), 3 no node answered (not running, or unreachable).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Collection, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path

from node.api.client import ApiClient, ClientError
from node.api.common import ApiError
from node.storage.home import default_home
from protocol.units import MICRO, credits

__all__ = [
    "EXIT_NO_NODE",
    "EXIT_REFUSED",
    "add_common",
    "age",
    "client",
    "cpu",
    "credits",
    "default_home",
    "duration_ms",
    "parse_credits",
    "print_json",
    "short_peer",
    "size_bytes",
    "table",
    "talk",
]

EXIT_REFUSED = 1
EXIT_NO_NODE = 3

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_TIME_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def add_common(parser: argparse.ArgumentParser, *, json_help: str | None = None) -> None:
    """``--home`` and, unless ``json_help`` is None, ``--json``."""
    parser.add_argument(
        "--home",
        type=Path,
        default=default_home(),
        help="the node's home directory (default: $CX_HOME, else /var/lib/cx as root, else ~/.cx)",
    )
    if json_help is not None:
        parser.add_argument("--json", action="store_true", help=json_help)


def client(args: argparse.Namespace) -> ApiClient:
    """The client for the node of ``args.home``.

    Raises:
        NodeNotRunning, ClientError: see node/api/client.py.
    """
    return ApiClient.from_home(args.home)


def talk(
    name: str, action: Callable[[argparse.Namespace], int]
) -> Callable[[argparse.Namespace], int]:
    """``action`` with the node's refusals and absence turned into one line on stderr and
    the exit status above. ``name`` is the command as the user typed it (``cx jobs``)."""

    def run(args: argparse.Namespace) -> int:
        try:
            return action(args)
        except ApiError as exc:
            print(f"{name}: {exc.message}", file=sys.stderr)
            return EXIT_REFUSED
        except ClientError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return EXIT_NO_NODE

    return run


def print_json(value: object) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


# -- units ----------------------------------------------------------------------------------


def parse_credits(text: str) -> int:
    """Credits ("1.5") as micro-credits; for argparse ``type=``."""
    try:
        value = Decimal(text.strip()) * MICRO
    except InvalidOperation:
        value = Decimal("NaN")
    if not value.is_finite() or value < 0 or value != value.to_integral_value():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an amount of credits like 1.5 (at most 6 decimals)"
        )
    return int(value)


def size_bytes(text: str) -> int:
    """512M, 2G, 1024 (bytes), 64KiB; for argparse ``type=``."""
    m = re.fullmatch(r"(\d+)\s*([kmgt]?)(i?b)?", text.strip().lower())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 512M or 2G")
    return int(m.group(1)) * _UNITS[m.group(2)]


def duration_ms(text: str) -> int:
    """30s, 10m, 2h, 1d, 500ms; a bare number is seconds; for argparse ``type=``."""
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d)?", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30s, 10m or 2h")
    return int(m.group(1)) * _TIME_MS[m.group(2) or "s"]


def cpu(text: str) -> int:
    """Cores (0.5, 2) or millicores (500m) as millicores; for argparse ``type=``."""
    try:
        milli = int(text[:-1]) if text.endswith("m") else int(Decimal(text) * 1000)
    except (ValueError, InvalidOperation):
        milli = 0
    if milli <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a CPU amount like 0.5, 2 or 500m")
    return milli


def age(at_ms: int | None, now_ms: int | None = None) -> str:
    """How long ago ``at_ms`` was, in one unit: 45s, 12m, 3h, 2d."""
    if at_ms is None:
        return "-"
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    seconds = max(0, now - at_ms) // 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def short_peer(peer_id: str | None) -> str:
    """A peer id shortened for tables (libp2p ids share their first characters)."""
    if not peer_id:
        return "-"
    return peer_id if len(peer_id) <= 12 else f"..{peer_id[-8:]}"


# -- tables -------------------------------------------------------------------------------


def table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], right: Collection[int] = ()
) -> str:
    """Columns aligned to their widest cell, two spaces apart, the columns whose indexes
    are in ``right`` (numbers) right-aligned. An empty table is its header line alone."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if i in right else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in cells)])
