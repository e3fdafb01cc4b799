"""The local market demo: real signed orders, matching, agreements, containers, receipts.

Providers and buyers are sans-IO Traders in this one process, handing each other the exact
bytes they would send over the network; each provider runs its agreed jobs in real OCI
containers through its own Executor and store, and settles by countersigned receipt. The
networked version of this is ``cx testnet`` (issue 5); everything but the transport is the
same code.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from node.clock import new_nonce, now_ms
from node.exec.executor import Executor, ExecutorConfig
from node.storage.image import build_rootfs, import_image
from protocol.book import Explanation, Match
from protocol.envelope import MessageId
from protocol.identity import PrivateKey
from protocol.messages import (
    Accept,
    Arch,
    Bid,
    Constraints,
    JobSpec,
    JobState,
    Offer,
    Prices,
    Resources,
)
from protocol.negotiation import Agreement
from protocol.trader import Trader

log = logging.getLogger(__name__)

__all__ = ["DemoResult", "JobLine", "run_demo"]

MIB = 1 << 20
GIB = 1 << 30
HOUR_MS = 3_600_000


@dataclass(slots=True)
class JobLine:
    name: str
    buyer: str
    provider: str = "-"
    state: str = "waiting"
    exit_reason: str = "-"
    wall_ms: int = 0
    cpu_us: int = 0
    cost: int = 0
    outputs: int = 0
    why: Explanation | None = None


# One settled receipt as a ledger holds it: (agreement id, payer, payee, amount).
Entry = tuple[str, str, str, int]


@dataclass(slots=True)
class DemoResult:
    jobs: list[JobLine] = field(default_factory=list)
    ledgers: dict[str, set[Entry]] = field(default_factory=dict)  # node name -> its entries
    image: str = ""

    @property
    def balances(self) -> dict[str, int]:
        """Network-wide balances from the union of all ledgers."""
        totals = dict.fromkeys(self.ledgers, 0)
        for _, payer, payee, amount in set().union(*self.ledgers.values()):
            totals[payer] -= amount
            totals[payee] += amount
        return totals

    @property
    def ledgers_agree(self) -> bool:
        """Every entry is held, identically, by both its payer and its payee."""
        return (
            all(
                entry in self.ledgers[entry[1]] and entry in self.ledgers[entry[2]]
                for entries in self.ledgers.values()
                for entry in entries
            )
            and sum(self.balances.values()) == 0
        )


@dataclass(slots=True)
class _Provider:
    name: str
    trader: Trader
    executor: Executor
    offer: Offer


def _providers_offers() -> list[tuple[str, Offer]]:
    cpu = Resources(cpu_milli=2000, memory_bytes=2 * GIB, disk_bytes=4 * GIB)
    return [
        (
            "prov-eu",
            Offer(
                capacity=cpu,
                prices=Prices(cpu_core_hour=90_000_000, memory_gib_hour=9_000_000),
                arch=Arch.AMD64,
                region="eu",
            ),
        ),
        (
            "prov-us",
            Offer(
                capacity=cpu,
                prices=Prices(cpu_core_hour=70_000_000, memory_gib_hour=8_000_000),
                arch=Arch.AMD64,
                region="us",
            ),
        ),
        (
            "prov-ap",
            Offer(
                capacity=cpu,
                prices=Prices(cpu_core_hour=110_000_000, memory_gib_hour=9_000_000),
                arch=Arch.AMD64,
                region="ap",
            ),
        ),
    ]


def _workload(image: str) -> list[tuple[str, str, Bid]]:
    def job(command: str, *, wall_ms: int = 60_000) -> JobSpec:
        return JobSpec(image=image, command=("sh", "-c", command), wall_ms=wall_ms)

    small = Resources(cpu_milli=500, memory_bytes=128 * MIB)
    limits = Prices(cpu_core_hour=120_000_000, memory_gib_hour=10_000_000)
    return [
        (
            "hello",
            "alice",
            Bid(job=job("echo hello > /out/hello.txt"), resources=small, max_prices=limits),
        ),
        (
            "checksum",
            "alice",
            Bid(job=job("seq 1 200000 | md5sum > /out/sum"), resources=small, max_prices=limits),
        ),
        (
            "eu-only",
            "bob",
            Bid(
                job=job("uname -a > /out/uname"),
                resources=small,
                max_prices=limits,
                constraints=Constraints(regions=("eu",)),
            ),
        ),
        (
            "busy-loop",
            "bob",
            Bid(
                job=job("i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; echo $i > /out/count"),
                resources=Resources(cpu_milli=1000, memory_bytes=64 * MIB),
                max_prices=limits,
            ),
        ),
        (
            "fails",
            "alice",
            Bid(job=job("echo oops >&2; exit 3"), resources=small, max_prices=limits),
        ),
        (
            "too-cheap",
            "bob",
            Bid(
                job=job("true"),
                resources=small,
                max_prices=Prices(cpu_core_hour=10_000_000, memory_gib_hour=1_000_000),
            ),
        ),
        (
            "needs-arm",
            "alice",
            Bid(
                job=job("true"),
                resources=small,
                max_prices=limits,
                constraints=Constraints(arch=Arch.ARM64),
            ),
        ),
    ]


async def run_demo(
    work: Path | None = None, *, on_change: Callable[[DemoResult], None] | None = None
) -> DemoResult:
    """Run the demo market under ``work`` (a temp dir if None); returns the outcome."""
    owned = work is None
    root = Path(tempfile.mkdtemp(prefix="cx-demo-")) if work is None else work
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o711)  # containers run under a mapped uid and must traverse it
    try:
        return await _run(root, on_change or (lambda _: None))
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)


async def _run(root: Path, on_change: Callable[[DemoResult], None]) -> DemoResult:
    result = DemoResult()
    layout = root / "image"
    build_rootfs(layout)
    providers: dict[bytes, _Provider] = {}
    for name, offer in _providers_offers():
        executor = Executor(
            ExecutorConfig(
                store_root=root / name / "store",
                work_root=root / name / "work",
                capacity=offer.capacity,
            )
        )
        result.image = import_image(executor.store, layout).manifest
        trader = Trader(PrivateKey.from_seed(new_nonce(32)))
        providers[trader.me.raw] = _Provider(name, trader, executor, offer)
    buyers = {name: Trader(PrivateKey.from_seed(new_nonce(32))) for name in ("alice", "bob")}
    names = {p.trader.me.raw: p.name for p in providers.values()}
    names |= {t.me.raw: n for n, t in buyers.items()}

    # Providers gossip offers; every node admits every order into its own book.
    everyone = [*buyers.values(), *(p.trader for p in providers.values())]
    for provider in providers.values():
        order, _ = provider.trader.post(
            provider.offer, nonce=new_nonce(), now_ms=now_ms(), ttl_ms=HOUR_MS
        )
        for node in everyone:
            if node is not provider.trader:
                node.receive_order(order.wire, now_ms=now_ms())

    async with trio.open_nursery() as nursery:
        for job_name, buyer_name, bid in _workload(result.image):
            line = JobLine(job_name, buyer_name)
            result.jobs.append(line)
            buyer = buyers[buyer_name]
            order, matches = buyer.post(bid, nonce=new_nonce(), now_ms=now_ms(), ttl_ms=HOUR_MS)
            for node in everyone:
                if node is not buyer:
                    node.receive_order(order.wire, now_ms=now_ms())
            agreement = _negotiate(buyer, providers, order.id, matches)
            if agreement is None:
                line.why = buyer.book.explain(bid, now_ms=now_ms(), reputation=buyer.reputation)
                line.state = "unmatched"
                on_change(result)
                continue
            provider = providers[agreement.terms.provider]
            line.provider = provider.name
            nursery.start_soon(_execute, buyer, provider, agreement, line, result, on_change)
            on_change(result)

    result.ledgers = {
        name: {
            (e.agreement_id.hex(), names[e.payer], names[e.payee], e.amount)
            for e in node.ledger.entries
        }
        for name, node in [*buyers.items(), *((p.name, p.trader) for p in providers.values())]
    }
    on_change(result)
    return result


def _negotiate(
    buyer: Trader, providers: dict[bytes, _Provider], bid_id: MessageId, matches: list[Match]
) -> Agreement | None:
    """Propose to each candidate in turn until one agrees."""
    while matches:
        [match] = matches
        provider = providers[match.provider].trader
        proposal = buyer.propose(
            match, nonce=new_nonce(), attestation_nonce=new_nonce(32), now_ms=now_ms()
        )
        provider.receive_proposal(proposal.wire, now_ms=now_ms())
        reply = provider.accept(proposal.id, evidence=None, nonce=new_nonce(), now_ms=now_ms())
        buyer.receive_reply(reply.wire, now_ms=now_ms())
        if isinstance(reply.payload, Accept):
            agreement = buyer.agree(proposal.id)
            provider.receive_agreement(agreement.to_wire())
            return agreement
        matches = buyer.next_match(bid_id, now_ms=now_ms())
    return None


async def _execute(
    buyer: Trader,
    provider: _Provider,
    agreement: Agreement,
    line: JobLine,
    result: DemoResult,
    on_change: Callable[[DemoResult], None],
) -> None:
    """Provider side of one job, with the buyer following each signed status."""
    seller = provider.trader

    def tell(state: JobState) -> None:
        status = seller.status(agreement.id, state, nonce=new_nonce(), now_ms=now_ms())
        buyer.receive_status(status.wire, now_ms=now_ms())
        line.state = state.value
        on_change(result)

    tell(JobState.TRANSFERRING)  # the image is already in the provider's store
    tell(JobState.RUNNING)
    terms = agreement.terms
    done = await provider.executor.run_job(
        terms.job, terms.resources, job_id=agreement.id.hex()[:16]
    )
    receipt = seller.issue_receipt(
        agreement.id,
        usage=done.usage,
        exit_reason=done.exit_reason,
        exit_code=done.exit_code,
        outputs=done.outputs,
        checkpoint=done.checkpoint,
        nonce=new_nonce(),
        now_ms=now_ms(),
    )
    countersigned = buyer.receive_receipt(receipt.wire, now_ms=now_ms())
    seller.receive_countersigned(countersigned.to_wire())
    line.state = seller.jobs[agreement.id].state.value
    line.exit_reason = done.exit_reason.value
    line.wall_ms = done.usage.wall_ms
    line.cpu_us = done.usage.cpu_us
    line.cost = receipt.payload.cost
    line.outputs = len(done.outputs)
    on_change(result)
