"""``cx top``: a provider's machine, live: capacity, what the agreed jobs hold of it, and
each job with its buyer, state and resources (from the node's live stream).

Exit status: 0 stopped with Ctrl-C, 1 this node sells no capacity, 3 no node answered.
"""

from __future__ import annotations

import argparse
from typing import Any

from node.cli.common import add_common, age, short_peer, table, talk
from node.cli.live import follow
from protocol.units import cores, size

__all__ = ["register", "render_top"]

Json = dict[str, Any]
_BAR = 30  # characters of a capacity bar


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    top = commands.add_parser(
        "top",
        help="a provider's running jobs and its capacity, live",
        description="Show this provider's capacity, how much of it agreed jobs hold, and "
        "each such job (buyer, state, CPU, memory, GPUs, the CPU time and peak memory it "
        "used so far, age), redrawn whenever it changes.",
    )
    add_common(top)
    top.set_defaults(run=talk("cx top", _top))


def _top(args: argparse.Namespace) -> int:
    return follow(args, "cx top", render_top)


def render_top(snapshot: Json) -> str:
    provider = snapshot.get("provider")
    if provider is None:
        raise ValueError("this node sells no capacity (it is a buyer); see `cx init --provider`")
    running = provider["running"]
    lines = [f"offering {provider['class'] or '-'}"]
    for name, key, show in (
        ("cpu", "cpu_milli", cores),
        ("memory", "memory_bytes", size),
        ("gpus", "gpus", str),
    ):
        if key == "gpus" and not provider[key]:
            continue
        used, total = sum(r[key] for r in running), provider[key]
        filled = round(_BAR * used / total) if total else 0
        bar = "#" * filled + "." * (_BAR - filled)
        lines.append(f"{name:<7}[{bar}] {show(used)} of {show(total)}")
    rows = [
        (
            r["agreement_id"][:16],
            short_peer(r["buyer"]),
            r["state"],
            cores(r["cpu_milli"]),
            size(r["memory_bytes"]),
            r["gpus"],
            "-" if r.get("cpu_us") is None else f"{r['cpu_us'] / 1e6:.1f}s",
            "-" if r.get("memory_peak_bytes") is None else size(r["memory_peak_bytes"]),
            age(r.get("started_ms"), snapshot["at_ms"]),
        )
        for r in running
    ]
    headers = (
        "AGREEMENT",
        "BUYER",
        "STATE",
        "CPU",
        "MEMORY",
        "GPUS",
        "CPU TIME",
        "PEAK",
        "RUNNING",
    )
    lines += ["", table(headers, rows, right=(3, 4, 5, 6, 7, 8))]
    if not running:
        lines.append("no jobs here now")
    return "\n".join(lines)
