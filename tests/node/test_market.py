"""The market of whole nodes (node/peer.py) over the in-memory network, with real containers.

Every node is a real ``serve_peer`` on its own home (SQLite, store, executor running crun
or runc); only the network is node/net/memnet.py, so a node can be stopped as abruptly as a
crash (its task tree is cancelled and it leaves the hub) and restarted on the same home.
No sleeps to synchronise: tests wait for a job's state with ``Peer.wait`` or poll what a
node can be seen to hold (its database, its book), each bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from executor_support import searchable_dir

from node.api.server import ApiError
from node.clock import new_nonce, now_ms
from node.net.memnet import MemoryHub, serve_memory_network
from node.net.wire import OFFERS_TOPIC
from node.peer import Peer, serve_peer
from node.storage.home import Home, NodeConfig, ProviderConfig, init_home
from node.storage.image import busybox_entries, import_image, write_layout
from node.storage.store import BlobStore
from protocol.envelope import Signed, domain_of, open_signed, seal
from protocol.errors import Reason
from protocol.identity import PrivateKey
from protocol.messages import Arch, ExitReason, Offer, Prices, Resources
from protocol.negotiation import Agreement

pytestmark = pytest.mark.integration

BOUND = 30  # seconds: generous for a loaded CI machine, never a timing assertion
MiB = 1 << 20
PRICE = 90_000_000  # micro-credits per core-hour, the usual provider's
MEM_PRICE = 9_000_000


@pytest.fixture(scope="module")
def image_layout() -> Iterator[Path]:
    """A busybox OCI layout, imported into each buyer's store by :meth:`Cluster.buyer`."""
    root = searchable_dir("cx-market-image-")
    write_layout(root / "layout", [busybox_entries()])
    yield root / "layout"
    shutil.rmtree(root, ignore_errors=True)


@dataclass
class Node:
    name: str
    home: Home
    peer: Peer
    scope: trio.CancelScope
    gone: trio.Event

    @property
    def addr(self) -> str:
        return self.peer.net.listen_addrs[0]

    @property
    def peer_id(self) -> str:
        return self.peer.net.peer_id

    async def stop(self) -> None:
        """Stop the node abruptly, as a crash would: its tasks are cancelled mid-step."""
        self.scope.cancel()
        with trio.fail_after(BOUND):
            await self.gone.wait()


class Cluster:
    def __init__(self, nursery: trio.Nursery, root: Path, image_layout: Path) -> None:
        self.nursery = nursery
        self.root = root
        self.hub = MemoryHub()
        self.image_layout = image_layout
        self.image = ""

    def home(self, name: str, *, price: int | None = None, cpu_milli: int = 2000) -> Home:
        provider = None
        if price is not None:
            provider = ProviderConfig(
                capacity=Resources(
                    cpu_milli=cpu_milli, memory_bytes=1024 * MiB, disk_bytes=1024 * MiB
                ),
                prices=Prices(cpu_core_hour=price, memory_gib_hour=MEM_PRICE),
                arch=Arch.AMD64,
            )
        return init_home(self.root / name, NodeConfig(provider=provider))

    async def start(self, home: Home) -> Node:
        """Run ``serve_peer`` on ``home`` with its own memory peer; returns once it serves."""
        gone = trio.Event()

        async def run(task_status: Any) -> None:
            try:
                with trio.CancelScope() as scope:
                    async with trio.open_nursery() as inner:
                        net = await inner.start(serve_memory_network, self.hub, home.key().peer_id)
                        peer = await inner.start(
                            functools.partial(serve_peer, home, network=net, api=False)
                        )
                        task_status.started((peer, scope))
            finally:
                gone.set()

        peer, scope = await self.nursery.start(run)
        return Node(home.root.name, home, peer, scope, gone)

    async def provider(self, name: str, price: int = PRICE, **kw: Any) -> Node:
        return await self.start(self.home(name, price=price, **kw))

    async def buyer(self, name: str) -> Node:
        home = self.home(name)
        self.image = import_image(BlobStore(home.store_root), self.image_layout).manifest
        return await self.start(home)


@contextlib.asynccontextmanager
async def cluster(image_layout: Path) -> AsyncIterator[Cluster]:
    root = searchable_dir("cx-market-")
    try:
        async with trio.open_nursery() as nursery:
            yield Cluster(nursery, root, image_layout)
            nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def job_request(
    image: str, script: str, *, price: int = 100_000_000, **fields: Any
) -> dict[str, Any]:
    return {
        "image": image,
        "command": ["sh", "-c", script],
        "max_prices": {"cpu_core_hour": price, "memory_gib_hour": 10_000_000},
        "cpu_milli": 500,
        "memory_bytes": 64 * MiB,
        "wall_ms": 60_000,
        **fields,
    }


async def until(what: Callable[[], Any]) -> Any:
    """Poll observable state (a database, a book) until ``what()`` is truthy; bounded.

    For what no node signals: a provider settles, or a peer takes gossip, on its own time.
    """
    with trio.fail_after(BOUND):
        while not (value := what()):  # noqa: ASYNC110 - no event to wait on; bounded poll
            await trio.sleep(0.01)
        return value


async def state(node: Node, job_id: str, wanted: str) -> dict[str, Any]:
    """Wait until the job has reached ``wanted`` (woken by the buyer on every state
    change; its event log, so a state already left counts); returns the job as it is."""
    with trio.fail_after(BOUND):
        while wanted not in {e["state"] for e in node.peer.db.events(job_id)}:
            await node.peer.buyer.changed.wait()
        return node.peer.job(job_id)


async def finished(node: Node, job_id: str) -> dict[str, Any]:
    """Wait for the job to end; on timeout, fail with its events so far."""
    try:
        with trio.fail_after(BOUND):
            return await node.peer.wait(job_id)
    except trio.TooSlowError:
        pytest.fail("job never ended:\n" + "\n".join(events(node, job_id)))


def same_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A ledger entry as both parties hold it (the role and settling time are local)."""
    return {k: v for k, v in entry.items() if k not in ("role", "at_ms")}


def events(node: Node, job_id: str) -> list[str]:
    return [f"{e['state']}: {e['detail']}" for e in node.peer.db.events(job_id)]


# -- discovery and the happy path --------------------------------------------------------


async def test_buyer_runs_a_job_on_a_provider_it_learned_of_through_a_third_node(
    image_layout: Path, tmp_path: Path
) -> None:
    """A provider and a buyer that each joined only a bootstrap node find each other: the
    job runs, its outputs and logs come back, and both ledgers hold the same entry."""
    async with cluster(image_layout) as c:
        hub = await c.start(c.home("bootstrap"))
        provider = await c.provider("provider")
        buyer = await c.buyer("buyer")
        await provider.peer.join(hub.addr)
        await buyer.peer.join(hub.addr)
        # The hub's hello told the buyer where the provider is; the offer came by gossip.
        assert provider.peer_id in {p["peer_id"] for p in buyer.peer.peers()}

        job = await buyer.peer.submit(
            job_request(c.image, "echo hello > /out/greeting; echo to-stdout; echo oops >&2")
        )
        done = await finished(buyer, job["id"])
        assert done["state"] == "succeeded", "\n".join(events(buyer, job["id"]))
        assert done["provider"] == provider.peer_id
        assert done["exit_code"] == 0

        written = await buyer.peer.outputs(job["id"], str(tmp_path / "out"))
        assert [w["path"] for w in written] == ["/out/greeting"]
        assert (tmp_path / "out" / "greeting").read_text() == "hello\n"
        assert await buyer.peer.logs(job["id"]) == {"stdout": "to-stdout\n", "stderr": "oops\n"}

        # The provider settles when the countersigned receipt answers its delivery.
        await until(lambda: provider.peer.ledger()["entries"])
        bought, sold = buyer.peer.ledger(), provider.peer.ledger()
        assert len(bought["entries"]) == 1
        assert [same_entry(e) for e in bought["entries"]] == [
            same_entry(e) for e in sold["entries"]
        ]
        assert bought["entries"][0]["amount"] == done["cost"] > 0
        assert bought["balance"] + sold["balance"] == 0
        assert hub.peer.ledger() == {"balance": 0, "entries": []}


# -- choosing a provider -----------------------------------------------------------------


async def test_an_unreachable_cheapest_provider_is_passed_over_for_the_next(
    image_layout: Path,
) -> None:
    """The cheapest offer wins, but when its provider cannot be reached the buyer proposes
    to the next candidate; the job's events show the failed proposal."""
    async with cluster(image_layout) as c:
        cheap = await c.provider("cheap", price=80_000_000)
        dear = await c.provider("dear", price=PRICE)
        buyer = await c.buyer("buyer")
        await buyer.peer.join(cheap.addr)
        await buyer.peer.join(dear.addr)
        await until(lambda: buyer.peer.market()["offers"] == 2)
        await cheap.stop()  # gone without a word: its offer still rests in the buyer's book

        job = await buyer.peer.submit(job_request(c.image, "echo ok"))
        done = await finished(buyer, job["id"])
        assert done["state"] == "succeeded", "\n".join(events(buyer, job["id"]))
        assert done["provider"] == dear.peer_id
        assert done["price"]["cpu_core_hour"] == PRICE
        log = events(buyer, job["id"])
        tried = [e for e in log if e.startswith("negotiating: proposing to")]
        assert tried == [
            f"negotiating: proposing to {cheap.peer_id}",
            f"negotiating: proposing to {dear.peer_id}",
        ]
        assert any(e.startswith(f"negotiating: {cheap.peer_id} did not agree") for e in log)


async def test_a_provider_with_no_room_left_rejects_and_the_next_one_runs_the_job(
    image_layout: Path,
) -> None:
    """A provider whose capacity another buyer's job holds rejects the proposal (the buyer's
    book cannot know); the buyer takes the next offer."""
    async with cluster(image_layout) as c:
        cheap = await c.provider("cheap", price=80_000_000, cpu_milli=500)
        dear = await c.provider("dear", price=PRICE)
        first, second = await c.buyer("first"), await c.buyer("second")
        for buyer in (first, second):
            await buyer.peer.join(cheap.addr)
            await buyer.peer.join(dear.addr)
            await until(lambda b=buyer: b.peer.market()["offers"] == 2)  # type: ignore[misc]

        busy = await first.peer.submit(job_request(c.image, "sleep 30"))
        assert (await state(first, busy["id"], "running"))["provider"] == cheap.peer_id

        job = await second.peer.submit(job_request(c.image, "echo ok"))
        done = await finished(second, job["id"])
        assert done["state"] == "succeeded", "\n".join(events(second, job["id"]))
        assert done["provider"] == dear.peer_id
        assert f"negotiating: {cheap.peer_id} rejected: no-capacity" in " | ".join(
            events(second, job["id"])
        )


async def test_a_standing_bid_waits_with_a_reason_then_matches_a_provider_that_joins_later(
    image_layout: Path,
) -> None:
    """A bid no offer fits waits, and ``why`` says which constraint rules each offer out;
    when a provider that fits joins the network later, the bid trades with it."""
    async with cluster(image_layout) as c:
        hub = await c.start(c.home("bootstrap"))
        dear = await c.provider("dear", price=PRICE)
        buyer = await c.buyer("buyer")
        await dear.peer.join(hub.addr)
        await buyer.peer.join(hub.addr)

        limit = 50_000_000
        job = await buyer.peer.submit(job_request(c.image, "echo ok", price=limit))
        assert job["state"] == "waiting"
        why = buyer.peer.why(job["id"])
        assert why["state"] == "waiting"
        assert (why["offers_seen"], why["matching"]) == (1, 0)
        assert why["ruled_out"]["price"] == 1
        assert sum(why["ruled_out"].values()) == 1
        assert why["best_price"] > why["limit"]
        assert "price ruled out 1" in why["explanation"]

        cheap = await c.provider("cheap", price=40_000_000)
        await cheap.peer.join(hub.addr)
        done = await finished(buyer, job["id"])
        assert done["state"] == "succeeded", "\n".join(events(buyer, job["id"]))
        assert done["provider"] == cheap.peer_id
        # The bid rested and the offer came to it: the trade is at the bid's own limit.
        assert done["price"]["cpu_core_hour"] == limit
        assert buyer.peer.why(job["id"])["explanation"].startswith("the job is succeeded")


# -- faults and restarts -----------------------------------------------------------------


def ledger_entries(node: Node) -> Callable[[], list[dict[str, Any]]]:
    return lambda: node.peer.ledger()["entries"]


async def test_a_provider_that_vanishes_mid_job_is_paid_nothing_and_the_job_runs_elsewhere(
    image_layout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Missed heartbeats make the provider at fault: the job is bid again and runs on
    another provider, and the vanished one is paid nothing, also when it comes back and
    reports the interrupted job."""
    monkeypatch.setattr("node.market.buyer.HEARTBEAT_S", 0.1)
    async with cluster(image_layout) as c:
        cheap = await c.provider("cheap", price=80_000_000)
        dear = await c.provider("dear", price=PRICE)
        buyer = await c.buyer("buyer")
        await buyer.peer.join(cheap.addr)
        await buyer.peer.join(dear.addr)
        await until(lambda: buyer.peer.market()["offers"] == 2)

        job = await buyer.peer.submit(job_request(c.image, "sleep 2; echo done > /out/done"))
        assert (await state(buyer, job["id"], "running"))["provider"] == cheap.peer_id
        await cheap.stop()

        done = await finished(buyer, job["id"])
        log = events(buyer, job["id"])
        assert done["state"] == "succeeded", "\n".join(log)
        assert done["provider"] == dear.peer_id
        assert done["attempts"] == 2
        assert f"provider-fault: {cheap.peer_id} stopped answering heartbeats" in log
        assert [o["path"] for o in done["outputs"]] == ["/out/done"]
        payees = [e["payee"] for e in buyer.peer.ledger()["entries"]]
        assert payees == [dear.peer_id]
        await until(ledger_entries(dear))
        assert buyer.peer.ledger()["balance"] + dear.peer.ledger()["balance"] == 0

        # Back from the dead, it owns up with a provider-fault receipt: settled at zero, late.
        cheap = await c.start(cheap.home)
        paid = await until(
            lambda: [e for e in ledger_entries(buyer)() if e["payee"] == cheap.peer_id]
        )
        assert [e["amount"] for e in paid] == [0]
        assert buyer.peer.ledger()["balance"] == -done["cost"]
        assert buyer.peer.job(job["id"])["state"] == "succeeded"
        assert buyer.peer.job(job["id"])["attempts"] == 2
        assert events(buyer, job["id"])[-1] == "succeeded: late receipt settled: paid 0"


async def test_a_restarted_provider_reports_the_interrupted_job_as_its_fault_and_is_paid_nothing(
    image_layout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider restarted on its home after a crash does not run the interrupted job
    again: it signs a provider-fault receipt, the buyer settles it at zero and bids again."""
    monkeypatch.setattr("node.market.buyer.HEARTBEAT_S", 60.0)  # the receipt, not silence, decides
    async with cluster(image_layout) as c:
        provider = await c.provider("provider")
        buyer = await c.buyer("buyer")
        await buyer.peer.join(provider.addr)

        job = await buyer.peer.submit(job_request(c.image, "sleep 2; echo done > /out/done"))
        await state(buyer, job["id"], "running")
        first = buyer.peer.db.job(job["id"]).agreement_id
        await provider.stop()

        provider = await c.start(provider.home)
        await provider.peer.join(buyer.addr)
        done = await finished(buyer, job["id"])
        log = events(buyer, job["id"])
        assert done["state"] == "succeeded", "\n".join(log)
        assert done["attempts"] == 2
        assert "provider-fault: exit -1 (provider-fault)" in log
        assert log.index("settled: receipt countersigned: paid 0") < log.index(
            "provider-fault: exit -1 (provider-fault)"
        )

        await until(lambda: len(provider.peer.ledger()["entries"]) == 2)
        entries = buyer.peer.ledger()["entries"]
        assert (entries[0]["agreement_id"], entries[0]["amount"]) == (first.hex(), 0)
        assert entries[1]["amount"] == done["cost"] > 0
        # The interrupted agreement ran once, and was never started again after the restart.
        db = provider.peer.db
        interrupted = db.agreement(first)
        assert interrupted is not None
        assert interrupted.state == "settled"
        receipt = open_signed(db.receipt(first)[0]).payload
        assert receipt.exit_reason is ExitReason.PROVIDER_FAULT
        assert receipt.usage.wall_ms == 0
        assert receipt.cost == 0
        ran = [a for a in db.agreements() if a.started_ms is not None]
        assert len(ran) == 2
        assert ran[0].id == first
        # The second run was sold on the restarted node's new offer, not the one it replaced
        # (which peers still hold and handed back to it when it rejoined).
        second = Agreement.from_wire(ran[1].wire)
        assert provider.peer.provider is not None
        assert provider.peer.provider.offer is not None
        assert second.terms.offer_id == provider.peer.provider.offer.id


async def test_a_restarted_buyer_follows_its_job_to_the_end_and_settles_it_once(
    image_layout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A buyer that crashed while its job runs resumes from its database: the status whose
    answer the crash cut off comes again and changes nothing, the receipt the provider kept
    in its outbox is taken and settled once, and the ledger survives a further restart."""
    monkeypatch.setattr("node.market.provider.RETRY_S", 0.1)
    async with cluster(image_layout) as c:
        provider = await c.provider("provider")
        buyer = await c.buyer("buyer")
        await buyer.peer.join(provider.addr)

        # The crash: right after the buyer commits the provider's "running" status, before
        # its answer leaves, so the provider's outbox will deliver that status again.
        commit = buyer.peer.db.add_event

        def crash_once_running_is_stored(job_id: str, at_ms: int, state: str, detail: str) -> int:
            seq = commit(job_id, at_ms, state, detail)
            if state == "running":
                buyer.scope.cancel()
            return seq

        buyer.peer.db.add_event = crash_once_running_is_stored  # type: ignore[method-assign]
        job = await buyer.peer.submit(job_request(c.image, "sleep 1; echo done > /out/done"))
        with trio.fail_after(BOUND):
            await buyer.gone.wait()

        buyer = await c.start(buyer.home)
        assert buyer.peer.job(job["id"])["state"] == "running", events(buyer, job["id"])
        done = await finished(buyer, job["id"])
        assert done["state"] == "succeeded", "\n".join(events(buyer, job["id"]))
        assert events(buyer, job["id"]).count("running: container started") == 1
        assert done["attempts"] == 1
        assert [o["path"] for o in done["outputs"]] == ["/out/done"]
        ledger = buyer.peer.ledger()
        assert [e["amount"] for e in ledger["entries"]] == [done["cost"]]
        await until(ledger_entries(provider))
        assert provider.peer.ledger()["balance"] == -ledger["balance"] > 0

        seen = events(buyer, job["id"])
        await buyer.stop()
        buyer = await c.start(buyer.home)
        assert buyer.peer.ledger() == ledger
        assert buyer.peer.job(job["id"]) == done
        assert events(buyer, job["id"]) == seen


# -- gossip --------------------------------------------------------------------------------


def signed_offer(key: PrivateKey, *, issued_ms: int, ttl_ms: int = 3_600_000) -> Signed[Offer]:
    offer = Offer(
        capacity=Resources(cpu_milli=1000, memory_bytes=512 * MiB),
        prices=Prices(cpu_core_hour=PRICE, memory_gib_hour=MEM_PRICE),
        arch=Arch.AMD64,
    )
    return seal(key, offer, nonce=new_nonce(), issued_ms=issued_ms, expires_ms=issued_ms + ttl_ms)


async def test_forged_gossip_is_rejected_and_not_forwarded_and_expired_gossip_is_ignored(
    image_layout: Path,
) -> None:
    """The topic validator admits orders before they are forwarded: a bad signature or a
    signature under another message type's domain is rejected (counted, and the forwarder
    loses score); an expired order is dropped without blame; neither reaches the node
    beyond, while a valid order does."""
    async with cluster(image_layout) as c:
        middle = await c.start(c.home("middle"))
        far = await c.start(c.home("far"))
        await far.peer.join(middle.addr)
        # A bare network peer that speaks gossip only, linked to the middle node alone.
        forger_key = PrivateKey.from_seed(b"\x07" * 32)
        forger = await c.nursery.start(serve_memory_network, c.hub, forger_key.peer_id)
        await forger.connect(middle.addr)
        with trio.fail_after(BOUND):
            await forger.wait_subscribed(middle.peer_id, OFFERS_TOPIC)

        now = now_ms()
        expired = signed_offer(forger_key, issued_ms=now - 7_200_000)
        await forger.publish(OFFERS_TOPIC, expired.wire)
        assert middle.peer.market()["rejected_gossip"] == {}
        assert middle.peer.net.score(forger.peer_id) == 0

        tampered = signed_offer(forger_key, issued_ms=now).wire
        tampered = bytes([tampered[0] ^ 1]) + tampered[1:]
        body = signed_offer(forger_key, issued_ms=now).body
        wrong_domain = forger_key.sign(domain_of("bid"), body) + body
        for forged in (tampered, wrong_domain):
            await forger.publish(OFFERS_TOPIC, forged)
        assert middle.peer.market()["rejected_gossip"] == {Reason.BAD_SIGNATURE.value: 2}
        assert middle.peer.net.score(forger.peer_id) < 0

        valid = signed_offer(forger_key, issued_ms=now)
        await forger.publish(OFFERS_TOPIC, valid.wire)
        await until(lambda: far.peer.market()["offers"] == 1)
        for node in (middle, far):
            book = node.peer.market()
            assert book["offers"] == 1, node.name  # only the valid one
        assert far.peer.market()["rejected_gossip"] == {}  # it never saw the forgeries
        assert far.peer.net.score(middle.peer_id) == 0


# -- cancelling and preempting ---------------------------------------------------------------


async def test_a_cancelled_waiting_job_withdraws_its_bid_from_every_book(
    image_layout: Path,
) -> None:
    """Cancelling a waiting job gossips a Cancel: its bid leaves the other nodes' books, and
    an offer that would have fitted it later starts no negotiation."""
    async with cluster(image_layout) as c:
        hub = await c.start(c.home("bootstrap"))
        dear = await c.provider("dear", price=PRICE)
        buyer = await c.buyer("buyer")
        await dear.peer.join(hub.addr)
        await buyer.peer.join(hub.addr)

        job = await buyer.peer.submit(job_request(c.image, "echo ok", price=50_000_000))
        for node in (hub, dear, buyer):
            await until(lambda n=node: n.peer.market()["bids"] == 1)  # type: ignore[misc]

        cancelled = await buyer.peer.cancel(job["id"])
        assert cancelled["state"] == "cancelled"
        for node in (hub, dear, buyer):
            await until(lambda n=node: n.peer.market()["bids"] == 0)  # type: ignore[misc]
        with pytest.raises(ApiError) as refused:
            await buyer.peer.cancel(job["id"])
        assert refused.value.code == "too-late"

        seen = events(buyer, job["id"])
        cheap = await c.provider("cheap", price=40_000_000)
        await cheap.peer.join(hub.addr)
        await until(lambda: buyer.peer.market()["offers"] == 2)
        await trio.testing.wait_all_tasks_blocked()
        assert events(buyer, job["id"]) == seen
        assert buyer.peer.job(job["id"])["state"] == "cancelled"


async def test_a_better_paying_bid_preempts_a_cheap_preemptible_job_which_is_bid_again(
    image_layout: Path,
) -> None:
    """A full provider makes room for a proposal that pays more by preempting a cheaper
    preemptible job; the preempted job's buyer settles the run and bids again by itself."""
    async with cluster(image_layout) as c:
        provider = await c.provider("provider", price=PRICE, cpu_milli=500)
        thrifty, eager = await c.buyer("thrifty"), await c.buyer("eager")
        await thrifty.peer.join(provider.addr)
        cheap = await thrifty.peer.submit(
            job_request(c.image, "sleep 30", price=100_000_000, preemptible=True)
        )
        assert (await state(thrifty, cheap["id"], "running"))["price"]["cpu_core_hour"] == PRICE

        # The eager bid rests first, so it trades at its own (higher) limit once it sees the
        # offer; the provider's book shows no room, so it must preempt to accept.
        urgent = await eager.peer.submit(job_request(c.image, "sleep 30", price=200_000_000))
        await eager.peer.join(provider.addr)
        running = await state(eager, urgent["id"], "running")
        assert running["provider"] == provider.peer_id
        assert running["price"]["cpu_core_hour"] == 200_000_000

        with trio.fail_after(BOUND):
            while "waiting: no provider agreed yet" not in " | ".join(events(thrifty, cheap["id"])):
                await thrifty.peer.buyer.changed.wait()
        log = events(thrifty, cheap["id"])
        assert any(e.startswith("preempted: ") for e in log), log
        assert log.index("waiting: bidding again") > max(
            i for i, e in enumerate(log) if e.startswith("preempted: ")
        )
        assert f"negotiating: {provider.peer_id} rejected: no-capacity" in " | ".join(log)
        after = thrifty.peer.job(cheap["id"])
        assert after["state"] == "waiting"
        assert after["exit_reason"] == "preempted"
        assert [e["payee"] for e in thrifty.peer.ledger()["entries"]] == [provider.peer_id]
