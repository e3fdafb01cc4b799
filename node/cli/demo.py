"""``cx demo``: the testnet's scenario as whole nodes in this one process (node/demo.py)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import trio

from node.cli.testnet import EXIT_LOST, add_market_arguments, progress_printer, report
from node.demo import run_demo


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    parser = commands.add_parser(
        "demo",
        help="run the testnet's market in one process: whole nodes, real containers",
        description=(
            "Three providers and two buyers, each a whole node with its own home, trade in "
            "this process over an in-memory network: signed offers and bids, local "
            "matching, agreements, real OCI containers, usage receipts and ledgers. Exits 1 "
            "if anything was lost. `cx testnet` runs the same market as node processes over "
            "libp2p. Needs root (containers with cgroup limits)."
        ),
    )
    add_market_arguments(parser)
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    if args.providers < 1 or args.buyers < 1:
        print("cx demo: needs at least one provider and one buyer", file=sys.stderr)
        return 2
    started = time.monotonic()
    progress = progress_printer(started, quiet=args.json)
    try:
        verdict = trio.run(
            lambda: run_demo(
                args.work, providers=args.providers, buyers=args.buyers, progress=progress
            )
        )
    except (PermissionError, trio.TooSlowError) as exc:
        why = exc or "the nodes did not see each other's offers in time"
        print(f"cx demo: {why}; run it as root", file=sys.stderr)
        return EXIT_LOST
    return report(verdict, as_json=args.json, started=started)
