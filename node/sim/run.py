"""One simulation run: a scenario and a seed in, the metrics document out."""

from __future__ import annotations

from typing import Any

from node.sim.market import build_market
from node.sim.metrics import measure
from node.sim.scenario import Scenario

__all__ = ["simulate"]


def simulate(scenario: Scenario, *, seed: int, verify: str = "once") -> dict[str, Any]:
    """Run ``scenario`` with ``seed``; the metrics (see :mod:`node.sim.metrics`)."""
    market = build_market(scenario, seed=seed, verify=verify)
    market.world.run()
    return measure(market, seed=seed)
