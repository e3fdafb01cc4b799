"""The simulated network: GossipSub-like meshes, link latency, loss and partitions.

Rules (a model of GossipSub v1.1, spec/scenarios/README.md states it for readers):
- Each topic has a mesh among its subscribers: every node keeps about ``degree`` mesh
  peers (a random regular-ish graph, the same for the same seed).
- A node forwards a message it admitted to every mesh peer but the one it came from; every
  such transmission is a *delivery* and is counted, in messages and bytes, at both ends.
  Only the first copy runs admission; later copies hit the seen-cache and are dropped.
- A message that fails validation at a node is not forwarded by it (so invalid spam
  reaches only the spammer's own mesh peers).
- Arrival times follow the fewest-hops paths, each copy taking the link's latency; a lost
  transmission is recovered by IHAVE/IWANT, arriving one heartbeat and a round trip later.
- A link across an active partition carries nothing; a node that is down neither receives
  nor forwards.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Mesh", "Spread", "lognormal_ms"]


def lognormal_ms(rng: random.Random, median_ms: int, sigma: float) -> int:
    """A latency in whole milliseconds (at least 1), log-normal around ``median_ms``."""
    return max(1, round(median_ms * math.exp(rng.gauss(0.0, sigma))))


@dataclass(slots=True)
class Spread:
    """One message's journey: first arrival per reached node (parallel lists, in order of
    arrival time), and how many transmissions happened."""

    nodes: list[int]
    times: list[int]
    deliveries: int


@dataclass(slots=True)
class Mesh:
    """One topic's mesh over global node indices; ``latency`` per directed link."""

    members: list[int]
    neighbours: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        members: Sequence[int],
        *,
        degree: int,
        rng: random.Random,
        latency_ms: int,
        spread: float,
    ) -> Mesh:
        """A random graph where each member dials ``degree // 2`` others (so degrees are
        about ``degree``), plus a ring so the mesh is connected."""
        mesh = cls(members=list(members))
        links: dict[int, dict[int, int]] = {m: {} for m in members}

        def link(a: int, b: int) -> None:
            if a != b and b not in links[a]:
                ms = lognormal_ms(rng, latency_ms, spread)
                links[a][b] = ms
                links[b][a] = ms

        count = len(members)
        for i, node in enumerate(members):
            if count > 1:
                link(node, members[(i + 1) % count])
            for _ in range(max(0, min(degree // 2 - 1, count - 2))):
                link(node, members[rng.randrange(count)])
        mesh.neighbours = {m: sorted(links[m].items()) for m in members}
        return mesh

    def spread(
        self,
        origin: int,
        *,
        size: int,
        valid: bool,
        down: Sequence[bool],
        side: Sequence[int] | None,
        loss: float,
        recovery_ms: int,
        rng: random.Random,
        received: list[int],
        received_bytes: list[int],
    ) -> Spread:
        """Flood one message from ``origin``; counts each transmission in ``received``.

        ``side`` is each node's side of an active partition (None: no partition).
        """
        arrival: dict[int, int] = {origin: 0}
        parent: dict[int, int] = {origin: -1}
        frontier = [origin]
        deliveries = 0
        neighbours = self.neighbours
        while frontier:
            layer: list[int] = []
            fresh: set[int] = set()  # reached in this layer: a faster copy may still win
            for node in frontier:
                t = arrival[node]
                skip = parent[node]
                for peer, ms in neighbours[node]:
                    if (
                        peer == skip
                        or down[peer]
                        or (side is not None and side[peer] != side[node])
                    ):
                        continue
                    deliveries += 1
                    received[peer] += 1
                    received_bytes[peer] += size
                    if loss and rng.random() < loss:
                        ms += recovery_ms + 2 * ms
                    seen = arrival.get(peer)
                    if seen is None:
                        arrival[peer] = t + ms
                        parent[peer] = node
                        layer.append(peer)
                        fresh.add(peer)
                    elif seen > t + ms and peer in fresh:
                        arrival[peer] = t + ms
                        parent[peer] = node
            # only the origin forwards an invalid message (its peers drop it)
            frontier = layer if valid else []
        del arrival[origin]
        order = sorted(arrival, key=lambda n: (arrival[n], n))
        return Spread(nodes=order, times=[arrival[n] for n in order], deliveries=deliveries)
