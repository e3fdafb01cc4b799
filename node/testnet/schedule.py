"""What happens to a testnet's nodes while the workload runs: churn and partitions.

A pure plan, drawn from a seeded generator, that :class:`~node.testnet.runner.Testnet`
carries out as the clock reaches each event:

- Churn ``f``: ``ceil(f * nodes)`` nodes, chosen at random, are each killed (SIGKILL) at a
  random moment of the first :data:`CHURN_WINDOW_S` seconds of the run and restarted on
  their homes :data:`DOWN_S` seconds later (a range).
- A partition of ``d`` seconds: from :data:`PARTITION_AT_S` into the run the nodes are split
  into two halves at random, and the cut heals ``d`` seconds later.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["CHURN_WINDOW_S", "DOWN_S", "PARTITION_AT_S", "Event", "Kind", "plan"]

CHURN_WINDOW_S = 10.0
DOWN_S = (1.0, 3.0)
PARTITION_AT_S = 2.0


class Kind(enum.StrEnum):
    KILL = "kill"
    RESTART = "restart"
    PARTITION = "partition"
    HEAL = "heal"


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    at_s: float  # seconds after the workload was submitted
    kind: Kind
    nodes: tuple[str, ...] = ()  # killed or restarted; for a partition, one side of it


def plan(
    names: Sequence[str], *, churn: float, partition_s: float, rng: random.Random
) -> list[Event]:
    """The events for ``names``, in the order they happen.

    Raises ValueError for a churn outside [0, 1] or a negative partition.
    """
    if not 0.0 <= churn <= 1.0:
        raise ValueError(f"churn is a fraction of the nodes, 0 to 1, not {churn}")
    if partition_s < 0:
        raise ValueError("a partition cannot last a negative time")
    events = []
    for name in rng.sample(list(names), math.ceil(churn * len(names))):
        killed = rng.uniform(0.5, CHURN_WINDOW_S)
        events.append(Event(at_s=killed, kind=Kind.KILL, nodes=(name,)))
        back = killed + rng.uniform(*DOWN_S)
        events.append(Event(at_s=back, kind=Kind.RESTART, nodes=(name,)))
    if partition_s > 0 and len(names) > 1:
        side = tuple(sorted(rng.sample(list(names), len(names) // 2)))
        events.append(Event(at_s=PARTITION_AT_S, kind=Kind.PARTITION, nodes=side))
        events.append(Event(at_s=PARTITION_AT_S + partition_s, kind=Kind.HEAL))
    return sorted(events, key=lambda e: e.at_s)
