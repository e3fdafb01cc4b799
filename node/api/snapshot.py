"""What the dashboard shows of a running peer, as one JSON object.

The dashboard's live stream (``GET /v1/stream``) sends one of these whenever the node
changes: the node itself, its latest jobs, the market (book depth, recent trade prices,
each live offer with its provider's hardware, prices, reputation and attestation), the
ledger, the peers and, for a provider, its capacity and the jobs holding it now. Built from
the same views as the control API's routes, so the page and ``cx`` never disagree.
"""

from __future__ import annotations

from typing import Any

from node.api import views
from node.exec.cgroups import Counters
from node.exec.executor import Executor
from node.peer import Peer
from protocol.errors import ProtocolError
from protocol.identity import PublicKey
from protocol.messages import JobState
from protocol.negotiation import Agreement
from protocol.tape import resource_class

__all__ = ["JOBS_SHOWN", "snapshot"]

Json = dict[str, Any]
JOBS_SHOWN = 100  # newest first; older ones stay a `cx jobs` away
_HOLDING = frozenset({JobState.AGREED.value, JobState.TRANSFERRING.value, JobState.RUNNING.value})


def snapshot(peer: Peer, node: Json, market_view: Json) -> Json:
    """The dashboard's picture of ``peer``; ``node`` and ``market_view`` are its NodeView
    and MarketView."""
    market = peer.market
    me = peer.key.public_key.raw
    return {
        "at_ms": market.now_ms(),
        "node": node,
        "jobs": [views.job(j) for j in peer.jobs()[:JOBS_SHOWN]],
        "market": market_view,
        "offers": _offers(peer),
        "ledger": views.ledger(peer.ledger(), me),
        "peers": [{"peer_id": p, "score": peer.net.score(p)} for p in sorted(peer.net.peers())],
        "provider": _provider(peer),
    }


def _offers(peer: Peer) -> list[Json]:
    trader = peer.market.trader
    return views.offers(trader.book, trader.reputation, trader.me.raw, peer.market.now_ms())


def _measured(counters: Counters | None) -> Json:
    """A running job's use so far: CPU time (µs) and peak memory; None until measured."""
    if counters is None:
        return {"cpu_us": None, "memory_peak_bytes": None}
    return {"cpu_us": counters.cpu_us, "memory_peak_bytes": counters.memory_peak_bytes}


def _provider(peer: Peer) -> Json | None:
    provider = peer.provider
    if provider is None:
        return None
    capacity = provider.config.capacity
    # Measured use: only the real executor reads cgroups (a test's fake runner has none).
    used = provider.executor.live_usage() if isinstance(provider.executor, Executor) else {}
    running = []
    for row in peer.db.agreements():
        if row.role != "provider" or row.state not in _HOLDING:
            continue
        try:
            terms = Agreement.from_wire(row.wire).terms
        except (ProtocolError, ValueError):
            continue  # the provider quarantines it at its next start
        running.append(
            {
                "agreement_id": row.id.hex(),
                "state": row.state,
                "buyer": PublicKey(terms.buyer).peer_id,
                "started_ms": row.started_ms,
                "cpu_milli": terms.resources.cpu_milli,
                "memory_bytes": terms.resources.memory_bytes,
                "gpus": terms.resources.gpus,
                **_measured(used.get(row.id.hex()[:16])),  # node/market/provider.py's job id
            }
        )
    offer = provider.offer
    return {
        "class": resource_class(offer.payload) if offer is not None else None,
        "cpu_milli": capacity.cpu_milli,
        "memory_bytes": capacity.memory_bytes,
        "gpus": capacity.gpus,
        "running": running,
    }
