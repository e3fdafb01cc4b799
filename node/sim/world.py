"""The discrete-event core: a virtual clock, an event queue, the nodes and their network.

Rules:
- Time is an integer number of milliseconds since the run began; protocol time is
  ``EPOCH_MS`` plus that. Events run in (time, insertion order): the same scenario and seed
  give the same sequence of events, so the same run, bit for bit.
- All randomness comes from ``random.Random`` instances seeded from the run's seed, one per
  purpose, so adding a draw in one place does not shift every other.
- Nodes are real :class:`protocol.trader.Trader` objects with the real roles on top
  (:mod:`node.sim.roles`); the world only carries their bytes: gossip over
  :class:`node.sim.network.Mesh`, direct messages over a link with latency.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from node.sim.network import Mesh, lognormal_ms
from node.sim.opener import Opener
from node.sim.scenario import Scenario
from protocol.admission import ReplayGuard, admit
from protocol.envelope import Signed
from protocol.errors import ProtocolError
from protocol.identity import PrivateKey
from protocol.trader import Trader

if TYPE_CHECKING:
    from node.sim.roles import AdversaryScore, Buyer, Role, SimJob
    from protocol.negotiation import Agreement

__all__ = ["EPOCH_MS", "SimNode", "Stats", "Trade", "World"]

EPOCH_MS = 1_800_000_000_000  # protocol time at the start of every run
UPKEEP_MS = 60_000  # how often a node drops expired orders from its book


def derive_rng(seed: int, purpose: str) -> random.Random:
    digest = hashlib.sha256(f"cx-sim/{seed}/{purpose}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


@dataclass(slots=True)
class SimNode:
    index: int
    trader: Trader
    region: str
    topic: str  # the gossip topic group it subscribes to
    role: Role | None = None
    down: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Trade:
    at_ms: int
    job_class: str
    cpu_price: int
    buyer: int
    provider: int


@dataclass(slots=True)
class Stats:
    """Counters the world keeps per node and in total."""

    received: list[int]
    received_bytes: list[int]
    direct: list[int]
    direct_bytes: list[int]
    deliveries: int = 0  # gossip transmissions
    admissions: int = 0  # first copies that ran a node's admission
    rejected: dict[str, int] = field(default_factory=dict)  # by reason
    published: int = 0
    lost_direct: int = 0
    events: int = 0


class World:
    """One simulated market. Build it, :meth:`run` it; the roles act on it."""

    def __init__(self, scenario: Scenario, *, seed: int, verify: str = "once") -> None:
        self.scenario = scenario
        self.seed = seed
        self.now = 0
        self.end = int(scenario.minutes * 60_000)
        self.opener = Opener(verify)
        self._queue: list[tuple[int, int, Callable[..., None], Any, Any]] = []
        self._seq = 0
        self.rng = derive_rng(seed, "roles")  # the roles' own choices
        self._net_rng = derive_rng(seed, "network")
        self._nonce_rng = derive_rng(seed, "nonces")
        n = scenario.nodes
        self.stats = Stats(
            received=[0] * n, received_bytes=[0] * n, direct=[0] * n, direct_bytes=[0] * n
        )
        self.nodes: list[SimNode] = []
        self.by_key: dict[bytes, int] = {}
        self.meshes: dict[str, Mesh] = {}
        self.side: list[int] | None = None  # each node's side of an active partition
        self._down = [False] * n
        self.jobs_by_agreement: dict[bytes, SimJob] = {}
        self.trades: list[Trade] = []
        self.scores: dict[int, AdversaryScore] = {}  # by node index
        self._excluded: set[tuple[int, int]] = set()  # (buyer, provider) pairs
        self._prints: dict[str, list[tuple[int, int]]] = {}  # the tape: class -> (ms, CPU)

    # -- building ----------------------------------------------------------------------

    def add_node(self, *, region: str, topic: str) -> SimNode:
        index = len(self.nodes)
        seed = hashlib.sha256(f"cx-sim/{self.seed}/key/{index}".encode()).digest()
        node = SimNode(
            index=index, trader=Trader(PrivateKey.from_seed(seed)), region=region, topic=topic
        )
        self.nodes.append(node)
        self.by_key[node.trader.me.raw] = index
        return node

    def build_meshes(self) -> None:
        groups: dict[str, list[int]] = {}
        for node in self.nodes:
            groups.setdefault(node.topic, []).append(node.index)
        net = self.scenario.network
        rng = derive_rng(self.seed, "mesh")
        for topic in sorted(groups):
            self.meshes[topic] = Mesh.build(
                groups[topic],
                degree=net.degree,
                rng=rng,
                latency_ms=net.latency_ms,
                spread=net.latency_spread,
            )

    # -- time --------------------------------------------------------------------------

    @property
    def now_ms(self) -> int:
        """Protocol time."""
        return EPOCH_MS + self.now

    def at(self, delay_ms: int, action: Callable[..., None], a: Any = None, b: Any = None) -> None:  # noqa: ANN401
        """Run ``action(a, b)`` ``delay_ms`` from now."""
        self._seq += 1
        heapq.heappush(self._queue, (self.now + max(0, delay_ms), self._seq, action, a, b))

    def nonce(self, size: int = 16) -> bytes:
        return self._nonce_rng.randbytes(size)

    def run(self) -> None:
        """Run every event up to the scenario's end."""
        for node in self.nodes:
            self.at(node.index * UPKEEP_MS // len(self.nodes) + 1, self._upkeep, node)
        queue = self._queue
        pop = heapq.heappop
        events = 0
        while queue and queue[0][0] <= self.end:
            self.now, _, action, a, b = pop(queue)
            action(a, b)
            events += 1
        self.now = self.end
        self.stats.events = events

    def _upkeep(self, node: SimNode, _: None) -> None:
        node.trader.book.expire(self.now_ms)
        node.trader.guard.forget_expired(self.now_ms)
        self.at(UPKEEP_MS, self._upkeep, node)

    # -- liveness ----------------------------------------------------------------------

    def set_down(self, node: SimNode, down: bool) -> None:
        node.down = down
        self._down[node.index] = down

    def reachable(self, a: int, b: int) -> bool:
        side = self.side
        return not (self._down[a] or self._down[b] or (side is not None and side[a] != side[b]))

    # -- gossip ------------------------------------------------------------------------

    def publish(self, node: SimNode, order: Signed[Any] | bytes) -> None:
        """Gossip ``order`` from ``node`` on its topic; each reached node admits it."""
        wire = order if isinstance(order, bytes) else order.wire
        self.stats.published += 1
        net = self.scenario.network
        spread = self.meshes[node.topic].spread(
            node.index,
            size=len(wire),
            valid=self._valid(wire),
            down=self._down,
            side=self.side,
            loss=net.loss,
            recovery_ms=net.heartbeat_ms,
            rng=self._net_rng,
            received=self.stats.received,
            received_bytes=self.stats.received_bytes,
        )
        self.stats.deliveries += spread.deliveries
        nodes = self.nodes
        deliver = self._deliver
        for index, delay in zip(spread.nodes, spread.times, strict=True):
            self.at(delay, deliver, nodes[index], wire)
        last = spread.times[-1] if spread.times else 0
        self.at(last + 1, self._forget, wire)

    def _valid(self, wire: bytes) -> bool:
        """Would the first hop forward it? Decoding, signature and timing, not replay."""
        try:
            admit(self.opener(wire), self.now_ms, ReplayGuard())
        except ProtocolError:
            return False
        return True

    def _forget(self, wire: bytes, _: None) -> None:
        self.opener.forget(wire)

    def _deliver(self, node: SimNode, wire: bytes) -> None:
        if node.down:
            return
        self.stats.admissions += 1
        try:
            _, matches = node.trader.take_order(self.opener(wire), now_ms=self.now_ms)
        except ProtocolError as exc:
            reason = exc.reason.value
            self.stats.rejected[reason] = self.stats.rejected.get(reason, 0) + 1
            return
        if matches and node.role is not None:
            node.role.on_matches(matches)

    # -- what the roles report ----------------------------------------------------------

    def agreed(
        self, job: SimJob, agreement: Agreement, buyer: Buyer, provider: SimNode, cls: str
    ) -> None:
        self.jobs_by_agreement[agreement.id] = job
        self._prints.setdefault(cls, []).append((self.now, agreement.terms.prices.cpu_core_hour))
        self.trades.append(
            Trade(
                at_ms=self.now,
                job_class=job.cls.name,
                cpu_price=agreement.terms.prices.cpu_core_hour,
                buyer=buyer.node.index,
                provider=provider.index,
            )
        )
        mine, theirs = self.scores.get(buyer.node.index), self.scores.get(provider.index)
        if mine is not None and mine is theirs:
            mine.ring_trades += 1
            return
        for score in (mine, theirs):
            if score is not None:
                score.honest_trades += 1

    def prints(self, resource_class: str, since: int) -> list[int]:
        """CPU prices of the tape's prints of a class since ``since`` (run time, ms): every
        agreement makes one print, gossiped to all (protocol/tape.py)."""
        prints = self._prints.get(resource_class, [])
        return [price for at, price in prints if at >= since]

    def abandoned(self, job: SimJob, agreement: Agreement, provider: SimNode) -> None:
        score = self.scores.get(provider.index)
        if score is not None:
            if (job.buyer, provider.index) not in self._excluded:
                self._excluded.add((job.buyer, provider.index))
                score.excluded_by += 1
            score.wasted_ms += self.now - (job.matched_ms or self.now)

    # -- direct messages ---------------------------------------------------------------

    def send(self, src: SimNode, dst_key: bytes, kind: str, wire: bytes) -> None:
        """A direct stream message; lost if either end is down or a partition is between."""
        dst = self.nodes[self.by_key[dst_key]]
        for index in (src.index, dst.index):
            self.stats.direct[index] += 1
            self.stats.direct_bytes[index] += len(wire)
        if not self.reachable(src.index, dst.index):
            self.stats.lost_direct += 1
            return
        net = self.scenario.network
        delay = lognormal_ms(self._net_rng, net.latency_ms, net.latency_spread)
        self.at(delay, self._arrive, dst, (kind, wire, src))

    def _arrive(self, dst: SimNode, message: tuple[str, bytes, SimNode]) -> None:
        if dst.down or dst.role is None:
            self.stats.lost_direct += 1
            return
        kind, wire, src = message
        dst.role.on_direct(kind, wire, src)
