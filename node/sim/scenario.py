"""Scenarios: what a simulated market holds, parsed from TOML into frozen objects.

Rules:
- Every number a run depends on is in the scenario or derived from ``--seed``; nothing is
  read from the environment or the clock.
- Node counts are fractions of ``nodes`` (so ``--nodes`` scales a scenario), demand is an
  absolute rate of jobs per minute (so more nodes means more relays, not more work).
- Unknown keys are errors: a misspelt key must not silently fall back to a default.
- Money is micro-credits per unit, as in ``protocol.messages.Prices``.

The shipped scenarios live in ``spec/scenarios/``; ``spec/scenarios/README.md`` documents
every key.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

__all__ = [
    "ADVERSARY_KINDS",
    "Adversary",
    "Churn",
    "Demand",
    "Hardware",
    "JobClass",
    "Network",
    "Partition",
    "Scenario",
    "ScenarioError",
    "parse_scenario",
]

ADVERSARY_KINDS = (
    "spammer",
    "no-show-provider",
    "no-countersign-buyer",
    "sybil-ring",
    "benchmark-liar",
)
DEMAND_SHAPES = ("steady", "surge", "diurnal")
TOPIC_MODES = ("global", "region")
STRATEGIES = ("fixed", "spread", "escalate")
PRICING = ("fixed", "utilization", "market")


class ScenarioError(ValueError):
    """A scenario file that cannot be run; ``key`` names the offending entry."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"scenario: {key}: {message}")
        self.key = key


@dataclass(frozen=True, slots=True, kw_only=True)
class Network:
    degree: int = 8  # GossipSub's D: mesh peers per node and topic
    heartbeat_ms: int = 1000  # lost copies come back by IHAVE/IWANT at the next heartbeat
    latency_ms: int = 40  # median one-way link latency
    latency_spread: float = 0.5  # sigma of the log-normal around the median
    loss: float = 0.0  # chance that one transmission is lost
    topics: str = "global"  # "region": one offers and bids topic per region
    regions: tuple[str, ...] = ("eu", "us", "asia")


@dataclass(frozen=True, slots=True, kw_only=True)
class Partition:
    start_min: float
    end_min: float
    fraction: float  # of the nodes cut off from the rest


@dataclass(frozen=True, slots=True, kw_only=True)
class Churn:
    per_hour: float = 0.0  # chance that a node goes down within an hour
    down_min: float = 5.0  # how long it stays down


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardware:
    name: str
    share: float  # of the providers
    cpu: int  # cores
    memory_gib: int
    cpu_price: int  # micro-credits per core-hour
    mem_price: int = 0  # per GiB-hour
    price_spread: float = 0.2  # each provider's price within +-spread of cpu_price
    pricing: str = "fixed"  # protocol/pricing.py's policy for the CPU price
    ceiling_factor: float = 2.0  # utilization: the price at full load, times the drawn price
    floor_factor: float = 0.5  # utilization and market: the lowest price, times the drawn one
    undercut: float = 0.0  # market: ask this fraction below the tape's median
    work_score: int = 0  # work units per core-hour it states (protocol/work.py); 0: none


@dataclass(frozen=True, slots=True, kw_only=True)
class JobClass:
    name: str
    share: float  # of the jobs
    cpu: float  # cores
    memory_gib: float
    minutes: float  # mean run time
    max_cpu_price: int  # the bid's limit per core-hour, before the strategy's markup
    max_mem_price: int = 0
    strategy: str = "spread"  # fixed | spread (+-spread) | escalate (raise while waiting)
    spread: float = 0.3
    max_work_price: int = 0  # also cap the price per work unit (protocol/work.py); 0: no


@dataclass(frozen=True, slots=True, kw_only=True)
class Demand:
    shape: str = "steady"
    jobs_per_min: float = 10.0
    surge_at_min: float = 10.0
    surge_min: float = 5.0
    surge_factor: float = 5.0
    period_min: float = 60.0  # diurnal: one day in this many minutes
    amplitude: float = 0.8  # diurnal: rate swings +-amplitude around the mean


@dataclass(frozen=True, slots=True, kw_only=True)
class Adversary:
    kind: str
    count: int = 1
    per_min: float = 60.0  # spammer: invalid orders per minute, each
    inflate: float = 2.0  # benchmark-liar: its stated work score, times its true one


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    name: str
    description: str = ""
    nodes: int = 200
    providers: float = 0.05  # fraction of the nodes
    minutes: float = 30.0  # simulated time
    bid_ttl_min: float = 10.0
    network: Network = Network()
    partitions: tuple[Partition, ...] = ()
    churn: Churn = Churn()
    hardware: tuple[Hardware, ...] = ()
    jobs: tuple[JobClass, ...] = ()
    demand: Demand = Demand()
    adversaries: tuple[Adversary, ...] = ()

    @property
    def provider_count(self) -> int:
        return max(1, round(self.nodes * self.providers))


def _build(cls: type, table: Any, key: str) -> Any:  # noqa: ANN401 - TOML values
    """``cls`` from a TOML table, with its key names and value types checked."""
    if not isinstance(table, dict):
        raise ScenarioError(key, "must be a table")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ScenarioError(f"{key}.{unknown[0]}", f"unknown key (known: {', '.join(known)})")
    values: dict[str, Any] = {}
    for name, value in table.items():
        expected = known[name].type
        if expected == "float" and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if expected == "tuple[str, ...]" and isinstance(value, list):
            value = tuple(value)
        kind = {"int": int, "float": float, "str": str, "tuple[str, ...]": tuple}.get(str(expected))
        if kind is not None and (type(value) is not kind):
            raise ScenarioError(f"{key}.{name}", f"must be {expected}, not {value!r}")
        values[name] = value
    try:
        return cls(**values)
    except TypeError as exc:  # a required key is missing
        raise ScenarioError(key, str(exc).split("__init__() ")[-1]) from exc


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ScenarioError(key, message)


def _validate(s: Scenario) -> None:
    _check(s.nodes >= 10, "nodes", "at least 10")
    _check(0 < s.providers < 1, "providers", "a fraction between 0 and 1")
    _check(0 < s.minutes <= 24 * 60, "minutes", "between 0 and one day")
    _check(0 < s.bid_ttl_min <= 24 * 60, "bid_ttl_min", "between 0 and one day")
    net = s.network
    _check(2 <= net.degree <= 32, "network.degree", "between 2 and 32")
    _check(0 <= net.loss < 1, "network.loss", "a probability below 1")
    _check(net.latency_ms > 0 and net.heartbeat_ms > 0, "network", "latency, heartbeat > 0")
    _check(net.topics in TOPIC_MODES, "network.topics", f"one of {', '.join(TOPIC_MODES)}")
    _check(bool(net.regions), "network.regions", "at least one region")
    _check(bool(s.hardware), "hardware", "at least one [[hardware]] class")
    for i, hw in enumerate(s.hardware):
        _check(hw.pricing in PRICING, f"hardware[{i}].pricing", f"one of {PRICING}")
        _check(
            0 < hw.floor_factor <= 1 <= hw.ceiling_factor,
            f"hardware[{i}]",
            "floor_factor <= 1 <= ceiling_factor",
        )
        _check(0 <= hw.undercut < 1, f"hardware[{i}].undercut", "between 0 and 1")
    _check(bool(s.jobs), "jobs", "at least one [[jobs]] class")
    for i, job in enumerate(s.jobs):
        _check(job.strategy in STRATEGIES, f"jobs[{i}].strategy", f"one of {STRATEGIES}")
        _check(job.cpu > 0 and job.minutes > 0, f"jobs[{i}]", "cpu and minutes > 0")
    for i, p in enumerate(s.partitions):
        _check(0 <= p.start_min < p.end_min, f"partitions[{i}]", "start_min < end_min")
        _check(0 < p.fraction < 1, f"partitions[{i}].fraction", "between 0 and 1")
    _check(s.demand.shape in DEMAND_SHAPES, "demand.shape", f"one of {DEMAND_SHAPES}")
    _check(s.demand.jobs_per_min > 0, "demand.jobs_per_min", "must be > 0")
    for i, a in enumerate(s.adversaries):
        _check(a.kind in ADVERSARY_KINDS, f"adversaries[{i}].kind", f"one of {ADVERSARY_KINDS}")
        _check(a.count >= 1, f"adversaries[{i}].count", "at least 1")
    honest = s.nodes - s.provider_count - sum(a.count for a in s.adversaries)
    _check(honest >= 1, "nodes", "too few for the providers and adversaries")


def _load(text: str, read: Callable[[str], str] | None, depth: int = 0) -> dict[str, Any]:
    """The TOML document, merged over the one its ``extends`` names (tables key by key,
    arrays of tables replaced whole)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError("toml", str(exc)) from exc
    base_name = data.pop("extends", None)
    if base_name is None:
        return data
    if not isinstance(base_name, str) or read is None or depth > 4:
        raise ScenarioError("extends", "must name a scenario file beside this one")
    try:
        base = _load(read(base_name), read, depth + 1)
    except OSError as exc:
        raise ScenarioError("extends", f"cannot read {base_name}: {exc.strerror}") from exc
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base


def parse_scenario(
    text: str, *, nodes: int | None = None, read: Callable[[str], str] | None = None
) -> Scenario:
    """A scenario from TOML text; ``nodes`` overrides the file's node count; ``read``
    returns the text of the file an ``extends = "NAME"`` names.

    Raises:
        ScenarioError: naming the key at fault.
    """
    data = _load(text, read)
    tables = {
        "network": Network,
        "churn": Churn,
        "demand": Demand,
    }
    lists = {
        "partitions": Partition,
        "hardware": Hardware,
        "jobs": JobClass,
        "adversaries": Adversary,
    }
    top = {k: v for k, v in data.items() if k not in tables and k not in lists}
    if nodes is not None:
        top["nodes"] = nodes
    built: dict[str, Any] = {k: _build(cls, data[k], k) for k, cls in tables.items() if k in data}
    for k, cls in lists.items():
        if k in data:
            if not isinstance(data[k], list):
                raise ScenarioError(k, "must be an array of tables ([[" + k + "]])")
            built[k] = tuple(_build(cls, t, f"{k}[{i}]") for i, t in enumerate(data[k]))
    scenario: Scenario = _build(Scenario, {**top, **built}, "scenario")
    _validate(scenario)
    return scenario
