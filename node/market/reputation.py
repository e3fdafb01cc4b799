"""Reputation on a running node: receipt summaries in and out, and the scores matching uses.

spec/reputation.md states the rules. The parts here:

- *Settling.* When a receipt is countersigned, both parties derive its summary
  (:func:`protocol.reputation.summarize`), sign it and store it with their own signature:
  a node's own receipts count at once, with no exchange. The provider (payee) then asks
  the buyer (payer) for its signature on the ``/cx/job/1`` stream it keeps open to it
  (node/market/joblink.py; ``/cx/summary/1`` if the buyer refuses the ask there); the
  buyer checks the summary is the one it derived itself, signs, stores and publishes it,
  and answers with its signature; the provider stores the doubly signed summary. Only the
  buyer publishes it: a second copy is the same summary, which every other node would
  verify and then drop as replayed (a gossip message costs two nodes milliseconds of CPU
  in py-libp2p, node/net/p2p.py).
  Each side verifies only the other's signature: its own it has just made. A restarted
  provider asks again for every summary still missing the buyer's signature.
- *Gossip.* Summaries travel on ``cx/summaries/1``; the topic validator admits them with
  :func:`protocol.reputation.open_summary` (both signatures, no self-dealing, no replay)
  and stores them, in one transaction per maintenance period (a commit per summary held a
  node to a few hundred a second; a summary lost to a crash is public and comes back with
  the next sync). Refusals count in the market's ``rejected``, like orders. A node that
  joins a peer takes the newest ``SYNC_MAX`` summaries the peer holds
  (``/cx/summaries/1``), admitted alike.
- *Scores.* A summary taken goes into a :class:`~protocol.reputation.TrustGraph` at once
  (O(1): the validator stays cheap). After a change the scores are computed again, at
  most once per ``Timings.maintenance_s`` and in a worker thread (propagation is
  ``ROUNDS`` passes over every edge), and written into the trader's ``reputation`` map,
  which the pure order book reads when it matches (``Constraints.min_reputation``);
  ``Market.on_rescored`` then lets the buyer role match its waiting bids again. A
  negative entry there is a local verdict of the buyer role (a provider that vanished
  mid-job) and outlives the recomputation.
"""

from __future__ import annotations

import heapq
import logging
import math
from typing import TYPE_CHECKING

import trio

from node.market.gossip import Market
from node.net.transport import FramedStream, NetworkError, PeerId, Stream, Verdict
from node.net.wire import (
    SUMMARIES,
    SUMMARIES_TOPIC,
    SUMMARY,
    PeerRefused,
    control,
    read_control,
    request,
)
from protocol.encoding import decode
from protocol.errors import InvalidMessage, ProtocolError, Reason
from protocol.identity import PrivateKey, PublicKey
from protocol.negotiation import Agreement
from protocol.receipts import CountersignedReceipt
from protocol.reputation import (
    HORIZON_MS,
    SUMMARY_DOMAIN,
    ReceiptSummary,
    SignedSummary,
    TrustGraph,
    open_summary,
    propagate,
    sign_summary,
    summarize,
    wire_of,
)
from protocol.schema import from_value

if TYPE_CHECKING:
    from trio_typing import TaskStatus  # see node/net/memnet.py: trio-stubs shadow trio

__all__ = ["Reputation", "score_of"]

log = logging.getLogger(__name__)

_HARMLESS = frozenset({Reason.EXPIRED, Reason.REPLAYED, Reason.NOT_YET_VALID})
SYNC_MAX = 5_000  # the newest summaries a node serves one that joins (about 350 bytes each)


def score_of(market: Market, peer: str) -> int:
    """``peer``'s score as this node's matching sees it; 0 where no trust reaches it."""
    try:
        key = PublicKey.from_peer_id(peer).raw
    except InvalidMessage:  # not an Ed25519 peer id: no receipt can name it
        return 0
    return market.trader.reputation.get(key, 0)


def _row(
    summary: ReceiptSummary, payer_sig: bytes | None, payee_sig: bytes | None
) -> tuple[bytes, bytes, bytes | None, bytes | None, int]:
    """A summary as the database keeps it (node/storage/db.py, ``save_summaries``)."""
    return (summary.agreement_id, summary.to_bytes(), payer_sig, payee_sig, summary.at_ms)


class Reputation:
    def __init__(self, market: Market, key: PrivateKey) -> None:
        self.market = market
        self.key = key
        self._summaries: dict[bytes, ReceiptSummary] = {}
        self._by_age: list[tuple[int, bytes]] = []  # (at_ms, agreement id), oldest first
        self._graph = TrustGraph()
        self._stale = trio.Event()  # set when the scores lag the summaries
        self._asks_send, self._asks = trio.open_memory_channel[ReceiptSummary](math.inf)
        self._joins_send, self._joins = trio.open_memory_channel[PeerId](math.inf)
        self._unsaved: list[SignedSummary] = []  # admitted from gossip, stored in batches
        self._load()

    @property
    def me(self) -> bytes:
        return self.key.public_key.raw

    async def run(self, *, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Admit gossiped summaries, serve and make summary exchanges; until cancelled."""
        channel = await self.market.net.subscribe(SUMMARIES_TOPIC, self._validate)
        self.market.net.serve(SUMMARY, self._serve)
        self.market.net.serve(SUMMARIES, self._serve_sync)
        self.market.on_settled = self.settled
        self.market.on_summary_ask = self.answer_ask
        self.market.on_joined = self._joins_send.send_nowait
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._drain, channel)
            nursery.start_soon(self._rescore_loop)
            nursery.start_soon(self._sync_loop)
            task_status.started()
            async for summary in self._asks:
                nursery.start_soon(self._ask_payer, summary)

    # -- our own receipts ---------------------------------------------------------------

    def settled(self, agreement: Agreement, receipt: CountersignedReceipt) -> None:
        """A receipt of ours was countersigned: count it, and as its payee ask the payer
        to sign its summary."""
        summary = summarize(agreement, receipt)
        signature = sign_summary(self.key, summary)
        payer_sig, payee_sig = (signature, None) if summary.payer == self.me else (None, signature)
        self.market.db.save_summaries([_row(summary, payer_sig, payee_sig)])
        self._take(summary)
        if summary.payee == self.me:
            self._asks_send.send_nowait(summary)

    async def _ask_payer(self, summary: ReceiptSummary) -> None:
        peer = PublicKey(summary.payer).peer_id
        own = sign_summary(self.key, summary)
        try:
            with trio.fail_after(self.market.timings.hello_timeout_s):
                frame = control(summary=summary.to_bytes(), signature=own)
                answer = read_control(await self._ask(peer, frame))
            theirs = answer.get("signature")
            if type(theirs) is not bytes:
                raise InvalidMessage(Reason.MISSING_FIELD, "the answer carries no signature")
            PublicKey(summary.payer).verify(SUMMARY_DOMAIN, summary.to_bytes(), theirs)
        except (NetworkError, PeerRefused, ProtocolError, trio.TooSlowError) as exc:
            log.info("no summary signature from %s (asked again at restart): %s", peer, exc)
            return
        # The buyer published it before it answered (spec/reputation.md rule 6).
        self._save(SignedSummary(summary=summary, payer_signature=theirs, payee_signature=own))
        self.market.touch()

    async def _ask(self, peer: PeerId, frame: bytes) -> bytes:
        """Ask on a ``/cx/job/1`` stream kept open to the buyer (node/market/joblink.py); a
        buyer that refuses the ask there (a node from before rule 6 allowed it) is asked
        again on ``/cx/summary/1``."""
        async with self.market.job_links.borrow(peer) as link:
            answer = await link.ask(frame)
        try:
            read_control(answer)
        except PeerRefused:
            return await request(self.market.net, peer, SUMMARY, frame)
        return answer

    async def _serve(self, raw: Stream) -> None:
        """The payer's side on ``/cx/summary/1``: one ask, one answer."""
        stream = FramedStream(raw)
        ask = await stream.receive_frame()
        if ask is None:
            return
        await stream.send_frame(await self.answer_ask(ask, raw.remote_peer))

    async def answer_ask(self, frame: bytes, peer: PeerId) -> bytes:
        """The payer's side: sign, store and publish the summary of a receipt we
        countersigned; the frame that answers the ask (an error frame when refused)."""
        try:
            ask = read_control(frame)
            raw_summary, theirs = ask.get("summary"), ask.get("signature")
            if type(raw_summary) is not bytes or type(theirs) is not bytes:
                raise InvalidMessage(Reason.BAD_FIELD, "ask for a summary and a signature")
            summary = from_value(ReceiptSummary, decode(raw_summary))
            if summary.payer != self.me or self._summaries.get(summary.agreement_id) != summary:
                raise InvalidMessage(Reason.TERMS_MISMATCH, "not a receipt we countersigned")
            PublicKey(summary.payee).verify(SUMMARY_DOMAIN, raw_summary, theirs)
            own = sign_summary(self.key, summary)
        except ProtocolError as exc:
            log.info("refused to sign a summary for %s: %s", peer, exc)
            return control(error=exc.reason.value, detail=str(exc))
        await self._publish(
            SignedSummary(summary=summary, payer_signature=own, payee_signature=theirs)
        )
        return control(signature=own)

    async def _publish(self, signed: SignedSummary) -> None:
        self._save(signed)
        self.market.touch()
        await self.market.net.publish(SUMMARIES_TOPIC, signed.to_wire())

    def _save(self, *signed: SignedSummary) -> None:
        self.market.db.save_summaries(
            [_row(s.summary, s.payer_signature, s.payee_signature) for s in signed]
        )

    def _flush(self) -> None:
        if self._unsaved:
            self._save(*self._unsaved)
            self._unsaved = []

    # -- gossip -------------------------------------------------------------------------

    def _validate(self, author: PeerId, data: bytes) -> Verdict:
        try:
            signed = open_summary(data, now_ms=self.market.now_ms(), known=self._knows)
        except ProtocolError as exc:
            if exc.reason in _HARMLESS:
                return Verdict.IGNORE
            rejected = self.market.rejected
            rejected[exc.reason.value] = rejected.get(exc.reason.value, 0) + 1
            log.info("refused a summary from %s: %s", author, exc)
            return Verdict.REJECT
        self._unsaved.append(signed)
        self._take(signed.summary)
        return Verdict.ACCEPT

    async def _sync_loop(self) -> None:
        async for peer in self._joins:
            await self.sync(peer)

    async def sync(self, peer: PeerId) -> int:
        """Take the summaries ``peer`` holds; returns how many were new here (stored with
        the next scores)."""
        return await self.market.pull(peer, SUMMARIES, self._validate)

    async def _serve_sync(self, raw: Stream) -> None:
        stream = FramedStream(raw)
        read_control(await stream.receive_frame())
        for row in self.market.db.signed_summaries(SYNC_MAX):
            await stream.send_frame(wire_of(*row))

    def _knows(self, agreement_id: bytes) -> bool:
        return agreement_id in self._summaries

    async def _drain(self, channel: trio.MemoryReceiveChannel[object]) -> None:
        async for _ in channel:  # the validator stored each summary already
            pass

    # -- scores -------------------------------------------------------------------------

    def _take(self, summary: ReceiptSummary) -> None:
        if summary.agreement_id in self._summaries:
            return  # ours, now signed by both: counted when we settled it
        self._summaries[summary.agreement_id] = summary
        heapq.heappush(self._by_age, (summary.at_ms, summary.agreement_id))
        self._graph.add(summary)
        self._stale.set()

    async def _rescore_loop(self) -> None:
        try:
            while True:
                await self._rescore()
        finally:
            self._flush()  # a clean stop keeps every summary admitted

    async def _rescore(self) -> None:
        """Wait for new summaries; store them, score again, and rest a maintenance period.
        The summaries and the scores they make show together: one touch for both."""
        await self._stale.wait()
        self._stale = trio.Event()
        self._flush()
        self._forget_old()
        links = self._graph.links()
        fresh = await trio.to_thread.run_sync(propagate, self.me, links)
        reputation = self.market.trader.reputation
        verdicts = {k: v for k, v in reputation.items() if v < 0}
        reputation.clear()
        reputation.update(fresh)
        reputation.update(verdicts)
        self.market.on_rescored()
        self.market.touch()
        await trio.sleep(self.market.timings.maintenance_s)

    def _forget_old(self) -> None:
        horizon = self.market.now_ms() - HORIZON_MS
        while self._by_age and self._by_age[0][0] < horizon:
            _, agreement_id = heapq.heappop(self._by_age)
            self._graph.remove(self._summaries.pop(agreement_id))
        self.market.db.forget_summaries(horizon)

    def _load(self) -> None:
        """Take the stored summaries back; ask again for the buyer signatures missing."""
        for agreement_id, raw, payer_sig, payee_sig in self.market.db.summaries():
            try:
                summary = from_value(ReceiptSummary, decode(raw))
            except ProtocolError as exc:
                self.market.db.quarantine(
                    "summaries", agreement_id, f"unreadable summary: {exc}", self.market.now_ms()
                )
                continue
            self._take(summary)
            if summary.payee == self.me and payer_sig is None and payee_sig is not None:
                self._asks_send.send_nowait(summary)
