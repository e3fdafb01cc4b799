"""What the commands that talk to a running node share: ``--home``/``--json``, the client,
error reporting, unit parsing and formatting, and tables.

Exit status of every such command: 0 done, 1 the node refused (unknown job, bad request;
its message on stderr), 3 no node answered (not running, or unreachable).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from node.api.client import ApiClient, ClientError
from node.api.common import ApiError
from node.storage.home import default_home
from protocol import units
from protocol.units import UnitError, credits

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
# One status for "no node running" in every command: docker run's 125 (cx could not do
# its part), since cx run and cx wait pass a job's own small exit codes through.
EXIT_NO_NODE = 125


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
    name: str,
    action: Callable[[argparse.Namespace], int],
    *,
    refused: int = EXIT_REFUSED,
    no_node: int = EXIT_NO_NODE,
) -> Callable[[argparse.Namespace], int]:
    """``action`` with the node's refusals and absence turned into one line on stderr and
    the exit status above (or ``refused``, ``no_node``: cx wait's are cx run's). ``name``
    is the command as the user typed it (``cx jobs``)."""

    def run(args: argparse.Namespace) -> int:
        typed = getattr(args, "subcommand", None)  # an alias (cx stop) as the user typed it
        said = f"cx {typed}" if isinstance(typed, str) else name
        try:
            return action(args)
        except ApiError as exc:
            print(f"{said}: {exc.message}", file=sys.stderr)
            return refused
        except ClientError as exc:
            print(f"{said}: {exc}", file=sys.stderr)
            return no_node

    return run


def print_json(value: object) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


# -- units ----------------------------------------------------------------------------------


def _argument(parse: Callable[[str], int]) -> Callable[[str], int]:
    """``parse`` for argparse ``type=``: its UnitError becomes argparse's one-line error."""

    def parse_argument(text: str) -> int:
        try:
            return parse(text)
        except UnitError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse_argument.__name__ = parse.__name__
    return parse_argument


# One grammar for every command (protocol/units.py): SI and binary sizes, cores or
# millicores, durations with units, credits.
parse_credits = _argument(units.parse_credits)
size_bytes = _argument(units.parse_size)
duration_ms = _argument(units.parse_duration_ms)
cpu = _argument(units.parse_cpu_milli)


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
