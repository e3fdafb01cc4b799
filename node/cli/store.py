"""``cx store``: the content store as a cache: its usage against its budget, hits, evictions.

Reads the store in the home directly (no node needs to run). ``--evict`` makes it fit its
budget now (a running node does so after each write that overflows it).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from node.cli.common import add_common, print_json, table
from node.storage.home import Home, HomeError
from node.storage.store import BlobStore

__all__ = ["register"]


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    p = commands.add_parser(
        "store",
        help="content store usage, budget, cache hits and evictions",
        description="Show how much the node's content store holds against its budget "
        "([store] budget_bytes in config.toml), how often a job's image or input was "
        "already there (hits), and what was evicted to stay within the budget.",
    )
    p.add_argument("--evict", action="store_true", help="evict down to the budget now")
    add_common(p, json_help="print the figures as JSON")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        budget = Home(args.home).config().store_budget_bytes
    except HomeError:
        budget = None  # a home used only by cx exec and cx image has no config.toml
    store = BlobStore(args.home / "store", budget_bytes=budget)
    evicted = store.evict() if args.evict else []
    stats = store.stats()
    if args.json:
        print_json({**dataclasses.asdict(stats), "evicted_now": len(evicted)})
        return 0
    looked = stats.hits + stats.misses
    rows = [
        ("blobs", f"{stats.blobs} ({stats.images} images)"),
        ("used", _size(stats.bytes)),
        ("budget", "none" if stats.budget_bytes is None else _size(stats.budget_bytes)),
        ("needed", f"{_size(stats.pinned_bytes)} (job outputs, running jobs: never evicted)"),
        ("hits", f"{stats.hits} of {looked}" + (f" ({stats.hits / looked:.0%})" if looked else "")),
        ("evicted", f"{stats.evicted_blobs} blobs, {_size(stats.evicted_bytes)}"),
    ]
    if args.evict:
        rows.append(("evicted now", str(len(evicted))))
    print(table(["", ""], rows).split("\n", 1)[1])
    return 0


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
