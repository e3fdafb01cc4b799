"""``cx market``, ``cx ledger``, ``cx peers``: what the running node sees of the market,
its own money, and its peers, through its control API. Prices and amounts are credits.

Exit status: 0 done, 1 the node refused, 3 no node answered.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from node.cli.common import (
    add_common,
    age,
    client,
    cpu,
    credits,
    duration_ms,
    parse_credits,
    print_json,
    short_peer,
    table,
    talk,
)
from protocol.messages import check_digest
from protocol.transfer import held_in
from protocol.units import size

__all__ = ["register", "render_market", "sparkline"]

Json = dict[str, Any]
_BARS = "▁▂▃▄▅▆▇█"
PRICE_FIELDS = ("cpu_core_hour", "memory_gib_hour", "disk_gib_hour", "gpu_hour")
_MARKET_HEADERS = (
    "CLASS", "OFFERS", "BIDS", "BEST BID", "BEST OFFER", "LAST", "MEM OFFER", "TRADES",
    "PER WORK", "WORK/KWH", "CPU PRICE CHART",
)  # fmt: skip


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    market = commands.add_parser(
        "market",
        help="best bid and offer, last price, volume and a price chart per resource class",
        description="Per resource class: the offers and bids in this node's order book, the "
        "best offer and the highest bid limit, and from the tape (the trade prints every "
        "node keeps) the last price, the volume and a chart of recent prices. Credits; "
        "CPU per core-hour, memory per GiB-hour.",
    )
    add_common(market, json_help="print the market as JSON (micro-credits)")
    market.set_defaults(run=talk("cx market", _market))
    views = market.add_subparsers(title="views", metavar="VIEW")
    history = views.add_parser(
        "history",
        help="OHLC candles of the tape's prices per class",
        description="Open, high, low and close of the trade prints per resource class and "
        "interval, with the number of trades and the CPU they reserved.",
    )
    # ``cx market --home H history``: the parser above has --home already; one given
    # here too wins (argparse lets a subparser's default override the parent's value)
    history.add_argument("--home", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    history.add_argument(
        "--json", action="store_true", help="print the candles as JSON (micro-credits)"
    )
    history.add_argument(
        "--interval",
        type=duration_ms,
        default=60_000,
        help="the candles' length, like 30s, 5m or 1h (default 1m)",
    )
    history.add_argument(
        "--since",
        type=duration_ms,
        default=None,
        help="only prints younger than this, like 10m (default: all the tape keeps)",
    )
    history.add_argument(
        "--field",
        choices=PRICE_FIELDS,
        default="cpu_core_hour",
        help="which unit price (default cpu_core_hour)",
    )
    history.set_defaults(run=talk("cx market history", _history))

    ledger = commands.add_parser(
        "ledger",
        help="this node's balance and settled receipts",
        description="This node's balance and the receipts it settled, as payer or payee.",
    )
    add_common(ledger, json_help="print the balance and entries as JSON (micro-credits)")
    ledger.set_defaults(run=talk("cx ledger", _ledger))

    peers = commands.add_parser(
        "peers",
        help="the peers this node is connected to, with their scores and reputations",
        description="The peers this node is connected to, the gossip score it keeps for each,"
        " and its reputation of each from receipts (parts per million of this node's trust,"
        " spec/reputation.md).",
    )
    add_common(peers, json_help="print the peers as JSON")
    peers.set_defaults(run=talk("cx peers", _peers))

    offers = commands.add_parser(
        "offers",
        help="every offer in this node's book: provider, hardware, prices, free capacity",
        description="Every live offer this node knows, cheapest CPU first: the provider, "
        "region, architecture, GPUs, prices per resource (credits: CPU per core-hour, "
        "memory and disk per GiB-hour, GPU per GPU-hour), free capacity, work score and "
        "this node's reputation of the provider. Filters narrow the list.",
    )
    offers.add_argument("--region", help="only this region")
    offers.add_argument("--arch", help="only this CPU architecture (amd64, arm64)")
    offers.add_argument("--gpu-model", help="only offers with a GPU of this model")
    offers.add_argument(
        "--max-price", type=parse_credits, metavar="CREDITS", help="CPU price at most this"
    )
    offers.add_argument(
        "--cpu", type=cpu, metavar="CORES", help="at least this much free CPU (0.5, 2, 500m)"
    )
    offers.add_argument(
        "--holding",
        action="append",
        default=[],
        type=_digest,
        metavar="DIGEST",
        help="show how many of these blobs (an image, an input) each provider says it "
        "holds (repeatable)",
    )
    add_common(offers, json_help="print the offers as JSON (micro-credits)")
    offers.set_defaults(run=talk("cx offers", _offers))

    check = commands.add_parser(
        "check-score",
        help="run the benchmark on a provider and judge the work score it states",
        description="Run the standard benchmark kernel as a job on PEER (at its offer's "
        "prices, paid like any job) and compare the score its CPU time gives with the one "
        "the offer states. A provider that overstates it by more than 50 %%, or whose job "
        "did not do the work, is no longer traded with by this node. Exit status 1 then.",
    )
    check.add_argument(
        "peer", metavar="PEER", help="the provider's peer id (see `cx market --json`)"
    )
    add_common(check, json_help="print the check as JSON")
    check.set_defaults(run=talk("cx check-score", _check_score))


def _market(args: argparse.Namespace) -> int:
    market = client(args).market()
    if args.json:
        print_json(market)
    else:
        print(render_market(market))
    return 0


def sparkline(values: list[int]) -> str:
    """One block character per value, its height the value's place between the least and
    the greatest (a flat line when they are equal)."""
    if not values:
        return "-"
    low, high = min(values), max(values)
    top = len(_BARS) - 1
    return "".join(_BARS[(v - low) * top // (high - low) if high > low else 0] for v in values)


def render_market(market: Json, now_ms: int | None = None) -> str:
    classes = [
        (
            c["class"],
            c.get("offers", 0),
            c.get("bids", 0),
            credits(c.get("best_bid_cpu_core_hour")),
            credits(c.get("best_cpu_core_hour")),
            credits(c.get("last_cpu_core_hour")),
            credits(c.get("best_memory_gib_hour")),
            c.get("volume", 0),
            credits(c.get("best_work_price")),
            c.get("best_work_per_kwh") or "-",
            sparkline(c.get("last_prices") or []),
        )
        for c in market.get("classes") or []
    ]
    out = [
        f"book: {market.get('offers', 0)} offer(s), {market.get('bids', 0)} bid(s); "
        "CPU prices per core-hour, memory per GiB-hour, work per unit (a GiB hashed on one "
        "core), in credits",
        "",
        table(_MARKET_HEADERS, classes, right=(1, 2, 3, 4, 5, 6, 7, 8, 9)),
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
    if trades:
        out += ["", "recent trades (the tape):"]
        out.append(table(("AGE", "CLASS", "CPU/CORE-H", "MEM/GIB-H"), trades, right=(0, 2, 3)))
    else:
        out += ["", "no trades on the tape yet"]
    return "\n".join(out)


def _history(args: argparse.Namespace) -> int:
    since = 0 if args.since is None else max(0, int(time.time() * 1000) - args.since)
    history = client(args).history(interval_ms=args.interval, since_ms=since, field=args.field)
    if args.json:
        print_json(history)
    else:
        print(render_history(history))
    return 0


def render_history(history: Json) -> str:
    rows = [
        (
            c["class"],
            age(k["start_ms"], None),
            credits(k["open"]),
            credits(k["high"]),
            credits(k["low"]),
            credits(k["close"]),
            k["trades"],
        )
        for c in history.get("classes") or []
        for k in c["candles"]
    ]
    headers = ("CLASS", "START", "OPEN", "HIGH", "LOW", "CLOSE", "TRADES")
    return table(headers, rows, right=(1, 2, 3, 4, 5, 6)) if rows else "no trades on the tape"


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
        for e in reversed(ledger.get("entries") or [])  # newest first, as cx jobs
    ]
    headers = ("AGE", "AGREEMENT", "ROLE", "PAYER", "PAYEE", "AMOUNT")
    return "\n".join(
        [
            f"balance: {credits(ledger.get('balance', 0))} credits",
            "",
            table(headers, rows, right=(0, 5)),
        ]
    )


def _offers(args: argparse.Namespace) -> int:
    offers = [o for o in client(args).offers() if _wanted(o, args)]
    if args.json:
        print_json(offers)
        return 0
    rows = [
        (
            short_peer(o["provider"]) + (" (me)" if o["mine"] else ""),
            o["region"] or "-",
            o["arch"],
            ",".join(o["gpus"]) or "-",
            credits(o["cpu_core_hour"]),
            credits(o["memory_gib_hour"]),
            credits(o["disk_gib_hour"]),
            credits(o["gpu_hour"]) if o["gpus"] else "-",
            credits(o.get("ingress_gib")),
            credits(o.get("egress_gib")),
            f"{o['free_cpu_milli'] / 1000:g}",
            size(o["free_memory_bytes"]),
            o["work_score"] or "-",
            o["reputation"],
            *_held(o, args.holding),
        )
        for o in offers
    ]
    headers = ("PROVIDER", "REGION", "ARCH", "GPUS", "CPU/CORE-H", "MEM/GIB-H", "DISK/GIB-H",
               "GPU/H", "IN/GIB", "OUT/GIB", "FREE CPU", "FREE MEM", "WORK", "REPUTATION",
               *(["HOLDS"] if args.holding else []))  # fmt: skip
    right = tuple(range(4, len(headers)))
    print(table(headers, rows, right=right) if rows else "no offers")
    return 0


def _digest(text: str) -> str:
    try:
        check_digest(text, "blob")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _held(offer: Json, digests: list[str]) -> list[str]:
    """``k/n``: of the ``n`` digests asked about, the ``k`` the offer says it holds."""
    if not digests:
        return []
    table = bytes.fromhex(offer["holds"]) if offer.get("holds") else None
    return [f"{sum(held_in(table, d) for d in digests)}/{len(digests)}"]


def _wanted(offer: Json, args: argparse.Namespace) -> bool:
    return (
        (args.region is None or offer["region"] == args.region)
        and (args.arch is None or offer["arch"] == args.arch)
        and (args.gpu_model is None or args.gpu_model in offer["gpus"])
        and (args.max_price is None or offer["cpu_core_hour"] <= args.max_price)
        and (args.cpu is None or offer["free_cpu_milli"] >= args.cpu)
    )


def _check_score(args: argparse.Namespace) -> int:
    check = client(args).check_score(args.peer)
    if args.json:
        print_json(check)
    else:
        verdict = "believed" if check["honest"] else "NOT believed: no longer traded with"
        print(f"{check['provider']}: {verdict}")
        print(f"  {check['detail']} (job {check['job_id']})")
    return 0 if check["honest"] else 1


def _peers(args: argparse.Namespace) -> int:
    peers = client(args).peers()
    if args.json:
        print_json(peers)
        return 0
    rows = [
        (
            short_peer(p["peer_id"]),  # as in every table; --json has them whole
            f"{p['score']:g}" if isinstance(p.get("score"), int | float) else "-",
            str(p.get("reputation", 0)),
            _addrs(p.get("addrs") or []),
        )
        for p in peers
    ]
    print(table(("PEER", "SCORE", "REPUTATION", "ADDRESS"), rows, right=(1, 2)))
    return 0


def _addrs(addrs: list[str]) -> str:
    if not addrs:
        return "-"
    return addrs[0] if len(addrs) == 1 else f"{addrs[0]} (+{len(addrs) - 1})"
