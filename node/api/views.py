"""The JSON shapes of the control API: one function per kind of object a node shows.

Pure conversions of the node's typed objects (node/api/server.py's docstring is the
schema); nothing here reads state or has effects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from node.market.gossip import Trade, resource_class
from node.peer import Why
from node.storage.db import JobRow
from protocol.book import OrderBook
from protocol.envelope import Signed
from protocol.identity import PublicKey
from protocol.messages import Offer
from protocol.settlement import LedgerEntry

__all__ = ["job", "ledger", "market", "offer", "why"]

Json = dict[str, Any]


def job(row: JobRow) -> Json:
    return {
        "id": row.id,
        "name": row.name,
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
    }


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
        "explanation": w.text,
    }


def market(book: OrderBook, trades: Iterable[Trade], rejected: dict[str, int], now_ms: int) -> Json:
    classes: dict[str, Json] = {}

    def of(name: str) -> Json:
        empty = {"class": name, "offers": 0, "bids": 0, "best_cpu_core_hour": None}
        return classes.setdefault(name, {**empty, "last_prices": []})

    for resting in book.live_offers(now_ms):
        c = of(resource_class(resting.offer))
        c["offers"] += 1
        price, best = resting.offer.prices.cpu_core_hour, c["best_cpu_core_hour"]
        c["best_cpu_core_hour"] = price if best is None else min(price, best)
    trades = list(trades)
    for trade in trades:
        c = of(trade.resource_class)
        c["last_prices"] = (c["last_prices"] + [trade.cpu_core_hour])[-5:]
    bids = sum(1 for b in book.bids.values() if b.order.expires_ms > now_ms)
    return {
        "offers": sum(c["offers"] for c in classes.values()),
        "bids": bids,
        "classes": sorted(classes.values(), key=lambda c: c["class"]),
        "recent_trades": [
            {
                "at_ms": t.at_ms,
                "class": t.resource_class,
                "cpu_core_hour": t.cpu_core_hour,
                "memory_gib_hour": t.memory_gib_hour,
            }
            for t in trades[-20:]
        ],
        "rejected_gossip": dict(rejected),
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
