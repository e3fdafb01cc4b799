"""The JSON shapes of the control API: one function per kind of object a node shows.

Pure conversions of the node's typed objects (node/api/server.py's docstring is the
schema); nothing here reads state or has effects.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from node.peer import Sold, Why
from node.storage.db import JobRow
from protocol.book import OrderBook
from protocol.envelope import Signed
from protocol.identity import PublicKey
from protocol.messages import Bid, Offer
from protocol.quotas import GroupUse, Quota
from protocol.settlement import LedgerEntry
from protocol.tape import TradePrint, candles, resource_class
from protocol.transfer import TransferCost
from protocol.work import work_per_kwh, work_price

__all__ = ["history", "job", "ledger", "market", "offer", "offers", "quotas", "why"]

CHART_PRINTS = 40  # the recent prices a class's chart shows

Json = dict[str, Any]


def job(row: JobRow) -> Json:
    asked = json.loads(row.request)  # what the user asked for, as node/market/request.py wrote it
    return {
        "id": row.id,
        "name": row.name,
        "image": asked.get("image", ""),
        "command": list(asked.get("command", ())),
        "cpu_milli": asked.get("cpu_milli", 0),
        "memory_bytes": asked.get("memory_bytes", 0),
        "state": row.state,
        "detail": row.detail,
        "created_ms": row.created_ms,
        "updated_ms": row.updated_ms,
        "provider": row.provider,
        "attempts": row.attempts,
        "price": row.prices,
        "max_cost": row.max_cost,
        "cost": row.cost,
        "exit_reason": row.exit_reason,
        "exit_code": row.exit_code,
        "outputs": row.outputs or [],
        "logs": row.logs or [],
    }


def offer(order: Signed[Offer]) -> Json:
    o = order.payload
    return {
        "id": order.id.hex(),
        "class": resource_class(o),
        "cpu_milli": o.capacity.cpu_milli,
        "memory_bytes": o.capacity.memory_bytes,
        "cpu_core_hour": o.prices.cpu_core_hour,
        "memory_gib_hour": o.prices.memory_gib_hour,
        "trust": [t.value for t in o.trust],
        "work_score": o.work_score,
        "work_price": work_price(o),
    }


def offers(book: OrderBook, reputation: Mapping[bytes, int], me: bytes, now_ms: int) -> list[Json]:
    """Every live offer in the book with its provider, hardware, prices, free capacity and
    this node's reputation of the provider; by class, then CPU price."""
    out = []
    for resting in book.live_offers(now_ms):
        o, signer = resting.offer, resting.order.signer
        out.append(
            {
                **offer(resting.order),
                "provider": signer.peer_id,
                "region": o.region,
                "arch": o.arch.value,
                "gpus": [g.model for g in o.gpus],
                "disk_gib_hour": o.prices.disk_gib_hour,
                "gpu_hour": o.prices.gpu_hour,
                "ingress_gib": o.ingress_gib,
                "egress_gib": o.egress_gib,
                "holds": o.holds.hex() if o.holds else None,
                "free_cpu_milli": resting.remaining.cpu_milli,
                "free_memory_bytes": resting.remaining.memory_bytes,
                "free_gpus": resting.remaining.gpus,
                "reputation": reputation.get(signer.raw, 0),
                "mine": signer.raw == me,
                "expires_ms": resting.order.expires_ms,
            }
        )
    return sorted(out, key=lambda o: (o["class"], o["cpu_core_hour"]))


def quotas(groups: Iterable[tuple[Quota, GroupUse]]) -> list[Json]:
    """A provider's quota groups, each with its limits and what it uses now."""
    return [
        {
            "name": q.name,
            "peers": sorted(PublicKey(raw).peer_id for raw in q.members),
            "priority": q.priority,
            "limits": {
                "cpu_milli": q.cpu_milli,
                "memory_bytes": q.memory_bytes,
                "gpus": q.gpus,
                "jobs": q.jobs,
                "credits_per_day": q.credits_per_day,
            },
            "used": {
                "cpu_milli": u.cpu_milli,
                "memory_bytes": u.memory_bytes,
                "gpus": u.gpus,
                "jobs": u.jobs,
                "credits_per_day": u.credits,
            },
        }
        for q, u in groups
    ]


def why(w: Why) -> Json:
    e = w.explanation
    return {
        "bid_id": w.job.bid_id.hex() if w.job.bid_id else None,
        "state": w.job.state,
        "offers_seen": e.offers if e else 0,
        "matching": e.matching if e else 0,
        "ruled_out": e.ruled_out if e else {},
        "best_price": e.best_quote if e else None,
        "limit": e.budget if e else None,
        "largest_free": dataclasses.asdict(e.largest_free) if e and e.largest_free else None,
        "cheapest": dataclasses.asdict(e.cheapest) if e and e.cheapest else None,
        "least_transfer": _transfer(e.least_transfer) if e and e.least_transfer else None,
        "explanation": w.text,
        "deadline_limit": dataclasses.asdict(w.rung.limit) if w.rung else None,
        "next_rise_ms": w.rung.next_rise_ms if w.rung else None,
    }


def _transfer(t: TransferCost) -> Json:
    return {**dataclasses.asdict(t), "total": t.total}


def market(
    book: OrderBook, prints: list[TradePrint], rejected: dict[str, int], now_ms: int
) -> Json:
    """Per resource class: the book's depth and best prices, and the tape's last price,
    volume and recent prices (``prints``: the tape's window, oldest first)."""
    classes: dict[str, Json] = {}

    def of(name: str) -> Json:
        return classes.setdefault(
            name,
            {
                "class": name,
                "offers": 0,
                "bids": 0,
                "best_cpu_core_hour": None,
                "best_memory_gib_hour": None,
                "best_bid_cpu_core_hour": None,
                "best_work_price": None,
                "best_work_per_kwh": None,
                "last_cpu_core_hour": None,
                "last_memory_gib_hour": None,
                "volume": 0,
                "volume_cpu_milli": 0,
                "last_prices": [],
            },
        )

    offers = [resting.offer for resting in book.live_offers(now_ms)]
    for o in offers:
        c = of(resource_class(o))
        c["offers"] += 1
        c["best_cpu_core_hour"] = _least(c["best_cpu_core_hour"], o.prices.cpu_core_hour)
        c["best_memory_gib_hour"] = _least(c["best_memory_gib_hour"], o.prices.memory_gib_hour)
        if (per_work := work_price(o)) is not None:
            c["best_work_price"] = _least(c["best_work_price"], per_work)
        if (per_kwh := work_per_kwh(o)) is not None:
            c["best_work_per_kwh"] = max(c["best_work_per_kwh"] or 0, per_kwh)
    bids = [b.order.payload for b in book.bids.values() if b.order.expires_ms > now_ms]
    for name, c in classes.items():
        wanting = [
            b for b in bids if any(_wants(b, o) for o in offers if resource_class(o) == name)
        ]
        c["bids"] = len(wanting)
        if wanting:
            c["best_bid_cpu_core_hour"] = max(b.max_prices.cpu_core_hour for b in wanting)
    for trade in prints:
        c = of(trade.resource_class)
        c["last_cpu_core_hour"] = trade.prices.cpu_core_hour
        c["last_memory_gib_hour"] = trade.prices.memory_gib_hour
        c["volume"] += 1
        c["volume_cpu_milli"] += trade.resources.cpu_milli
        c["last_prices"] = (c["last_prices"] + [trade.prices.cpu_core_hour])[-CHART_PRINTS:]
    return {
        "offers": len(offers),
        "bids": len(bids),
        "classes": sorted(classes.values(), key=lambda c: c["class"]),
        "recent_trades": [trade_print(t) for t in prints[-20:]],
        "rejected_gossip": dict(rejected),
    }


def trade_print(t: TradePrint) -> Json:
    return {
        "at_ms": t.at_ms,
        "class": t.resource_class,
        "cpu_core_hour": t.prices.cpu_core_hour,
        "memory_gib_hour": t.prices.memory_gib_hour,
        "cpu_milli": t.resources.cpu_milli,
        "memory_bytes": t.resources.memory_bytes,
        "buyer": PublicKey(t.buyer).peer_id,
        "provider": PublicKey(t.provider).peer_id,
    }


def history(prints: list[TradePrint], *, interval_ms: int, price_field: str) -> Json:
    """OHLC candles of ``price_field`` per class and ``interval_ms``."""
    by_class: dict[str, list[TradePrint]] = {}
    for t in prints:
        by_class.setdefault(t.resource_class, []).append(t)
    return {
        "interval_ms": interval_ms,
        "field": price_field,
        "classes": [
            {
                "class": name,
                "candles": [
                    dataclasses.asdict(c) for c in candles(group, interval_ms, price_field)
                ],
            }
            for name, group in sorted(by_class.items())
        ],
    }


def _least(best: int | None, price: int) -> int:
    return price if best is None else min(best, price)


def _wants(bid: Bid, offer: Offer) -> bool:
    """Could ``bid`` trade on ``offer``'s class, price and capacity aside?"""
    c = bid.constraints
    return (
        (c.arch is None or c.arch is offer.arch)
        and (not c.regions or offer.region in c.regions)
        and (c.gpu_model is None or any(g.model == c.gpu_model for g in offer.gpus))
        and bid.resources.gpus <= len(offer.gpus)
    )


def sold(s: Sold) -> Json:
    """A job this node took as provider; ``id`` is the name its log gives the job."""
    t = s.terms
    return {
        "id": s.row.id.hex()[:16],
        "agreement_id": s.row.id.hex(),
        "state": s.row.state,
        "buyer": PublicKey(t.buyer).peer_id,
        "image": t.job.image,
        "command": list(t.job.command),
        "cpu_milli": t.resources.cpu_milli,
        "memory_bytes": t.resources.memory_bytes,
        "prices": dataclasses.asdict(t.prices),
        "max_cost": t.max_cost,
        "earned": s.earned,
        "created_ms": s.row.created_ms,
        "started_ms": s.row.started_ms,
    }


def ledger(entries: Iterable[tuple[LedgerEntry, int]], me: bytes) -> Json:
    out = []
    balance = 0
    for entry, at in entries:
        role = "provider" if entry.payee == me else "buyer"
        balance += entry.amount if role == "provider" else -entry.amount
        out.append(
            {
                "agreement_id": entry.agreement_id.hex(),
                "at_ms": at,
                "payer": PublicKey(entry.payer).peer_id,
                "payee": PublicKey(entry.payee).peer_id,
                "amount": entry.amount,
                "role": role,
            }
        )
    return {"balance": balance, "entries": out}
