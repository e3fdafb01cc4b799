"""A scenario turned into a running world: who is who, demand, churn and partitions.

Rules:
- Roles are dealt to node indices by a seeded shuffle: providers (their hardware by the
  scenario's shares), adversaries, then honest buyers.
- Jobs arrive as a Poisson process whose rate follows the demand shape (thinning); each
  goes to a buyer drawn uniformly, its class drawn by share, its run time within
  +-50% of the class's mean, its price limit by the class's strategy.
- A benchmark liar is a provider of the first hardware class stating ``inflate`` times that
  class's work score, so buyers capping the price per unit of work see it as cheaper.
- A sybil ring is half providers, half buyers; its offers carry the region ``sybil`` and
  its buyers bid only there, so the ring trades with itself through the real book.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from node.sim.roles import (
    AdversaryScore,
    Buyer,
    NoCountersignBuyer,
    NoShowProvider,
    Provider,
    Role,
    SimJob,
    Spammer,
)
from node.sim.scenario import Adversary, Demand, Hardware, JobClass, Scenario
from node.sim.world import SimNode, World, derive_rng
from protocol.messages import Constraints

__all__ = ["RING_REGION", "Market", "build_market"]

RING_REGION = "sybil"
RING_JOB_EVERY_MS = 120_000


@dataclass(slots=True)
class Market:
    world: World
    providers: list[Provider]
    buyers: list[Buyer]  # every buyer that draws jobs from the demand (adversaries too)
    honest_buyers: list[Buyer]
    jobs: list[SimJob]
    scores: list[AdversaryScore]


def _pick(rng_value: float, shares: list[float]) -> int:
    total = sum(shares)
    acc = 0.0
    for i, share in enumerate(shares):
        acc += share / total
        if rng_value < acc:
            return i
    return len(shares) - 1


def build_market(scenario: Scenario, *, seed: int, verify: str = "once") -> Market:
    world = World(scenario, seed=seed, verify=verify)
    rng = derive_rng(seed, "deal")
    net = scenario.network
    hw_shares = [hw.share for hw in scenario.hardware]
    slots: list[tuple[str, object]] = [
        ("provider", scenario.hardware[_pick(rng.random(), hw_shares)])
        for _ in range(scenario.provider_count)
    ]
    scores: list[AdversaryScore] = []
    for adversary in scenario.adversaries:
        score = AdversaryScore(kind=adversary.kind, nodes=adversary.count)
        scores.append(score)
        slots += [(adversary.kind, (adversary, score, i)) for i in range(adversary.count)]
    honest = scenario.nodes - len(slots)
    slots += [("buyer", None)] * honest
    rng.shuffle(slots)

    market = Market(world=world, providers=[], buyers=[], honest_buyers=[], jobs=[], scores=scores)
    for kind, detail in slots:
        region = net.regions[rng.randrange(len(net.regions))]
        topic = "market" if net.topics == "global" else f"market/{region}"
        node = world.add_node(region=region, topic=topic)
        _deal(market, node, kind, detail)
    world.build_meshes()
    _schedule_demand(market, scenario.demand, scenario.jobs, seed)
    _schedule_churn(market, seed)
    _schedule_partitions(market, seed)
    for node in world.nodes:
        if node.role is not None:
            node.role.start()
    return market


def _provider(
    market: Market, node: SimNode, hw: Hardware, rng_value: float, cls: type[Provider]
) -> Provider:
    spread = hw.price_spread
    price = round(hw.cpu_price * (1 - spread + 2 * spread * rng_value))
    provider = cls(market.world, node, hw, price)
    market.providers.append(provider)
    return provider


def _deal(market: Market, node: SimNode, kind: str, detail: object) -> None:
    world = market.world
    draw = world.rng.random()
    scenario = world.scenario
    role: Role
    if kind == "provider":
        assert isinstance(detail, Hardware)
        _provider(market, node, detail, draw, Provider)
        return
    if kind == "buyer":
        buyer = Buyer(world, node)
        market.buyers.append(buyer)
        market.honest_buyers.append(buyer)
        return
    assert isinstance(detail, tuple)
    adversary, score, i = detail
    assert isinstance(adversary, Adversary)
    assert isinstance(score, AdversaryScore)
    hw = scenario.hardware[0]
    if kind == "spammer":
        role = Spammer(world, node, adversary.per_min)
    elif kind == "no-show-provider":
        role = _provider(market, node, hw, draw, NoShowProvider)
    elif kind == "benchmark-liar":
        role = _provider(market, node, hw, draw, Provider)
        role.work_score = round(hw.work_score * adversary.inflate)
    elif kind == "no-countersign-buyer":
        role = NoCountersignBuyer(world, node)
        market.buyers.append(role)
    elif i % 2 == 0:  # sybil ring: providers on even seats, buyers on odd
        role = _provider(market, node, hw, draw, Provider)
        role.offer_region = RING_REGION
    else:
        role = Buyer(world, node, Constraints(regions=(RING_REGION,)))
        _schedule_ring_jobs(market, role)
    role.score = score
    world.scores[node.index] = score


def _rate(demand: Demand, minute: float) -> float:
    """Jobs per minute at ``minute``."""
    rate = demand.jobs_per_min
    if (
        demand.shape == "surge"
        and demand.surge_at_min <= minute < demand.surge_at_min + demand.surge_min
    ):
        return rate * demand.surge_factor
    if demand.shape == "diurnal":
        return rate * (1 + demand.amplitude * math.sin(2 * math.pi * minute / demand.period_min))
    return rate


def _new_job(
    market: Market, cls: JobClass, buyer: Buyer, at_ms: int, draw: float, spread: float
) -> SimJob:
    if cls.strategy == "fixed":
        limit = cls.max_cpu_price
    elif cls.strategy == "escalate":
        limit = round(cls.max_cpu_price * (1 - cls.spread))
    else:
        limit = round(cls.max_cpu_price * (1 - cls.spread + 2 * cls.spread * spread))
    job = SimJob(
        id=len(market.jobs),
        cls=cls,
        buyer=buyer.node.index,
        submitted_ms=at_ms,
        run_ms=max(1000, round(cls.minutes * 60_000 * (0.5 + draw))),
        limit=limit,
    )
    market.jobs.append(job)
    return job


def _schedule_demand(
    market: Market, demand: Demand, classes: tuple[JobClass, ...], seed: int
) -> None:
    rng = derive_rng(seed, "demand")
    world = market.world
    peak = max(_rate(demand, m / 10) for m in range(int(world.scenario.minutes * 10) + 1))
    shares = [c.share for c in classes]
    minute = 0.0
    while True:
        minute += rng.expovariate(peak)
        if minute * 60_000 >= world.end:
            return
        if rng.random() * peak > _rate(demand, minute):
            continue  # thinned away
        cls = classes[_pick(rng.random(), shares)]
        buyer = market.buyers[rng.randrange(len(market.buyers))]
        at_ms = round(minute * 60_000)
        job = _new_job(market, cls, buyer, at_ms, rng.random(), rng.random())
        world.at(at_ms, _submit, buyer, job)


def _submit(buyer: Buyer, job: SimJob) -> None:
    buyer.submit(job)


def _schedule_ring_jobs(market: Market, buyer: Buyer) -> None:
    """A ring buyer buys from the ring, steadily, to build its providers a record."""
    world = market.world
    cls = world.scenario.jobs[0]
    for at_ms in range(world.rng.randrange(RING_JOB_EVERY_MS), world.end, RING_JOB_EVERY_MS):
        job = _new_job(market, cls, buyer, at_ms, 0.5, 1.0)
        world.at(at_ms, _submit, buyer, job)


def _schedule_churn(market: Market, seed: int) -> None:
    world = market.world
    churn = world.scenario.churn
    if churn.per_hour <= 0:
        return
    rng = derive_rng(seed, "churn")
    down_ms = round(churn.down_min * 60_000)
    for node in world.nodes:
        t = 0.0
        while True:
            t += rng.expovariate(churn.per_hour / 3_600_000)
            if t >= world.end:
                break
            world.at(round(t), _go_down, node, down_ms)
            t += down_ms


def _go_down(node: SimNode, down_ms: int) -> None:
    role = node.role
    assert role is not None
    role.world.set_down(node, True)
    if isinstance(role, Provider):
        role.went_down()
    role.world.at(down_ms, _come_back, node)


def _come_back(node: SimNode, _: None) -> None:
    assert node.role is not None
    node.role.world.set_down(node, False)


def _schedule_partitions(market: Market, seed: int) -> None:
    world = market.world
    rng = derive_rng(seed, "partition")
    for p in world.scenario.partitions:
        side = [1 if rng.random() < p.fraction else 0 for _ in world.nodes]
        world.at(round(p.start_min * 60_000), _partition, world, side)
        world.at(round(p.end_min * 60_000), _partition, world, None)


def _partition(world: World, side: list[int] | None) -> None:
    world.side = side
