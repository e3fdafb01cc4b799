"""``cx dashboard``: a one-time link that logs a browser in to the node's dashboard.

The node serves the dashboard on its control address (node/api/dashboard.py); the link's
code is good once, for two minutes, so it can be printed without giving the token away.

Exit status: 0 done, 1 the node refused, 3 no node answered.
"""

from __future__ import annotations

import argparse
import webbrowser
from typing import Any

from node.cli.common import add_common, client, print_json, talk

__all__ = ["register"]


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    dashboard = commands.add_parser(
        "dashboard",
        help="a one-time link to the node's web dashboard",
        description="Print a link that logs a browser on this machine in to the running "
        "node's dashboard: jobs with their timelines and logs, the market, the ledger, "
        "peers and, on a provider, the machine. The link works once, within two minutes.",
    )
    add_common(dashboard, json_help="print the link as JSON")
    dashboard.add_argument("--open", action="store_true", help="also open it in a browser")
    dashboard.set_defaults(run=talk("cx dashboard", _dashboard))


def _dashboard(args: argparse.Namespace) -> int:
    link = client(args).dashboard_link()
    if args.json:
        print_json(link)
    else:
        print(f"open this link within {int(link['expires_s'])} s (it works once):")
        print(link["url"])
    if args.open:
        webbrowser.open(link["url"])
    return 0
