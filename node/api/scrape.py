"""``GET /metrics``: a running peer in the Prometheus text format.

Two sources: the counters the node's services keep as things happen (node/metrics.py), and
what a scrape reads from the node's state at that moment (this module's
:class:`_StateCollector`: the book, jobs and agreements by state, the ledger, peers and
their scores, gossip queues, blob traffic). Reading state at scrape time keeps those figures
true after a restart (jobs, receipts and the balance live in the database) and costs the
node nothing between scrapes.

Every name is ``cx_...``, counters end in ``_total``, sizes are bytes, times seconds, money
credits (a micro-credit is 1e-6).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from node.market.buyer import JOB_STATES
from node.peer import Peer
from node.storage.transfer import DIRECT_CHANNEL_OUTCOMES
from protocol.messages import JobState

__all__ = ["CONTENT_TYPE", "exposition"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
_MICRO = 1e-6


class _StateCollector(Collector):
    """The node's counters, then what its state says now."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer

    def collect(self) -> Iterator[Metric]:
        yield from self.peer.market.metrics.registry.collect()
        yield from self._book()
        yield from self._jobs()
        yield from self._ledger()
        yield from self._network()

    def _book(self) -> Iterator[Metric]:
        book, now = self.peer.market.trader.book, self.peer.market.now_ms()
        orders = GaugeMetricFamily(
            "cx_book_orders", "Live orders in this node's book", labels=["side"]
        )
        orders.add_metric(["offer"], sum(1 for _ in book.live_offers(now)))
        orders.add_metric(["bid"], sum(1 for b in book.bids.values() if b.order.expires_ms > now))
        yield orders

    def _jobs(self) -> Iterator[Metric]:
        db = self.peer.db
        jobs = GaugeMetricFamily(
            "cx_jobs", "This node's jobs as a buyer, by state", labels=["state"]
        )
        counts = db.state_counts()
        for state in JOB_STATES:
            jobs.add_metric([state], counts.get(state, 0))
        yield jobs
        if self.peer.provider is not None:
            served = GaugeMetricFamily(
                "cx_provider_jobs",
                "Agreements this provider runs or ran, by state",
                labels=["state"],
            )
            counts = db.state_counts("provider")
            for job_state in JobState:
                served.add_metric([job_state.value], counts.get(job_state.value, 0))
            yield served

    def _ledger(self) -> Iterator[Metric]:
        me = self.peer.key.public_key.raw
        entries = self.peer.market.trader.ledger.entries
        receipts = CounterMetricFamily(
            "cx_receipts", "Settled receipts, by this node's role", labels=["role"]
        )
        receipts.add_metric(["provider"], sum(1 for e in entries if e.payee == me))
        receipts.add_metric(["buyer"], sum(1 for e in entries if e.payer == me))
        yield receipts
        balance = self.peer.market.trader.ledger.balances().get(me, 0)
        yield GaugeMetricFamily(
            "cx_ledger_balance_credits", "Earned minus paid, in credits", value=balance * _MICRO
        )

    def _network(self) -> Iterator[Metric]:
        net, store = self.peer.net, self.peer.market.store
        peers = sorted(net.peers())
        yield GaugeMetricFamily("cx_peers", "Peers connected now", value=len(peers))
        scores = GaugeMetricFamily(
            "cx_peer_score", "This node's gossip score of each peer", labels=["peer"]
        )
        for peer in peers:
            scores.add_metric([peer], net.score(peer))
        yield scores
        queues = GaugeMetricFamily(
            "cx_gossip_queue_depth", "Gossip messages waiting, by queue", labels=["queue"]
        )
        for name, depth in sorted(net.queue_depths().items()):
            queues.add_metric([name], depth)
        yield queues
        traffic = CounterMetricFamily(
            "cx_transfer_bytes", "Blob bytes served to and fetched from peers", labels=["direction"]
        )
        for direction, size in sorted(store.traffic.items()):
            traffic.add_metric([direction], size)
        yield traffic
        channels = CounterMetricFamily(
            "cx_direct_channels",
            "Direct channels for blob transfer: as server, opened or refused; as requester, "
            "opened or fell back to libp2p streams",
            labels=["role", "outcome"],
        )
        for role, outcome in DIRECT_CHANNEL_OUTCOMES:
            channels.add_metric([role, outcome], store.direct_channels[role, outcome])
        yield channels


def exposition(peer: Peer) -> bytes:
    """Everything /metrics shows of ``peer``, in the Prometheus text format."""
    return generate_latest(_StateCollector(peer))
