"""The ``cx`` command line.

Each sub-command group lives in its own module with a ``register(subparsers)`` function;
this module only assembles them, so a new group is one import and one list entry.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from node.cli import attest, demo, exec, image, jobs, market, node, run, sim, store, testnet

__all__ = ["main"]

_GROUPS: tuple[Any, ...] = (testnet, node, demo, sim, attest, image, store, exec, run, jobs, market)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cx",
        description="Compute Exchange: a peer-to-peer market for compute.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in _GROUPS:
        group.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        code: int = args.run(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
