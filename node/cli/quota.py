"""``cx quota``: a provider's quota groups (config.toml ``[[provider.quota]]``) with what
each uses now; ``cx quota --reload`` applies the config's quotas to the running node.

Exit status: 0 done, 1 the node refused (not a provider, config.toml has problems), 3 no
node answered.
"""

from __future__ import annotations

import argparse
from typing import Any

from node.cli.common import add_common, client, print_json, talk
from node.cli.status import render_quota

__all__ = ["register"]

Json = dict[str, Any]


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    quota = commands.add_parser(
        "quota",
        help="a provider's quotas per group of buyers and what each uses now",
        description="Show the provider's quota groups ([[provider.quota]] in config.toml): "
        "each limit as used/limit. With --reload, first apply config.toml's quotas to the "
        "running node without a restart (jobs under way keep running).",
    )
    quota.add_argument(
        "--reload",
        action="store_true",
        help="read config.toml again and apply its quotas now; with a problem in it, "
        "nothing changes and the problem is named",
    )
    add_common(quota, json_help="print the groups as JSON (credits in micro-credits)")
    quota.set_defaults(run=talk("cx quota", _quota))


def _quota(args: argparse.Namespace) -> int:
    api = client(args)
    if args.reload:
        return _print(args, api.reload_quotas(), provider=True)
    info = api.node_info()
    return _print(args, info.get("quotas") or [], provider=bool(info.get("provider")))


def _print(args: argparse.Namespace, groups: list[Json], *, provider: bool) -> int:
    if args.json:
        print_json(groups)
    elif not provider:
        print("this node sells nothing: it has no quotas")
    elif not groups:
        print("no quotas: every buyer may use the whole offer ([[provider.quota]] sets some)")
    else:
        print("\n".join(render_quota(q) for q in groups))
    return 0
