"""``cx demo``: the local market demo (node/demo.py) with a live table."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import trio

from node.demo import DemoResult, run_demo


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    parser = commands.add_parser(
        "demo",
        help="run a local market: offers, bids, matching, agreements, containers, receipts",
        description=(
            "Three providers and two buyers trade in this process: signed offers and bids, "
            "local matching, agreements, real OCI containers, usage receipts and ledgers. "
            "Needs root (containers with cgroup limits)."
        ),
    )
    parser.add_argument("--work", type=Path, help="keep stores and job files here")
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON")
    parser.set_defaults(run=_run)


def _credits(micro: int) -> str:
    return f"{micro / 1_000_000:.6f}"


def render(result: DemoResult) -> str:
    head = (
        f"{'job':<11}{'buyer':<7}{'provider':<10}{'state':<12}{'exit':<14}{'wall ms':>8}"
        f"{'cpu ms':>8}{'paid (credits)':>16}"
    )
    rows = [
        f"{j.name:<11}{j.buyer:<7}{j.provider:<10}{j.state:<12}{j.exit_reason:<14}"
        f"{j.wall_ms:>8}{j.cpu_us // 1000:>8}{_credits(j.cost):>16}"
        for j in result.jobs
    ]
    return "\n".join([head, "-" * len(head), *rows])


def _explain(result: DemoResult) -> list[str]:
    lines = []
    for j in result.jobs:
        if j.why is None:
            continue
        out = [f"{name} {n}" for name, n in j.why.ruled_out.items() if n]
        best = "none" if j.why.best_quote is None else _credits(j.why.best_quote)
        lines.append(
            f"  {j.name}: no match among {j.why.offers} offers; ruled out by "
            f"{', '.join(out) or 'nothing'}; best price {best} vs limit "
            f"{_credits(j.why.budget)}"
        )
    return lines


def _run(args: argparse.Namespace) -> int:
    live = sys.stderr.isatty() and not args.json

    def show(result: DemoResult) -> None:
        if live:
            done = sum(j.state in ("settled", "unmatched") for j in result.jobs)
            sys.stderr.write(f"\r{done}/{len(result.jobs)} jobs settled or unmatched")

    try:
        result = trio.run(lambda: run_demo(args.work, on_change=show))
    except PermissionError as exc:
        print(f"cx demo: {exc}; run it as root (containers need cgroups)", file=sys.stderr)
        return 1
    if live:
        sys.stderr.write("\n")
    if args.json:
        print(
            json.dumps(
                {
                    "image": result.image,
                    "jobs": [
                        {
                            k: getattr(j, k)
                            for k in (
                                "name",
                                "buyer",
                                "provider",
                                "state",
                                "exit_reason",
                                "wall_ms",
                                "cpu_us",
                                "cost",
                            )
                        }
                        for j in result.jobs
                    ],
                    "balances": result.balances,
                    "receipts": {node: len(entries) for node, entries in result.ledgers.items()},
                    "ledgers_agree": result.ledgers_agree,
                }
            )
        )
    else:
        print(f"image {result.image} (busybox, built locally)\n")
        print(render(result))
        explained = _explain(result)
        if explained:
            print("\nwhy some bids did not match:")
            print("\n".join(explained))
        print("\nbalances (credits) and receipts held in each node's own ledger:")
        for node, balance in result.balances.items():
            print(f"  {node:<9}{_credits(balance):>12}  {len(result.ledgers[node])} receipts")
        verdict = "yes" if result.ledgers_agree else "NO"
        print(f"\nboth parties hold every receipt, balances sum to zero: {verdict}")
    lost = any(j.state not in ("settled", "unmatched") for j in result.jobs)
    return 1 if lost or not result.ledgers_agree else 0
