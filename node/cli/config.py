"""``cx config check``: is the home's config.toml one the node can use, and if not, which
keys are wrong and why (node/storage/config_check.py).

Exit status: 0 the configuration is usable, 1 it has problems (one line each on stderr).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from node.cli.common import add_common, print_json
from node.storage.config_check import check_config
from node.storage.home import Home

__all__ = ["register"]


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    config = commands.add_parser("config", help="check the node's config.toml")
    actions = config.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check",
        help="say which keys of config.toml are wrong and why",
        description="Read the home's config.toml as the node would, and name every key that "
        "is unknown (with the likely one meant), of the wrong type, out of range or missing.",
    )
    add_common(check, json_help="print the problems as JSON")
    check.set_defaults(run=_check)


def _check(args: argparse.Namespace) -> int:
    home = Home(args.home.expanduser())
    problems = check_config(home)
    if args.json:
        print_json(
            {
                "path": str(home.config_path),
                "problems": [{"where": p.where, "why": p.why} for p in problems],
            }
        )
        return 1 if problems else 0
    if not problems:
        print(f"{home.config_path}: usable")
        return 0
    for problem in problems:
        print(f"cx config check: {problem}", file=sys.stderr)
    print(
        f"{home.config_path}: {len(problems)} problem(s); fix them and run this again",
        file=sys.stderr,
    )
    return 1
