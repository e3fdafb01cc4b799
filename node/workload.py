"""The testnet's scenarios and their judgement, shared by ``cx testnet`` (node processes
over libp2p) and ``cx demo`` (the same nodes in one process over the in-memory network).

A scenario is providers (:data:`PROVIDERS`: region and price; a pricing policy) and a
workload of jobs in phases, each job with the outcome it must reach; a phase starts when
the one before it is done. :func:`judge` then checks what the nodes report through the
control API's JSON views: every job reached its planned outcome, every receipt is held
alike by its payer and its payee, the balances sum to zero, and the scenario's own checks
hold (the surge's prices rose and fell).

- ``demo`` (:data:`WORKLOAD`): mixed resources, regions, trust, a failure and bids that
  must not match, at fixed prices.
- ``surge``: demand rises above supply and falls again, with providers pricing by
  utilization or by the tape.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from node.market.buyer import FINAL_STATES
from node.market.request import JobRequest, build_request
from node.storage.home import ProviderConfig
from protocol.messages import Arch, Prices, Resources
from protocol.pricing import Policy, Pricing, ResourcePricing

__all__ = [
    "PROVIDERS",
    "SCENARIOS",
    "WORKLOAD",
    "JobPlan",
    "Scenario",
    "Verdict",
    "is_done",
    "judge",
    "provider_config",
    "request_for",
]

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class JobPlan:
    """One job of the demo workload and the outcome it must reach."""

    name: str
    buyer: int  # index of the buyer that submits it
    command: str
    expect: str  # "succeeded", "failed" or "unmatched" (it must not match: its bid waits)
    cpu_milli: int = 500
    memory_bytes: int = 128 * MIB
    max_cpu_price: int = 120_000_000
    regions: tuple[str, ...] = ()
    arch: str | None = None
    trust: str = "none"
    phase: str = ""  # jobs of one phase are submitted together, after the phase before
    max_memory_price: int = 10_000_000


WORKLOAD: tuple[JobPlan, ...] = (
    JobPlan("hello", 0, "echo hello > /out/hello.txt", "succeeded"),
    JobPlan("checksum", 1, "seq 1 200000 | md5sum > /out/sum", "succeeded"),
    JobPlan("eu-only", 0, "uname -a > /out/uname", "succeeded", regions=("eu",)),
    JobPlan(
        "busy-loop",
        1,
        "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; echo $i > /out/count",
        "succeeded",
        cpu_milli=1000,
    ),
    JobPlan("attested", 0, "echo measured > /out/attested", "succeeded", trust="tpm"),
    JobPlan("fails", 1, "echo oops >&2; exit 3", "failed"),
    JobPlan("too-cheap", 0, "true", "unmatched", max_cpu_price=10_000_000),
    JobPlan("needs-arm", 1, "true", "unmatched", arch="arm64"),
)

PROVIDERS = (  # region, CPU price per core-hour (micro-credits)
    ("eu", 90_000_000),
    ("us", 70_000_000),
    ("ap", 110_000_000),
    ("eu", 95_000_000),
    ("us", 85_000_000),
)


def provider_config(
    index: int, arch: str, *, tpm: bool = False, pricing: Pricing | None = None
) -> tuple[str, ProviderConfig]:
    """The name and configuration of the scenario's provider number ``index``."""
    region, price = PROVIDERS[index % len(PROVIDERS)]
    config = ProviderConfig(
        capacity=Resources(cpu_milli=2000, memory_bytes=2 * GIB, disk_bytes=4 * GIB),
        prices=Prices(cpu_core_hour=price, memory_gib_hour=9_000_000),
        arch=Arch(arch),
        region=region,
        tpm=tpm,
        pricing=pricing,
        benchmark=True,
    )
    return f"prov-{region}{index // len(PROVIDERS) or ''}", config


def request_for(plan: JobPlan, image: str) -> JobRequest:
    return build_request(
        image=image,
        command=("sh", "-c", plan.command),
        cpu_milli=plan.cpu_milli,
        memory_bytes=plan.memory_bytes,
        wall_ms=120_000,
        max_prices={"cpu_core_hour": plan.max_cpu_price, "memory_gib_hour": plan.max_memory_price},
        regions=plan.regions,
        arch=plan.arch,
        trust=plan.trust,
        name=plan.name,
    )


@dataclass(slots=True)
class Verdict:
    """What a run of the scenario found at the end."""

    jobs: list[dict[str, Any]] = field(default_factory=list)  # job views, with the plan's
    ledgers: dict[str, dict[str, Any]] = field(default_factory=dict)  # node name -> ledger
    trades: list[dict[str, Any]] = field(default_factory=list)  # the tape, as a node kept it
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def is_done(view: dict[str, Any]) -> bool:
    """Done with, for the demo: ended, or (for a bid meant not to match) still waiting."""
    return view["state"] in FINAL_STATES or (
        view["expect"] == "unmatched" and view["state"] == "waiting"
    )


def judge(verdict: Verdict, names: dict[str, str]) -> None:
    """Record in ``verdict.problems`` every job off its plan, every receipt not held alike
    by payer and payee, and balances that do not sum to zero. ``names`` maps peer ids to
    node names; ``verdict.jobs`` carry ``plan`` and ``expect`` beside the job view."""
    for view in verdict.jobs:
        want, got = view["expect"], view["state"]
        if want == "unmatched" and got not in ("waiting", "cancelled"):
            verdict.problems.append(f"{view['plan']} should not have matched but is {got}")
        elif want != "unmatched" and got != want:
            verdict.problems.append(f"{view['plan']} is {got}, expected {want}: {view['detail']}")
    held: dict[str, dict[str, tuple[Any, ...]]] = {}
    for name, ledger in verdict.ledgers.items():
        for e in ledger["entries"]:
            held.setdefault(e["agreement_id"], {})[name] = (e["payer"], e["payee"], e["amount"])
    for agreement, holders in held.items():
        entry = next(iter(holders.values()))
        parties = {names.get(entry[0]), names.get(entry[1])}
        if set(holders) != parties or len(set(holders.values())) != 1:
            named = sorted(filter(None, parties))
            verdict.problems.append(f"receipt {agreement[:16]} is not held alike by {named}")
    total = sum(ledger["balance"] for ledger in verdict.ledgers.values())
    if total != 0:
        verdict.problems.append(f"balances sum to {total}, not zero")


# -- scenarios ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    summary: str
    plans: tuple[JobPlan, ...]
    pricing: Callable[[int], Pricing | None] = lambda index: None  # provider index -> policy
    checks: tuple[Callable[[Verdict], None], ...] = ()

    def phases(self) -> list[list[JobPlan]]:
        """The plans grouped by phase, in the order the phases first appear."""
        grouped: dict[str, list[JobPlan]] = {}
        for plan in self.plans:
            grouped.setdefault(plan.phase, []).append(plan)
        return list(grouped.values())

    @property
    def needs_tpm(self) -> bool:
        return any(plan.trust != "none" for plan in self.plans)


SURGE_FLOOR, SURGE_CEILING = 50_000_000, 150_000_000


def _surge_pricing(index: int) -> Pricing:
    """Every other provider follows its utilization, the rest the tape (2 % under it)."""
    policy = Policy.MARKET if index % 2 else Policy.UTILIZATION
    cpu = ResourcePricing(
        policy=policy,
        price=SURGE_FLOOR,
        floor=SURGE_FLOOR,
        ceiling=SURGE_CEILING,
        undercut_ppm=20_000,
    )
    memory = ResourcePricing(price=9_000_000)
    return Pricing(
        resources={"cpu_core_hour": cpu, "memory_gib_hour": memory},
        min_interval_ms=1000,
        window_ms=60_000,
    )


def _surge_plans() -> tuple[JobPlan, ...]:
    def wave(phase: str, count: int, seconds: int) -> list[JobPlan]:
        return [
            JobPlan(
                f"{phase}-{i + 1}",
                i,
                f"sleep {seconds}; echo {phase} > /out/done",
                "succeeded",
                max_cpu_price=200_000_000,
                phase=phase,
            )
            for i in range(count)
        ]

    return tuple(wave("before", 2, 1) + wave("surge", 16, 3) + wave("after", 2, 1))


def _prices_rose_and_fell(verdict: Verdict) -> None:
    """The CPU prices the surge's jobs paid are on average above the highest before it,
    and the highest after it is below the surge's highest."""
    paid: dict[str, list[int]] = {}
    for view in verdict.jobs:
        if view.get("price"):
            paid.setdefault(view["plan"].split("-")[0], []).append(view["price"]["cpu_core_hour"])
    before, surge, after = (paid.get(p, []) for p in ("before", "surge", "after"))
    if not (before and surge and after):
        verdict.problems.append("a phase of the surge traded nothing")
        return
    if statistics.mean(surge) <= max(before):
        verdict.problems.append(
            f"prices did not rise in the surge: before {before}, surge mean "
            f"{statistics.mean(surge):.0f}"
        )
    if max(after) >= max(surge):
        verdict.problems.append(f"prices did not fall after the surge: after {after}")


SCENARIOS = {
    "demo": Scenario("demo", "mixed jobs at fixed prices, some meant to fail", WORKLOAD),
    "surge": Scenario(
        "surge",
        "demand rises above supply and falls again; prices follow utilization and the tape",
        _surge_plans(),
        pricing=_surge_pricing,
        checks=(_prices_rose_and_fell,),
    ),
}
