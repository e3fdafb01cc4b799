"""End to end: real `cx node` processes, real libp2p, real containers, real swtpm.

The nodes are separate processes driven through their control API (node/testnet.py); a
test waits on a job's event stream (the API's long poll), never on a clock.
"""

from __future__ import annotations

import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from executor_support import searchable_dir

from node.api.client import ApiClient
from node.storage.image import host_arch
from node.testnet import Conditions, Testnet
from node.testnet.wan import Impairment
from node.workload import SCENARIOS, WORKLOAD, JobPlan

pytestmark = pytest.mark.integration

WAIT_S = 60.0
T = TypeVar("T")


def wait_for(
    client: ApiClient, job_id: str, done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Follow the job's events until ``done(event)`` holds for one; that event."""
    after = 0
    seen: list[str] = []
    for _ in range(200):
        events = client.events(job_id, after=after, wait_s=WAIT_S)
        if not events:
            break
        for event in events:
            seen.append(event["state"])
            if done(event):
                return event
        after = events[-1]["seq"]
    raise AssertionError(f"job {job_id} never got there; its states: {seen}")


def eventually(probe: Callable[[], T]) -> T:
    """``probe()``'s first truthy value, asking every 50 ms for up to WAIT_S: for state
    another process reaches on its own, with no event to wait on."""
    deadline = time.monotonic() + WAIT_S
    while not (value := probe()):
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.05)
    return value


def signed_summaries(db_path: Path) -> int:
    """How many receipt summaries the node's database holds with both signatures."""
    with sqlite3.connect(db_path) as db:
        query = (
            "SELECT count(*) FROM summaries WHERE payer_sig IS NOT NULL AND payee_sig IS NOT NULL"
        )
        (count,) = db.execute(query).fetchone()
    return int(count)


@pytest.fixture
def root() -> Iterator[Path]:
    """A directory the containers' mapped uid can traverse. Not under pytest's tmp_path:
    pytest makes its base directory 0700 again whenever another session starts."""
    path = searchable_dir("cx-testnet-test-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def testnet(root: Path) -> Iterator[Testnet]:
    net = Testnet(providers=2, buyers=1, work=root, tpm=False)
    try:
        yield net
    finally:
        net.stop()


def test_default_workload_settles_everywhere(root: Path) -> None:
    """The README's demo: every job reaches its planned outcome, the attested one through a
    TPM quote from a provider's swtpm, and every ledger agrees."""
    with Testnet(3, 2, work=root) as net:
        net.start()
        verdict = net.run(timeout_s=90)
        # Each receipt's summary, signed by both parties, reached every node over libp2p.
        for node in net.nodes:
            eventually(lambda node=node: signed_summaries(node.home.db_path) == 6)
    assert verdict.problems == []
    states = {v["plan"]: v["state"] for v in verdict.jobs}
    assert states["attested"] == "succeeded"
    assert states["fails"] == "failed"
    assert sum(ledger["balance"] for ledger in verdict.ledgers.values()) == 0
    paid = [e for ledger in verdict.ledgers.values() for e in ledger["entries"]]
    assert len(paid) == 2 * 6  # six settled jobs, each in its buyer's and provider's ledger


def test_surge_prices_rise_with_demand_and_fall_after(root: Path) -> None:
    """``cx testnet --scenario surge``: sixteen jobs at once on two providers' four cores,
    between two quiet phases. Every job settles; the tape every node keeps shows the CPU
    price rising above the quiet phases' during the surge and falling back after it."""
    with Testnet(2, 2, work=root, scenario=SCENARIOS["surge"]) as net:
        net.start()
        verdict = net.run(timeout_s=240)
        # cx market history --json against a running node: candles from its tape
        history = net.providers[0].api().history(interval_ms=3_600_000)
        candles = [k for c in history["classes"] for k in c["candles"]]
        assert sum(k["trades"] for k in candles) == 20
        assert max(k["high"] for k in candles) > min(k["low"] for k in candles)
    assert verdict.problems == []  # includes the scenario's own check of the prices
    assert {v["state"] for v in verdict.jobs} == {"succeeded"}
    prices = [t["cpu_core_hour"] for t in verdict.trades]
    assert len(prices) == len(verdict.jobs) == 20
    assert prices[0] == 50_000_000  # quiet, empty providers: at the floor
    assert max(prices) > 50_000_000
    assert {t["class"] for t in verdict.trades} == {
        f"{host_arch()}/cpu/eu",
        f"{host_arch()}/cpu/us",
    }


def test_provider_killed_mid_job_is_replaced_and_unpaid(testnet: Testnet) -> None:
    """kill -9 of the provider running a job: the buyer notices the silence, bids again,
    the job runs on the other provider, and the dead one is never paid for it. Restarted,
    the dead provider admits the fault (a zero receipt) instead of running the job again."""
    testnet.start()
    buyer = testnet.buyers[0].api()
    job_id = testnet.submit(
        JobPlan("slow", 0, "sleep 3; echo finished > /out/done", "succeeded", cpu_milli=1000)
    )
    running = wait_for(buyer, job_id, lambda e: e["state"] == "running")
    first = buyer.job(job_id)["provider"]
    victim = next(n for n in testnet.providers if n.peer_id == first)
    testnet.kill(victim)
    assert running["state"] == "running"

    wait_for(buyer, job_id, lambda e: e["state"] == "succeeded")
    job = buyer.job(job_id)
    assert job["provider"] != first
    assert job["attempts"] == 2
    states = [e["state"] for e in buyer.events(job_id)]
    assert "provider-fault" in states
    assert not [e for e in buyer.ledger()["entries"] if e["payee"] == first and e["amount"]]

    testnet.launch(victim)  # restarted on its home after kill -9
    late = wait_for(buyer, job_id, lambda e: "late receipt" in e["detail"])
    assert late["detail"].endswith("paid 0.00 credits")  # it admitted the fault: nobody pays
    [entry] = [e for e in buyer.ledger()["entries"] if e["payee"] == first]
    assert entry["amount"] == 0
    # the provider settles once the countersignature reaches it, just after the buyer did
    [settled] = eventually(lambda: victim.api().ledger()["entries"])
    assert {**settled, "at_ms": 0} == {**entry, "role": "provider", "at_ms": 0}
    with sqlite3.connect(victim.home.db_path) as db:
        (state, started) = db.execute("SELECT state, started_ms FROM agreements").fetchone()
    assert state == "settled"
    assert started is not None  # the container had started: it was faulted, not run again


def test_buyer_killed_and_restarted_loses_nothing(testnet: Testnet) -> None:
    """kill -9 of the buyer while its job runs: restarted, it takes the receipt, the job
    succeeds once, and the ledger entry is there exactly once, on both sides, and stays
    there across another restart."""
    testnet.start()
    node = testnet.buyers[0]
    job_id = testnet.submit(JobPlan("steady", 0, "sleep 2; echo ok > /out/ok", "succeeded"))
    wait_for(node.api(), job_id, lambda e: e["state"] == "running")
    testnet.kill(node)
    testnet.launch(node)

    wait_for(node.api(), job_id, lambda e: e["state"] == "succeeded")
    job = node.api().job(job_id)
    assert job["attempts"] == 1
    [entry] = node.api().ledger()["entries"]
    provider = next(n for n in testnet.providers if n.peer_id == job["provider"])
    [settled] = eventually(lambda: provider.api().ledger()["entries"])
    assert settled["agreement_id"] == entry["agreement_id"]
    assert entry["amount"] == job["cost"] > 0

    testnet.kill(node)
    testnet.launch(node)
    assert node.api().ledger()["entries"] == [entry]
    assert node.api().logs(job_id)["stdout"] == ""


def test_netns_testnet_behind_nat_through_loss_churn_and_a_partition_loses_nothing(
    root: Path,
) -> None:
    """Issue 11's contract, with a partition besides: every node in its own namespace on an
    emulated WAN (50 ms, 1% loss), a provider and both buyers behind NAT (reachable only
    through a relay or a hole punched), a node killed and restarted, the nodes cut in two
    for 5 s. Every job settles as planned, all of them the NAT'd buyers', and every receipt
    is in both ledgers."""
    conditions = Conditions(
        netns=True,
        impairment=Impairment(latency_s=0.05, loss=0.01),
        nat=3,
        churn=0.2,
        partition_s=5.0,
        seed=1,
    )
    with Testnet(2, 2, work=root, tpm=False, conditions=conditions) as net:
        net.start()
        verdict = net.run(timeout_s=240)  # a churned provider comes back slowly under load
        behind = [n.name for n in net.nodes if n.nat]
    assert verdict.problems == []
    assert behind == ["prov-us", "buyer-a", "buyer-b"]
    assert sorted(e["event"] for e in net.events) == ["heal", "kill", "partition", "restart"]
    succeeded = {v["plan"] for v in verdict.jobs if v["state"] == "succeeded"}
    assert succeeded == {p.name for p in WORKLOAD if p.expect == "succeeded" and p.trust == "none"}


def test_a_bootstrap_provider_killed_and_restarted_is_reached_again(root: Path) -> None:
    """Issue 17 D2: kill -9 of the provider the buyer bootstrapped from, then a restart on
    its home. Both see each other again (the buyer redials its bootstrap peer), the buyer's
    book holds the restarted provider's new offer and not the old one, and a new job runs
    on it. Before: peers stayed empty on both sides and new jobs waited."""
    with Testnet(1, 1, work=root, tpm=False) as net:
        net.start()
        [provider], [buyer] = net.providers, net.buyers
        before = provider.api().node_info()["offer"]["id"]
        net.kill(provider)
        eventually(lambda: not buyer.api().peers())
        net.launch(provider)
        after = provider.api().node_info()["offer"]["id"]
        assert after != before

        eventually(lambda: [p["peer_id"] for p in buyer.api().peers()] == [provider.peer_id])
        eventually(lambda: [p["peer_id"] for p in provider.api().peers()] == [buyer.peer_id])
        eventually(lambda: buyer.api().market()["offers"] == 1)
        job_id = net.submit(JobPlan("again", 0, "echo again > /out/again", "succeeded"))
        done = wait_for(buyer.api(), job_id, lambda e: e["state"] in ("succeeded", "failed"))
        assert done["state"] == "succeeded"
        assert buyer.api().job(job_id)["provider"] == provider.peer_id
