"""A node's Prometheus instruments: what its services count as it happens.

Rules:

- One :class:`Metrics` per node, each with its own registry: several nodes may share a
  process (``cx demo``, the tests), and none sees another's counts.
- Names follow Prometheus conventions: ``cx_`` prefix, ``_total`` for counters (the client
  library adds it), base units (seconds, bytes). Labels take a small, fixed set of values
  (a refusal's reason, a role, an outcome), never an id.
- Only what happens is counted here. What a scrape can read from the node's state (the
  book, jobs by state, the ledger, peers) is read then, by ``node/api/scrape.py``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["Metrics"]

# Container start: from run_job to the runtime having started the job (image unpack, areas,
# config.json, crun/runc run). Tens of milliseconds when the image is cached, seconds if not.
_START_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """The counters and histograms of one node, in :attr:`registry`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.orders = Counter(
            "cx_orders",
            "Gossiped orders taken into the book (admitted) or refused, with the reason",
            ["outcome", "reason"],
            registry=r,
        )
        self.matches = Counter(
            "cx_matches", "Bid-offer matches found in this node's book", registry=r
        )
        self.negotiations = Counter(
            "cx_negotiations",
            "Negotiations this node took part in, by its role and how they ended",
            ["role", "outcome"],
            registry=r,
        )
        self.quota_refusals = Counter(
            "cx_quota_refusals",
            "Proposals this provider refused for a quota, by the group and the quota",
            ["group", "quota"],
            registry=r,
        )
        self.container_start = Histogram(
            "cx_container_start_seconds",
            "Time from a job's start on this provider to its container running",
            buckets=_START_BUCKETS,
            registry=r,
        )
        self.usage_cpu = Counter(
            "cx_usage_cpu_seconds",
            "CPU time metered in receipts this provider signed",
            registry=r,
        )
        self.usage_wall = Counter(
            "cx_usage_wall_seconds",
            "Wall time metered in receipts this provider signed",
            registry=r,
        )

    def order_admitted(self, matches: int) -> None:
        self.orders.labels("admitted", "").inc()
        self.matched(matches)

    def matched(self, matches: int) -> None:
        """``matches`` found in the book, by an order that came in or one of our own."""
        self.matches.inc(matches)

    def order_refused(self, reason: str) -> None:
        self.orders.labels("refused", reason).inc()

    def negotiation(self, role: str, outcome: str) -> None:
        """``role`` is buyer or provider; ``outcome`` agreed, rejected or failed."""
        self.negotiations.labels(role, outcome).inc()

    def metered(self, *, cpu_us: int, wall_ms: int) -> None:
        self.usage_cpu.inc(cpu_us / 1e6)
        self.usage_wall.inc(wall_ms / 1e3)
