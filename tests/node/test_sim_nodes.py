"""Simulation testing of the real node, FoundationDB's way: whole nodes (``serve_peer`` on
the in-memory network, a fake job runner) under trio's MockClock, with a seeded fault
injector (tests/node/faults.py) dropping, delaying, duplicating and reordering gossip,
failing dials and resetting streams mid-message, and a node crashed at a random moment and
restarted from its SQLite state. The market runs for half an hour of virtual time; then
its invariants are checked: every job ended or still waits with a reason, every receipt
is held alike by payer and payee, balances sum to zero, nobody paid for a provider's fault
and no job was paid for twice.

Found so far (seed 4, before the providers' invitations of issue 9 landed): a transient
fault while negotiating (a stream reset) counts as the provider refusing the bid, so with
two providers a job could wait for the next offer re-post (54 minutes) though both were
healthy. Hence a job still waiting with a reason passes here, as the issue's invariant
allows.

A failing seed prints the command that replays it:
``.venv/bin/pytest tests/node/test_sim_nodes.py -k 'seed-N'``. ``CX_SIM_SEEDS=1-200`` runs
more seeds than CI's fixed set.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

import pytest
import trio
from fake_runner import FakeRunner
from faults import FaultRates, FaultyNetwork
from market_support import PRICE, Node, cluster, job, ledger, market, same_entry, submit, until

from node.net.transport import Network, NetworkError
from node.storage.home import Home
from node.storage.store import BlobStore

T0 = 1_800_000_000_000
QUIET = FaultRates(drop=0, duplicate=0, delay_s=0, dial_failure=0, reset=0)
FAULTS = FaultRates()
JOBS_PER_BUYER = 3
RUN_S = 1800  # virtual seconds the market runs after the crash before it is judged


def seeds() -> list[int]:
    spec = os.environ.get("CX_SIM_SEEDS", "1-4")
    first, _, last = spec.partition("-")
    return list(range(int(first), int(last or first) + 1))


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.005)


async def _join(node: Node, other: Node) -> None:
    """Join through injected dial failures: retry, bounded."""
    with trio.fail_after(node.bound):
        while True:
            try:
                await node.peer.join(other.addr)
                return
            except NetworkError:
                await trio.sleep(1)


@pytest.mark.parametrize("seed", seeds(), ids=lambda s: f"seed-{s}")
async def test_a_market_under_faults_and_a_crash_keeps_its_invariants(
    seed: int, clock: trio.testing.MockClock, image_layout: Path
) -> None:
    rng = random.Random(seed)
    nets: list[FaultyNetwork] = []

    def wrap(home: Home, net: Network) -> Network:
        faulty = FaultyNetwork(net, random.Random(rng.random()), rates=QUIET)
        nets.append(faulty)
        return faulty

    def runner(home: Home) -> FakeRunner:
        return FakeRunner(BlobStore(home.store_root))

    async with cluster(image_layout, epoch_ms=T0, runner=runner, wrap=wrap) as c:
        nodes = {f"p{i}": await c.provider(f"p{i}", price=PRICE + i) for i in range(2)}
        nodes |= {f"b{i}": await c.buyer(f"b{i}") for i in range(2)}
        buyers, providers = ["b0", "b1"], ["p0", "p1"]
        for b in buyers:
            for p in providers:
                await _join(nodes[b], nodes[p])
        await until(lambda: all(market(nodes[b])["offers"] == 2 for b in buyers), *nodes.values())
        for net in nets:
            net.rates = FAULTS

        jobs = [
            (b, (await submit(nodes[b], c.image, f"sleep {rng.randint(5, 90)}"))["id"])
            for b in buyers
            for _ in range(JOBS_PER_BUYER)
        ]
        await trio.sleep(rng.uniform(1, 60))
        victim = rng.choice(sorted(nodes))
        await nodes[victim].stop()
        await trio.sleep(rng.uniform(0, 20))
        nodes[victim] = await c.start(nodes[victim].home)
        nets[-1].rates = FAULTS
        for name, other in sorted(nodes.items()):
            if name != victim and (name in buyers) != (victim in buyers):
                await _join(nodes[victim], other)

        # run the market on for a while in virtual time, then judge it as it stands
        await trio.sleep(RUN_S)
        done = {job_id: job(nodes[b], job_id) for b, job_id in jobs}
        replay = f"replay: .venv/bin/pytest tests/node/test_sim_nodes.py -k 'seed-{seed}'"
        # countersignatures still in an outbox arrive: every receipt ends up held by payer
        # and payee alike (bounded: a receipt that never arrives fails here)
        try:
            await until(lambda: _held_alike(nodes), *nodes.values())
        except trio.TooSlowError:
            pytest.fail(f"receipts not held alike: {_held(nodes)}; {replay}")
        _check(nodes, buyers, jobs, done, replay)


def _held(nodes) -> dict[str, list[dict]]:
    held: dict[str, list[dict]] = {}
    for node in nodes.values():
        for entry in ledger(node)["entries"]:
            held.setdefault(entry["agreement_id"], []).append(same_entry(entry))
    return held


def _held_alike(nodes) -> bool:
    return all(len(c) == 2 and c[0] == c[1] for c in _held(nodes).values())


def _check(nodes, buyers, jobs, done, replay) -> None:
    # every job ended, or its bid still waits and says why
    for job_id, row in done.items():
        ended = row["state"] in ("succeeded", "failed", "error")
        assert ended or (row["state"] == "waiting" and row["detail"]), (job_id, row, replay)
    assert sum(ledger(node)["balance"] for node in nodes.values()) == 0, replay
    for b in buyers:
        mine = [job_id for owner, job_id in jobs if owner == b]
        paid = [e["amount"] for e in ledger(nodes[b])["entries"] if e["amount"] > 0]
        costs = [done[j]["cost"] for j in mine if done[j]["cost"]]
        # nobody paid for a provider's fault, and no job was paid for twice
        assert sorted(paid) == sorted(costs), replay
        ran = Counter(done[j]["state"] for j in mine)
        assert ran["succeeded"] == len(costs), replay
