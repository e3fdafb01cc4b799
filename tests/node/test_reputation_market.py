"""Reputation across whole nodes (node/market/reputation.py) on the in-memory network, with
real containers: a countersigned receipt's summary, signed by both parties, reaches a node
that took no part in it and moves its scores; ``min_reputation`` then rules out a cheaper
provider that no trust reaches. Waits wake on the nodes' change events (market_support)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import trio
from market_support import (
    BOUND,
    PRICE,
    Node,
    cluster,
    events,
    finished,
    gossip_peer,
    market,
    submit,
    until,
)

from node.api.controller import NodeController
from node.market.reputation import score_of
from node.net.memnet import serve_memory_network
from node.net.wire import SUMMARIES_TOPIC, SUMMARY, PeerRefused, control, read_control, request
from protocol.encoding import encode
from protocol.errors import Reason
from protocol.identity import PrivateKey, PublicKey
from protocol.reputation import Outcome, ReceiptSummary, SignedSummary, sign_summary

pytestmark = pytest.mark.integration


def signed_summaries(node: Node) -> dict[bytes, tuple[bytes, bytes]]:
    """The summaries ``node`` holds with both signatures, by agreement id."""
    return {a: (p, q) for a, _, p, q in node.peer.db.summaries() if p and q}


def key_of(node: Node) -> bytes:
    return PublicKey.from_peer_id(node.peer_id).raw


async def run_job(buyer: Node, image: str, **fields: object) -> dict[str, object]:
    job_id = (await submit(buyer, image, "echo done", **fields))["id"]
    done = await finished(buyer, job_id)
    assert done["state"] == "succeeded", "\n".join(events(buyer, job_id))
    return done


async def test_a_receipt_summary_reaches_a_third_node_and_min_reputation_rules_out_a_stranger(
    image_layout: Path,
) -> None:
    async with cluster(image_layout) as c:
        trusted = await c.provider("trusted")
        first = await c.buyer("first")
        second = await c.buyer("second")
        for node in (first, second):
            await node.peer.join(trusted.addr)
        await first.peer.join(second.addr)

        # A newcomer trusts no one: a bid that asks for reputation waits, and says why.
        picky_id = (await submit(second, c.image, "echo picky", min_reputation=1))["id"]
        why = second.peer.why(picky_id).explanation
        assert why is not None
        assert {k: n for k, n in why.ruled_out.items() if n} == {"reputation": 1}

        # Its own receipt makes the second buyer trust the provider; the waiting bid
        # matches as soon as the scores change.
        await run_job(second, c.image)
        assert (await finished(second, picky_id))["provider"] == trusted.peer_id
        assert score_of(second.peer.market, trusted.peer_id) > 0

        # The first buyer trades with the same provider; both parties sign the summary and
        # publish it, and the second buyer, no party to it, admits and keeps it.
        done = await run_job(first, c.image)
        agreement = first.peer.job(str(done["id"])).agreement_id
        holders = (second, trusted)
        await until(lambda: all(agreement in signed_summaries(n) for n in holders), *holders)
        assert signed_summaries(second)[agreement] == signed_summaries(trusted)[agreement]
        # Trust flowed to the first buyer through the provider it paid: gossip alone says so.
        await until(lambda: score_of(second.peer.market, first.peer_id) > 0, second)
        peers = {p["peer_id"]: p for p in NodeController(second.peer).peers()}
        assert peers[trusted.peer_id]["reputation"] == score_of(second.peer.market, trusted.peer_id)

        # A cheaper provider no trust reaches: a bid that asks for reputation passes it over.
        stranger = await c.provider("stranger", price=PRICE // 2)
        await stranger.peer.join(trusted.addr)
        offers = second.peer.market.trader.book.offers
        await until(lambda: len(offers) == 2, second)
        picky = await run_job(second, c.image, min_reputation=1)
        assert picky["provider"] == trusted.peer_id
        assert score_of(second.peer.market, stranger.peer_id) == 0
        anyone = await run_job(second, c.image)
        assert anyone["provider"] == stranger.peer_id

        # A node that joins later takes the summaries it missed from the peer it joins.
        await until(lambda: len(signed_summaries(second)) == 5, second)  # every receipt
        late = await c.start(c.home("late"))
        await late.peer.join(second.addr)
        await until(lambda: signed_summaries(late) == signed_summaries(second), late)


async def test_a_buyer_refusing_the_summary_ask_on_its_job_stream_is_asked_on_the_summary_stream(
    image_layout: Path,
) -> None:
    """A buyer from before the job stream carried summary asks answers one there with an
    error: the provider asks again on /cx/summary/1 and both keep the doubly signed
    summary (node/market/reputation.py, spec/reputation.md rule 6)."""
    async with cluster(image_layout) as c:
        provider = await c.provider("provider")
        buyer = await c.buyer("buyer")
        await buyer.peer.join(provider.addr)
        refused: list[bytes] = []

        async def as_before_rule_6(frame: bytes, peer: object) -> bytes:
            refused.append(frame)
            return control(error="bad-request", detail="not a job message")

        buyer.peer.market.on_summary_ask = as_before_rule_6
        done = await run_job(buyer, c.image)
        agreement = buyer.peer.job(str(done["id"])).agreement_id
        holders = (buyer, provider)
        await until(lambda: all(agreement in signed_summaries(n) for n in holders), *holders)
        assert signed_summaries(buyer)[agreement] == signed_summaries(provider)[agreement]
        assert len(refused) == 1  # asked once on the job stream, then on the summary stream


async def test_gossiped_summaries_that_are_forged_one_signed_self_dealt_or_replayed_are_refused(
    image_layout: Path,
) -> None:
    """The topic validator of a real node admits summaries before they are forwarded:
    forged, one-signature and self-dealing summaries are rejected with their reasons (the
    forwarder loses score); a second summary of an agreement already summarised is dropped
    without blame; only the valid one reaches the node beyond."""
    async with cluster(image_layout) as c:
        middle = await c.start(c.home("middle"))
        far = await c.start(c.home("far"))
        await far.peer.join(middle.addr)
        forger_peer = PrivateKey.from_seed(b"\x07" * 32).peer_id
        forger = await gossip_peer(c, middle, SUMMARIES_TOPIC, forger_peer)

        payer, payee = PrivateKey.from_seed(b"\x01" * 32), PrivateKey.from_seed(b"\x02" * 32)
        summary = ReceiptSummary(
            agreement_id=bytes(32),
            payer=payer.public_key.raw,
            payee=payee.public_key.raw,
            amount=10,
            stake=20,
            outcome=Outcome.COMPLETED,
            at_ms=middle.peer.market.now_ms(),
        )
        good = both_signed(summary, payer, payee)
        forged = SignedSummary(  # the payer signed another amount
            summary=summary,
            payer_signature=sign_summary(payer, replace(summary, amount=11)),
            payee_signature=sign_summary(payee, summary),
        ).to_wire()
        one = encode({"summary": summary.to_bytes(), "payee_sig": sign_summary(payee, summary)})
        alone = replace(summary, payee=payer.public_key.raw)
        self_dealt = both_signed(alone, payer, payer)
        for bad in (forged, one, self_dealt):
            await forger.publish(SUMMARIES_TOPIC, bad)
        assert market(middle)["rejected_gossip"] == {
            Reason.BAD_SIGNATURE.value: 1,
            Reason.MISSING_FIELD.value: 1,
            Reason.SELF_DEALING.value: 1,
        }
        assert middle.peer.net.score(forger.peer_id) < 0

        await forger.publish(SUMMARIES_TOPIC, good)
        await until(lambda: signed_summaries(far), far)
        again = both_signed(replace(summary, amount=20), payer, payee)
        await forger.publish(SUMMARIES_TOPIC, again)
        for node in (middle, far):
            assert list(signed_summaries(node)) == [summary.agreement_id], node.name
        assert market(far)["rejected_gossip"] == {}  # it never saw the refused ones
        assert len(market(middle)["rejected_gossip"]) == 3  # the replay was no one's fault


def both_signed(summary: ReceiptSummary, payer: PrivateKey, payee: PrivateKey) -> bytes:
    return SignedSummary.by_both(summary, payer, payee).to_wire()


async def test_a_buyer_signs_only_the_summary_of_a_receipt_it_countersigned(
    image_layout: Path,
) -> None:
    """``/cx/summary/1``: a peer that asks a node to sign a summary naming it as payer, for
    a receipt it never countersigned (or with another amount), is refused."""
    async with cluster(image_layout) as c:
        buyer = await c.buyer("buyer")
        asker_key = PrivateKey.from_seed(b"\x09" * 32)
        asker = await c.nursery.start(serve_memory_network, c.hub, asker_key.peer_id)
        await asker.connect(buyer.addr)
        summary = ReceiptSummary(
            agreement_id=bytes(32),
            payer=key_of(buyer),
            payee=asker_key.public_key.raw,
            amount=10**9,
            stake=10**9,
            outcome=Outcome.COMPLETED,
            at_ms=buyer.peer.market.now_ms(),
        )
        ask = control(summary=summary.to_bytes(), signature=sign_summary(asker_key, summary))
        with trio.fail_after(BOUND), pytest.raises(PeerRefused) as refused:
            read_control(await request(asker, buyer.peer_id, SUMMARY, ask))
        assert refused.value.reason == Reason.TERMS_MISMATCH.value
        assert signed_summaries(buyer) == {}
