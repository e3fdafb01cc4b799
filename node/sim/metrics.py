"""What a run measured, as one JSON-ready document, and the run's digest.

Rules:
- Every figure is computed from the world after the run; nothing depends on wall time, so
  the document (and the digest over it) is the same for the same scenario and seed.
- The digest is SHA-256 over the canonical JSON of the document (without the digest) plus
  every ledger entry of every node and every node's traffic counters, so two runs that
  differ anywhere a node can see show different digests.
- Percentiles are nearest-rank; the fairness index is Jain's,
  ``(sum x)^2 / (n * sum x^2)``, over honest buyers, ``x`` = the share of a buyer's jobs
  that settled.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from node.sim.market import Market
from protocol.messages import JobState

__all__ = ["digest_of", "jain", "measure", "percentile"]

_MICRO = 1_000_000


def percentile(values: Sequence[int], q: float) -> int | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def jain(values: Sequence[float]) -> float | None:
    total = sum(values)
    squares = sum(v * v for v in values)
    if not values or squares == 0:
        return None
    return round(total * total / (len(values) * squares), 6)


def _spread(values: Sequence[int]) -> dict[str, Any]:
    return {
        "mean": round(statistics.fmean(values), 1) if values else None,
        "p50": percentile(values, 0.5),
        "p99": percentile(values, 0.99),
        "max": max(values, default=None),
    }


def _jobs(market: Market) -> dict[str, Any]:
    honest = {b.node.index for b in market.honest_buyers}
    jobs = [j for j in market.jobs if j.buyer in honest]
    matched = [j for j in jobs if j.matched_ms is not None]
    settled = [j for j in jobs if j.settled_ms is not None]
    waits = [j.matched_ms - j.submitted_ms for j in matched if j.matched_ms is not None]
    paid = sum(j.cost for j in settled)
    core_hours = sum(j.cls.cpu * j.run_ms / 3_600_000 for j in settled)
    per_buyer: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for job in jobs:
        per_buyer[job.buyer][0] += 1
        per_buyer[job.buyer][1] += job.settled_ms is not None
    return {
        "jobs": {
            "submitted": len(jobs),
            "matched": len(matched),
            "settled": len(settled),
            "gave_up": sum(j.gave_up for j in jobs),
            "escalations": sum(j.escalations for j in jobs),
            "provider_faults": sum(j.faults for j in jobs),
        },
        "match_rate": round(len(matched) / len(jobs), 6) if jobs else None,
        "time_to_match_ms": {"p50": percentile(waits, 0.5), "p99": percentile(waits, 0.99)},
        "fairness": jain([done / total for total, done in per_buyer.values()]),
        "work_per_credit": round(core_hours / (paid / _MICRO), 6) if paid else None,
        "credits_paid": paid,
    }


def _price_path(market: Market) -> dict[str, list[list[int]]]:
    """Per job class, the median agreed CPU price (micro-credits per core-hour) a minute."""
    bins: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for trade in market.world.trades:
        bins[trade.job_class][trade.at_ms // 60_000].append(trade.cpu_price)
    return {
        cls: [[minute, int(statistics.median(prices))] for minute, prices in sorted(by.items())]
        for cls, by in sorted(bins.items())
    }


def _traffic(market: Market) -> dict[str, Any]:
    stats = market.world.stats
    return {
        "published": stats.published,
        "gossip_deliveries": stats.deliveries,
        "admissions": stats.admissions,
        "rejected": dict(sorted(stats.rejected.items())),
        "direct_messages": sum(stats.direct) // 2,
        "lost_direct": stats.lost_direct,
        "events": stats.events,
        "per_node": {
            "gossip_messages": _spread(stats.received),
            "gossip_bytes": _spread(stats.received_bytes),
            "direct_messages": _spread(stats.direct),
            "book_orders": _spread([len(n.trader.book) for n in market.world.nodes]),
        },
    }


def _adversaries(market: Market) -> dict[str, Any]:
    world = market.world
    out: dict[str, Any] = {}
    honest = [b.buying.trader for b in market.honest_buyers]
    for score in market.scores:
        keys = [world.nodes[i].trader.me.raw for i, s in world.scores.items() if s is score]
        reputation = sum(t.reputation.get(k, 0) for t in honest for k in keys)
        out[score.kind] = {**score.as_dict(), "reputation_at_honest_nodes": reputation}
    return out


def _invariants(market: Market) -> dict[str, Any]:
    """Every settled receipt held alike by payer and payee; balances sum to zero; nobody
    paid for a job its provider abandoned."""
    problems: list[str] = []
    held: dict[bytes, list[tuple[bytes, bytes, int]]] = defaultdict(list)
    total = 0
    for node in market.world.nodes:
        for entry in node.trader.ledger.entries:
            held[entry.agreement_id].append((entry.payer, entry.payee, entry.amount))
        total += sum(node.trader.ledger.balances().values())
    for agreement_id, copies in sorted(held.items()):
        if len(copies) != 2 or copies[0] != copies[1]:
            problems.append(f"receipt {agreement_id.hex()[:16]} held {len(copies)} times")
    if total != 0:
        problems.append(f"balances sum to {total}, not zero")
    for buyer in market.buyers:
        for agreement_id, job in buyer.buying.jobs.items():
            if job.state is JobState.PROVIDER_FAULT and agreement_id in held:
                problems.append(f"paid for abandoned agreement {agreement_id.hex()[:16]}")
    return {"ok": not problems, "problems": problems[:20], "settled_receipts": len(held)}


def measure(market: Market, *, seed: int) -> dict[str, Any]:
    """The run's metrics document, ``digest`` included."""
    world = market.world
    scenario = world.scenario
    doc: dict[str, Any] = {
        "scenario": scenario.name,
        "seed": seed,
        "nodes": scenario.nodes,
        "providers": len(market.providers),
        "buyers": len(market.honest_buyers),
        "minutes": scenario.minutes,
        "topics": scenario.network.topics,
        **_jobs(market),
        "price_path": _price_path(market),
        "traffic": _traffic(market),
        "adversaries": _adversaries(market),
        "invariants": _invariants(market),
    }
    doc["digest"] = digest_of(market, doc)
    # how the run was computed, not what happened: outside the digest
    doc["run"] = {"verify": world.opener.mode, "signatures_opened": world.opener.opened}
    return doc


def digest_of(market: Market, doc: dict[str, Any]) -> str:
    h = hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
    for node in market.world.nodes:
        for entry in node.trader.ledger.entries:
            h.update(entry.agreement_id + entry.payer + entry.payee)
            h.update(entry.amount.to_bytes(8, "big"))
    stats = market.world.stats
    for counters in (stats.received, stats.received_bytes, stats.direct, stats.direct_bytes):
        h.update(json.dumps(counters).encode())
    return h.hexdigest()
