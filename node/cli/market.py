"""``cx market``, ``cx ledger``, ``cx peers``: what the running node sees of the market,
its own money, and its peers, through its control API. Prices and amounts are credits.

Exit status: 0 done, 1 the node refused, 3 no node answered.
"""

from __future__ import annotations

import argparse
from typing import Any

from node.cli.common import (
    add_common,
    age,
    client,
    credits,
    print_json,
    short_peer,
    table,
    talk,
)

__all__ = ["register"]

Json = dict[str, Any]
_LAST = 5  # trade prices shown per class


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    market = commands.add_parser(
        "market",
        help="order book depth and recent trade prices per resource class",
        description="The offers and bids in this node's order book per resource class, "
        "the best CPU price on offer, and the prices of recent trades (credits).",
    )
    add_common(market, json_help="print the book summary as JSON (micro-credits)")
    market.set_defaults(run=talk("cx market", _market))

    ledger = commands.add_parser(
        "ledger",
        help="this node's balance and settled receipts",
        description="This node's balance and the receipts it settled, as payer or payee.",
    )
    add_common(ledger, json_help="print the balance and entries as JSON (micro-credits)")
    ledger.set_defaults(run=talk("cx ledger", _ledger))

    peers = commands.add_parser(
        "peers",
        help="the peers this node is connected to, with their scores",
        description="The peers this node is connected to and the score it keeps for each.",
    )
    add_common(peers, json_help="print the peers as JSON")
    peers.set_defaults(run=talk("cx peers", _peers))


def _market(args: argparse.Namespace) -> int:
    market = client(args).market()
    if args.json:
        print_json(market)
    else:
        print(render_market(market))
    return 0


def render_market(market: Json, now_ms: int | None = None) -> str:
    classes = [
        (
            c["class"],
            c.get("offers", 0),
            c.get("bids", 0),
            credits(c.get("best_cpu_core_hour")),
            " ".join(credits(p) for p in (c.get("last_prices") or [])[-_LAST:]) or "-",
        )
        for c in market.get("classes") or []
    ]
    out = [
        f"book: {market.get('offers', 0)} offer(s), {market.get('bids', 0)} bid(s)",
        "",
        table(
            ("CLASS", "OFFERS", "BIDS", "BEST CPU/CORE-H", "LAST CPU/CORE-H"),
            classes,
            right=(1, 2, 3),
        ),
    ]
    trades = [
        (
            age(t.get("at_ms"), now_ms),
            t["class"],
            credits(t.get("cpu_core_hour")),
            credits(t.get("memory_gib_hour")),
        )
        for t in market.get("recent_trades") or []
    ]
    out += ["", "recent trades:"]
    out.append(table(("AGE", "CLASS", "CPU/CORE-H", "MEM/GIB-H"), trades, right=(0, 2, 3)))
    return "\n".join(out)


def _ledger(args: argparse.Namespace) -> int:
    ledger = client(args).ledger()
    if args.json:
        print_json(ledger)
    else:
        print(render_ledger(ledger))
    return 0


def render_ledger(ledger: Json, now_ms: int | None = None) -> str:
    rows = [
        (
            age(e.get("at_ms"), now_ms),
            str(e["agreement_id"])[:16],
            e.get("role", "-"),
            short_peer(e.get("payer")),
            short_peer(e.get("payee")),
            credits(e.get("amount")),
        )
        for e in ledger.get("entries") or []
    ]
    headers = ("AGE", "AGREEMENT", "ROLE", "PAYER", "PAYEE", "AMOUNT")
    return "\n".join(
        [
            f"balance: {credits(ledger.get('balance', 0))} credits",
            "",
            table(headers, rows, right=(0, 5)),
        ]
    )


def _peers(args: argparse.Namespace) -> int:
    peers = client(args).peers()
    if args.json:
        print_json(peers)
        return 0
    rows = [
        (
            p["peer_id"],
            f"{p['score']:g}" if isinstance(p.get("score"), int | float) else "-",
            _addrs(p.get("addrs") or []),
        )
        for p in peers
    ]
    print(table(("PEER", "SCORE", "ADDRESS"), rows, right=(1,)))
    return 0


def _addrs(addrs: list[str]) -> str:
    if not addrs:
        return "-"
    return addrs[0] if len(addrs) == 1 else f"{addrs[0]} (+{len(addrs) - 1})"
