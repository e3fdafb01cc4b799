"""``cx sim``: a deterministic discrete-event simulator of the market at scale.

It drives the real sans-IO core (``protocol/``: Trader, book, Buying, Selling, receipts,
settlement) over a simulated network, with no trio, no sockets and no wall clock, so the
same scenario and seed give the same run bit for bit. Modules: ``scenario`` (TOML in),
``network`` (GossipSub-like meshes), ``opener`` (signature checking once or per hop),
``world`` (the event loop), ``roles`` (buyers, providers, adversaries), ``market`` (a
scenario dealt onto nodes), ``metrics`` (the JSON document and digest), ``report``
(HTML with SVG plots), ``run`` (one run).
"""

from node.sim.opener import VERIFY_MODES
from node.sim.run import simulate
from node.sim.scenario import Scenario, ScenarioError, parse_scenario

__all__ = ["VERIFY_MODES", "Scenario", "ScenarioError", "parse_scenario", "simulate"]
