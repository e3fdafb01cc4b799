"""``cx status``: this node at a glance (peer id, role, the address others join it by, what
it offers), and a way for scripts to wait until a node just started answers.

Exit status: 0 the node answered, 3 no node answered (within ``--wait``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from node.api.client import ApiClient, NodeNotRunning
from node.cli.common import (
    EXIT_NO_NODE,
    add_common,
    client,
    credits,
    duration_ms,
    print_json,
    talk,
)
from protocol.units import cores, size

__all__ = ["register"]

Json = dict[str, Any]
_RETRY_S = 0.1  # how often --wait looks again for a node that is starting


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    status = commands.add_parser(
        "status",
        help="this node: peer id, role, the address to join it by, its offer",
        description="Show the running node of the home: its peer id, whether it sells "
        "capacity, the addresses other nodes join it by (`cx init --bootstrap ADDR`), "
        "its offer in credits, and a provider's quota groups with what each uses now.",
    )
    add_common(status, json_help="print the node as JSON (prices in micro-credits)")
    status.add_argument(
        "--addr",
        action="store_true",
        help="print only the first address to join this node by, for scripts",
    )
    status.add_argument(
        "--wait",
        type=duration_ms,
        default=0,
        metavar="DURATION",
        help="wait up to DURATION (e.g. 30s) for a node that is starting to answer",
    )
    status.set_defaults(run=talk("cx status", _status))


def _status(args: argparse.Namespace) -> int:
    info = _answer(args)
    if args.json:
        print_json(info)
    elif args.addr:
        addrs = info.get("addrs") or []
        if not addrs:
            return EXIT_NO_NODE
        print(addrs[0])
    else:
        print(render_status(info))
    return 0


def _answer(args: argparse.Namespace) -> Json:
    """The node's info, asked again until ``--wait`` has passed while no node answers.

    Raises:
        ClientError: no node answered in time (NodeNotRunning) or the answer was unusable.
    """
    deadline = time.monotonic() + args.wait / 1000
    while True:
        try:
            api: ApiClient = client(args)
            return api.node_info()
        except NodeNotRunning:
            if time.monotonic() >= deadline:
                raise
        time.sleep(_RETRY_S)


def render_status(info: Json) -> str:
    role = "provider and buyer" if info.get("provider") else "buyer"
    lines = [
        f"node:     {info['peer_id']} ({role}), cx {info.get('version', '?')}",
        *(f"join at:  {a}" for a in info.get("addrs") or []),
    ]
    offer = info.get("offer")
    if offer:
        lines.append(
            f"offers:   {cores(offer['cpu_milli'])} at {credits(offer['cpu_core_hour'])} "
            f"credits/core-hour, {size(offer['memory_bytes'])} memory at "
            f"{credits(offer['memory_gib_hour'])} credits/GiB-hour"
        )
    lines += [render_quota(q) for q in info.get("quotas") or []]
    return "\n".join(lines)


_QUOTA_UNITS = (
    ("cpu_milli", "cores", lambda n: cores(n).split()[0]),
    ("memory_bytes", "memory", lambda n: size(n).replace(" ", "")),
    ("gpus", "gpus", str),
    ("jobs", "jobs", str),
    ("credits_per_day", "credits today", credits),
)


def render_quota(quota: Json) -> str:
    """``quota:    students (2 peers, priority 10): cores 1.5/2, jobs 1/1, ...``: each
    limit as used/limit (``-``: no limit)."""
    peers = len(quota["peers"])
    who = f"{peers} peer{'s' if peers != 1 else ''}" if peers else "everyone else"
    used, limits = quota["used"], quota["limits"]
    parts = [
        f"{name} {say(used[key])}/{'-' if limits[key] is None else say(limits[key])}"
        for key, name, say in _QUOTA_UNITS
    ]
    return f"quota:    {quota['name']} ({who}, priority {quota['priority']}): {', '.join(parts)}"
