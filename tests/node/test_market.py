"""The market of whole nodes (node/peer.py) over the in-memory network, with real containers.

Every node is a real ``serve_peer`` on its own home (SQLite, store, executor running crun
or runc); only the network is node/net/memnet.py, so a node can be stopped as abruptly as a
crash (its task tree is cancelled and it leaves the hub) and restarted on the same home.
No sleeps and no polls: tests wait for what a node can be seen to hold (a job's state, its
book, its ledger) by waking on the node's change events, each wait bounded by
``trio.fail_after``. Timings a test needs shorter (heartbeats, retries) are passed to the
node as a :class:`~node.clock.Timings`. The helpers (tests/node/market_support.py) answer
with the control API's JSON views, which is what a user of the node sees.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from market_support import (
    BOUND,
    MEM_PRICE,
    PRICE,
    MiB,
    Node,
    cluster,
    events,
    finished,
    gossip_peer,
    job,
    ledger,
    market,
    same_entry,
    state,
    submit,
    until,
)

from node.api import views
from node.clock import Timings
from node.net.wire import OFFERS_TOPIC
from node.peer import Conflict, PeerError
from node.storage.home import NodeConfig, init_home
from node.storage.image import import_image
from node.storage.store import BlobStore
from protocol.envelope import Signed, domain_of, open_signed, seal
from protocol.errors import Reason
from protocol.identity import PrivateKey
from protocol.messages import Arch, ExitReason, Offer, Prices, Resources
from protocol.negotiation import Agreement

pytestmark = pytest.mark.integration


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
        assert provider.peer_id in buyer.peer.net.peers()

        job_id = (
            await submit(
                buyer, c.image, "echo hello > /out/greeting; echo to-stdout; echo oops >&2"
            )
        )["id"]
        done = await finished(buyer, job_id)
        assert done["state"] == "succeeded", "\n".join(events(buyer, job_id))
        assert done["provider"] == provider.peer_id
        assert done["exit_code"] == 0

        written = await buyer.peer.outputs(job_id, tmp_path / "out")
        assert [w.path for w in written] == ["/out/greeting"]
        for nowhere in ("/proc/self", "/dev/null", "/proc/1/none"):  # issue 17 D3: were 500s
            with pytest.raises(PeerError, match="cannot write the outputs"):
                await buyer.peer.outputs(job_id, Path(nowhere))
        assert (tmp_path / "out" / "greeting").read_text() == "hello\n"
        assert await buyer.peer.logs(job_id) == {"stdout": "to-stdout\n", "stderr": "oops\n"}

        # The provider settles when the countersigned receipt answers its delivery.
        await until(lambda: ledger(provider)["entries"], provider)
        bought, sold = ledger(buyer), ledger(provider)
        assert len(bought["entries"]) == 1
        assert [same_entry(e) for e in bought["entries"]] == [
            same_entry(e) for e in sold["entries"]
        ]
        assert bought["entries"][0]["amount"] == done["cost"] > 0
        assert bought["balance"] + sold["balance"] == 0
        assert ledger(hub) == {"balance": 0, "entries": []}


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
        await until(lambda: market(buyer)["offers"] == 2, buyer)
        await cheap.stop()  # gone without a word: its offer still rests in the buyer's book

        job_id = (await submit(buyer, c.image, "echo ok"))["id"]
        done = await finished(buyer, job_id)
        assert done["state"] == "succeeded", "\n".join(events(buyer, job_id))
        assert done["provider"] == dear.peer_id
        assert done["price"]["cpu_core_hour"] == PRICE
        log = events(buyer, job_id)
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
            await until(lambda b=buyer: market(b)["offers"] == 2, buyer)  # type: ignore[misc]

        busy = await submit(first, c.image, "sleep 30")
        assert (await state(first, busy["id"], "running"))["provider"] == cheap.peer_id

        job_id = (await submit(second, c.image, "echo ok"))["id"]
        done = await finished(second, job_id)
        assert done["state"] == "succeeded", "\n".join(events(second, job_id))
        assert done["provider"] == dear.peer_id
        assert f"negotiating: {cheap.peer_id} rejected: no-capacity" in " | ".join(
            events(second, job_id)
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
        submitted = await submit(buyer, c.image, "echo ok", price=limit)
        job_id = submitted["id"]
        assert submitted["state"] == "waiting"
        why = views.why(buyer.peer.why(job_id))
        assert why["state"] == "waiting"
        assert (why["offers_seen"], why["matching"]) == (1, 0)
        assert why["ruled_out"]["price"] == 1
        assert sum(why["ruled_out"].values()) == 1
        assert why["best_price"] > why["limit"]
        assert why["explanation"] == (
            "none of 1 offers fits (price rules out 1): CPU costs at least 90.00 credits per "
            "core-hour, your limit is 50.00"
        )

        cheap = await c.provider("cheap", price=40_000_000)
        await cheap.peer.join(hub.addr)
        done = await finished(buyer, job_id)
        assert done["state"] == "succeeded", "\n".join(events(buyer, job_id))
        assert done["provider"] == cheap.peer_id
        # The bid rested and the offer came to it: still the trade is at the provider's ask.
        assert done["price"]["cpu_core_hour"] == 40_000_000
        assert buyer.peer.why(job_id).text.startswith("the job is succeeded")


# -- faults and restarts -----------------------------------------------------------------


def ledger_entries(node: Node) -> Callable[[], list[dict[str, Any]]]:
    return lambda: ledger(node)["entries"]


async def test_a_provider_that_vanishes_mid_job_is_paid_nothing_and_the_job_runs_elsewhere(
    image_layout: Path,
) -> None:
    """Missed heartbeats make the provider at fault: the job is bid again and runs on
    another provider, and the vanished one is paid nothing, also when it comes back and
    reports the interrupted job."""
    async with cluster(image_layout) as c:
        cheap = await c.provider("cheap", price=80_000_000)
        dear = await c.provider("dear", price=PRICE)
        buyer = await c.buyer("buyer", Timings(heartbeat_s=0.1))
        await buyer.peer.join(cheap.addr)
        await buyer.peer.join(dear.addr)
        await until(lambda: market(buyer)["offers"] == 2, buyer)

        job_id = (await submit(buyer, c.image, "sleep 2; echo done > /out/done"))["id"]
        assert (await state(buyer, job_id, "running"))["provider"] == cheap.peer_id
        await cheap.stop()

        done = await finished(buyer, job_id)
        log = events(buyer, job_id)
        assert done["state"] == "succeeded", "\n".join(log)
        assert done["provider"] == dear.peer_id
        assert done["attempts"] == 2
        assert f"provider-fault: {cheap.peer_id} stopped answering heartbeats" in log
        assert [o["path"] for o in done["outputs"]] == ["/out/done"]
        payees = [e["payee"] for e in ledger(buyer)["entries"]]
        assert payees == [dear.peer_id]
        await until(ledger_entries(dear), dear)
        assert ledger(buyer)["balance"] + ledger(dear)["balance"] == 0

        # Back from the dead, it owns up with a provider-fault receipt: settled at zero, late.
        cheap = await c.start(cheap.home)
        paid = await until(
            lambda: [e for e in ledger_entries(buyer)() if e["payee"] == cheap.peer_id], buyer
        )
        assert [e["amount"] for e in paid] == [0]
        assert ledger(buyer)["balance"] == -done["cost"]
        assert job(buyer, job_id)["state"] == "succeeded"
        assert job(buyer, job_id)["attempts"] == 2
        assert events(buyer, job_id)[-1] == "succeeded: late receipt settled: paid 0.00 credits"


async def test_a_restarted_provider_reports_the_interrupted_job_as_its_fault_and_is_paid_nothing(
    image_layout: Path,
) -> None:
    """A provider restarted on its home after a crash does not run the interrupted job
    again: it signs a provider-fault receipt, the buyer settles it at zero and bids again."""
    async with cluster(image_layout) as c:
        provider = await c.provider("provider")
        buyer = await c.buyer("buyer", Timings(heartbeat_s=60.0))  # the receipt decides
        await buyer.peer.join(provider.addr)

        job_id = (await submit(buyer, c.image, "sleep 2; echo done > /out/done"))["id"]
        await state(buyer, job_id, "running")
        first = buyer.peer.db.job(job_id).agreement_id
        await provider.stop()

        provider = await c.start(provider.home)
        await provider.peer.join(buyer.addr)
        done = await finished(buyer, job_id)
        log = events(buyer, job_id)
        assert done["state"] == "succeeded", "\n".join(log)
        assert done["attempts"] == 2
        # The second run's bid waited for the restarted provider's new offer, and paid its
        # ask, as the first run did; it once paid its own limit, ten times as much.
        assert done["price"]["cpu_core_hour"] == PRICE
        assert "provider-fault: exit -1 (provider-fault)" in log
        assert log.index("settled: receipt countersigned: paid 0.00 credits") < log.index(
            "provider-fault: exit -1 (provider-fault)"
        )

        await until(lambda: len(ledger(provider)["entries"]) == 2, provider)
        entries = ledger(buyer)["entries"]
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
    image_layout: Path,
) -> None:
    """A buyer that crashed while its job runs resumes from its database: the status whose
    answer the crash cut off comes again and changes nothing, the receipt the provider kept
    in its outbox is taken and settled once, and the ledger survives a further restart."""
    async with cluster(image_layout) as c:
        provider = await c.provider("provider", timings=Timings(retry_s=0.1))
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
        job_id = (await submit(buyer, c.image, "sleep 1; echo done > /out/done"))["id"]
        with trio.fail_after(BOUND):
            await buyer.gone.wait()

        buyer = await c.start(buyer.home)
        assert job(buyer, job_id)["state"] == "running", events(buyer, job_id)
        done = await finished(buyer, job_id)
        assert done["state"] == "succeeded", "\n".join(events(buyer, job_id))
        assert events(buyer, job_id).count("running: container started") == 1
        assert done["attempts"] == 1
        assert [o["path"] for o in done["outputs"]] == ["/out/done"]
        bought = ledger(buyer)
        assert [e["amount"] for e in bought["entries"]] == [done["cost"]]
        await until(ledger_entries(provider), provider)
        assert ledger(provider)["balance"] == -bought["balance"] > 0

        seen = events(buyer, job_id)
        await buyer.stop()
        buyer = await c.start(buyer.home)
        assert ledger(buyer) == bought
        assert job(buyer, job_id) == done
        assert events(buyer, job_id) == seen


# -- gossip --------------------------------------------------------------------------------


def signed_offer(key: PrivateKey, *, issued_ms: int, ttl_ms: int = 3_600_000) -> Signed[Offer]:
    offer = Offer(
        capacity=Resources(cpu_milli=1000, memory_bytes=512 * MiB),
        prices=Prices(cpu_core_hour=PRICE, memory_gib_hour=MEM_PRICE),
        arch=Arch.AMD64,
    )
    return seal(
        key, offer, nonce=os.urandom(16), issued_ms=issued_ms, expires_ms=issued_ms + ttl_ms
    )


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
        forger_key = PrivateKey.from_seed(b"\x07" * 32)
        forger = await gossip_peer(c, middle, OFFERS_TOPIC, forger_key.peer_id)

        now = middle.peer.market.now_ms()
        expired = signed_offer(forger_key, issued_ms=now - 7_200_000)
        await forger.publish(OFFERS_TOPIC, expired.wire)
        assert market(middle)["rejected_gossip"] == {}
        assert middle.peer.net.score(forger.peer_id) == 0

        tampered = signed_offer(forger_key, issued_ms=now).wire
        tampered = bytes([tampered[0] ^ 1]) + tampered[1:]
        body = signed_offer(forger_key, issued_ms=now).body
        wrong_domain = forger_key.sign(domain_of("bid"), body) + body
        for forged in (tampered, wrong_domain):
            await forger.publish(OFFERS_TOPIC, forged)
        assert market(middle)["rejected_gossip"] == {Reason.BAD_SIGNATURE.value: 2}
        assert middle.peer.net.score(forger.peer_id) < 0

        valid = signed_offer(forger_key, issued_ms=now)
        await forger.publish(OFFERS_TOPIC, valid.wire)
        await until(lambda: market(far)["offers"] == 1, far)
        for node in (middle, far):
            assert market(node)["offers"] == 1, node.name  # only the valid one
        assert market(far)["rejected_gossip"] == {}  # it never saw the forgeries
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

        job_id = (await submit(buyer, c.image, "echo ok", price=50_000_000))["id"]
        for node in (hub, dear, buyer):
            await until(lambda n=node: market(n)["bids"] == 1, node)  # type: ignore[misc]

        cancelled = await buyer.peer.cancel(job_id)
        assert cancelled.state == "cancelled"
        for node in (hub, dear, buyer):
            await until(lambda n=node: market(n)["bids"] == 0, node)  # type: ignore[misc]
        with pytest.raises(Conflict) as refused:
            await buyer.peer.cancel(job_id)
        assert refused.value.code == "too-late"

        seen = events(buyer, job_id)
        cheap = await c.provider("cheap", price=40_000_000)
        await cheap.peer.join(hub.addr)
        await until(lambda: market(buyer)["offers"] == 2, buyer)
        await trio.testing.wait_all_tasks_blocked()
        assert events(buyer, job_id) == seen
        assert job(buyer, job_id)["state"] == "cancelled"


async def test_a_better_paying_bid_preempts_a_cheap_preemptible_job_which_is_bid_again(
    image_layout: Path,
) -> None:
    """A full provider makes room for a proposal that pays more by preempting a cheaper
    preemptible job; the preempted job's buyer settles the run and bids again by itself."""
    async with cluster(image_layout) as c:
        provider = await c.provider("provider", price=PRICE, cpu_milli=500)
        thrifty, eager = await c.buyer("thrifty"), await c.buyer("eager")
        await thrifty.peer.join(provider.addr)
        cheap = await submit(thrifty, c.image, "sleep 30", price=100_000_000, preemptible=True)
        assert (await state(thrifty, cheap["id"], "running"))["price"]["cpu_core_hour"] == PRICE

        # Demand rises: the full provider asks more, and an eager buyer pays that; its book
        # shows no room, so the provider preempts the job that pays the old, lower price.
        assert provider.peer.provider is not None
        await provider.peer.provider.set_offer(prices=Prices(cpu_core_hour=150_000_000))
        urgent = await submit(eager, c.image, "sleep 30", price=200_000_000)
        await eager.peer.join(provider.addr)
        running = await state(eager, urgent["id"], "running")
        assert running["provider"] == provider.peer_id
        assert running["price"]["cpu_core_hour"] == 150_000_000

        await until(lambda: "waiting: bidding again" in events(thrifty, cheap["id"]), thrifty)
        log = events(thrifty, cheap["id"])
        assert any(e.startswith("preempted: ") for e in log), log
        assert log.index("waiting: bidding again") > max(
            i for i, e in enumerate(log) if e.startswith("preempted: ")
        )
        after = job(thrifty, cheap["id"])
        assert after["state"] == "waiting"
        assert after["exit_reason"] == "preempted"
        assert [e["payee"] for e in ledger(thrifty)["entries"]] == [provider.peer_id]
        # It bids again at its own limit, now below the provider's ask, and says so.
        assert thrifty.peer.why(cheap["id"]).text.endswith(
            "CPU costs at least 150.00 credits per core-hour, your limit is 100.00"
        )


async def test_a_buyer_checks_a_providers_work_score_and_stops_trading_with_a_liar(
    image_layout: Path,
) -> None:
    """spec/work.md rule 7 with real containers: the provider measured its score at start;
    the buyer runs the same kernel there as a job naming that provider, and believes it.
    Then the provider states three times its score: the next check finds it out, and the
    buyer's bids no longer match it."""
    async with cluster(image_layout) as c:
        home = c.home("provider", price=PRICE)
        home.save_config(
            dataclasses.replace(
                home.config(),
                provider=dataclasses.replace(home.config().provider, benchmark=True),
            )
        )
        provider = await c.start(home)
        buyer = await c.buyer("buyer")
        await buyer.peer.join(provider.addr)
        await until(lambda: market(buyer)["offers"] == 1, buyer)
        stated = provider.peer.provider.offer.payload.work_score
        assert stated

        check = await buyer.peer.check_score(provider.peer_id)
        assert (check.honest, check.stated) == (True, stated), check.detail
        assert check.measured > 0

        seller = provider.peer.provider
        seller._work_score = stated * 3  # the provider starts to lie about its machine
        await seller.set_offer(capacity=seller.config.capacity)
        await until(
            lambda: all(
                o.offer.work_score == stated * 3
                for o in buyer.peer.market.trader.book.live_offers(buyer.peer.market.now_ms())
            ),
            buyer,
        )
        lied = await buyer.peer.check_score(provider.peer_id)
        assert not lied.honest
        assert f"it states {stated * 3} work units per core-hour" in lied.detail
        job_id = (await submit(buyer, c.image, "true"))["id"]
        why = views.why(buyer.peer.why(job_id))
        assert why["ruled_out"]["reputation"] == 1


# -- restarts: staying in touch (issue 17, D2) ------------------------------------------------


def offer_ids(node: Node, *, of: Node | None = None) -> set[str]:
    """The live offers in ``node``'s book (only those ``of`` signed)."""
    m = node.peer.market
    return {
        o.order.id.hex()
        for o in m.trader.book.live_offers(m.now_ms())
        if of is None or o.order.signer.peer_id == of.peer_id
    }


async def connected(node: Node, other: Node, *, wanted: bool = True) -> None:
    """Wait until ``node`` has (or, not ``wanted``, has no) connection to ``other``."""
    with trio.fail_after(node.bound):
        while (other.peer_id in node.peer.net.peers()) != wanted:
            await node.peer.net.wait_peers_changed()


async def test_a_restarted_bootstrap_provider_is_found_again_without_its_old_offer(
    image_layout: Path,
) -> None:
    """Stop (as a crash would) and restart the provider a buyer bootstraps from: the buyer
    dials it again by itself, they greet each other again, the provider's new offer replaces
    the old one in the buyer's book (the restarted provider cancels what it offered before),
    and a new job runs on it. Before: nobody redialled, and the stale offer stayed until it
    expired (issue 17 D2)."""
    async with cluster(image_layout) as c:
        provider_home = c.home("provider", price=PRICE)
        provider = await c.start(provider_home)
        [first_offer] = offer_ids(provider)
        buyer_home = init_home(c.root / "buyer", NodeConfig(bootstrap=(provider.addr,)))
        c.image = import_image(BlobStore(buyer_home.store_root), c.image_layout).manifest
        buyer = await c.start(buyer_home)
        await until(lambda: offer_ids(buyer) == {first_offer}, buyer)

        await provider.stop()
        await connected(buyer, provider, wanted=False)
        provider = await c.start(provider_home)  # no bootstrap of its own: it waits to be found
        [second_offer] = offer_ids(provider, of=provider)
        assert second_offer != first_offer

        await connected(provider, buyer)
        await until(lambda: offer_ids(buyer) == {second_offer}, buyer)
        job_id = (await submit(buyer, c.image, "echo again"))["id"]
        done = await finished(buyer, job_id)
        assert done["state"] == "succeeded", "\n".join(events(buyer, job_id))
        assert done["provider"] == provider.peer_id


async def test_a_peer_that_connects_is_greeted_both_ways_and_takes_our_book(
    image_layout: Path,
) -> None:
    """A connection is greeted by both ends, not only by the one that dialled: the node that
    was dialled takes the dialler's book too and learns where it is."""
    async with cluster(image_layout) as c:
        provider = await c.provider("provider")
        buyer = await c.buyer("buyer")
        await submit(buyer, c.image, "true", price=10_000_000)  # too cheap: its bid rests
        assert buyer.peer_id not in provider.peer.net.peers()
        await provider.peer.net.connect(buyer.addr)  # a bare connection: nobody joined
        await until(lambda: market(provider)["bids"] == 1, provider)
        await until(lambda: market(buyer)["offers"] == 1, buyer)
        assert buyer.peer.market.addresses == {provider.peer_id: provider.addr}
