"""The ``cx`` command line.

Each sub-command group lives in its own module with a ``register(subparsers)`` function;
this module only assembles them, so a new group is one import and one list entry.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from node.cli import (
    attest,
    completion,
    config,
    dashboard,
    demo,
    estimate,
    exec,
    flow,
    image,
    jobs,
    market,
    node,
    quota,
    run,
    sim,
    status,
    store,
    testnet,
    top,
)
from node.cli.parser import CxParser, parse

__all__ = ["main"]

_GROUPS: tuple[Any, ...] = (
    testnet,
    node,
    status,
    demo,
    sim,
    attest,
    image,
    store,
    exec,
    estimate,
    run,
    flow,
    jobs,
    market,
    dashboard,
    config,
    quota,
    top,
    completion,
)


_EXIT_STATUS = """\
exit status (a command's own --help says more):
  0    done
  1    the node refused the request; it says why on stderr
  2    a malformed command line, or input cx cannot use
  125  no node running for the home (cx run and cx wait: also anything else that kept
       cx from submitting or following the job, as docker run; their other statuses are
       the job's, see `cx run --help`)
  141  the reader of the output went away (`cx jobs | head -2`)
"""

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a reader that went away


def build_parser() -> CxParser:
    parser = CxParser(
        prog="cx",
        description="Compute Exchange: a peer-to-peer market for compute.",
        epilog=_EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    parser.add_argument("--version", action="version", version=f"cx {version()}")
    commands = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    for group in _GROUPS:
        group.register(commands)
    return parser


def version() -> str:
    try:
        return importlib.metadata.version("compute-exchange")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status (argparse's 2 for a malformed command line)."""
    try:
        code = _command(argv)
        sys.stdout.flush()
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `cx jobs | head -2`: the reader has gone; stop quietly, as cat does. Point stdout
        # at /dev/null so the interpreter's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


def _command(argv: Sequence[str] | None) -> int:
    try:
        args = parse(build_parser(), argv)
    except SystemExit as exc:  # argparse's --help, --version and its errors
        return exc.code if isinstance(exc.code, int) else 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
