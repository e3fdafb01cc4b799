"""The market core of a running node: gossip in and out, the order book, peers.

One :class:`Market` per node wraps the sans-IO :class:`~protocol.trader.Trader`. It admits
gossiped orders in the topic validator (decode, signature, expiry, replay, size: nothing
invalid is forwarded, and its forwarder loses score), keeps the book fresh (expired and
cancelled orders leave), hands matches of our own bids to the buyer role, and keeps this
node connected: a *hello* exchange swaps addresses so buyers can dial providers they only
know from gossip, and a *book* exchange gives a newcomer the live orders it missed. The
same goes for the tape (protocol/tape.py): trade prints are admitted on their own topic,
kept in SQLite, and a newcomer pulls the recent ones with a *tape* exchange.

The roles build on it: ``node/market/buyer.py`` and ``node/market/provider.py``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from node.clock import Clock, Entropy, Timings, nonce
from node.market.joblink import JobLinks
from node.metrics import Metrics
from node.net.transport import (
    FramedStream,
    Network,
    NetworkError,
    PeerId,
    ProtocolId,
    Stream,
    Verdict,
)
from node.net.wire import (
    BIDS_TOPIC,
    BOOK,
    HELLO,
    OFFERS_TOPIC,
    TAPE,
    TAPE_TOPIC,
    control,
    read_control,
)
from node.storage.db import Database
from node.storage.store import BlobStore
from protocol.book import Match
from protocol.envelope import Signed
from protocol.errors import LocalProtocolError, ProtocolError, Reason
from protocol.messages import Bid, Cancel
from protocol.negotiation import Agreement
from protocol.receipts import CountersignedReceipt
from protocol.tape import SignedPrint, Tape
from protocol.trader import Trader

if TYPE_CHECKING:
    from trio_typing import TaskStatus  # see node/net/memnet.py: trio-stubs shadow trio

__all__ = ["Market"]

log = logging.getLogger(__name__)

MAX_PEERS = 64  # addresses learned by hello are dialled up to this many connections
_HARMLESS = frozenset({Reason.EXPIRED, Reason.REPLAYED, Reason.NOT_YET_VALID})

TAPE_SYNC_MAX = 10_000  # prints a tape exchange serves, newest kept
TAPE_FLUSH_S = 1.0  # prints are written in one transaction per this long


async def _no_summaries(frame: bytes, peer: PeerId) -> bytes:
    return control(error=Reason.WRONG_TYPE.value, detail="this node signs no receipt summaries")


class Market:
    """The node's market core; the roles reach the network, state, time and randomness
    through it (``clock``, ``timings``, ``entropy`` are the only sources of those)."""

    def __init__(
        self,
        trader: Trader,
        net: Network,
        db: Database,
        store: BlobStore,
        *,
        clock: Clock,
        timings: Timings,
        entropy: Entropy,
        metrics: Metrics | None = None,
    ) -> None:
        self.trader = trader
        self.net = net
        self.db = db
        self.store = store
        self.clock = clock
        self.timings = timings
        self.entropy = entropy
        self.metrics = metrics or Metrics()  # what /metrics counts (node/metrics.py)
        self.addresses: dict[PeerId, str] = {}  # dialable addresses learned by hello
        self.job_links = JobLinks(net)  # /cx/job/1 streams kept open (provider, reputation)
        self.tape = Tape()
        self._unsaved_prints: list[tuple[bytes, int, bytes]] = []
        self.rejected: dict[str, int] = {}  # gossip refused, by reason
        self.on_match: Callable[[Match], None] = lambda match: None
        # A receipt of ours was countersigned (node/market/reputation.py counts it).
        self.on_settled: Callable[[Agreement, CountersignedReceipt], None] = lambda a, r: None
        # A provider asks on /cx/job/1 for our signature on a receipt summary: the answer.
        self.on_summary_ask: Callable[[bytes, PeerId], Awaitable[bytes]] = _no_summaries
        self.on_rescored: Callable[[], None] = lambda: None  # reputation scores changed
        self.on_joined: Callable[[PeerId], None] = lambda peer: None  # after join's syncs
        self._matches_send, self._matches = trio.open_memory_channel[Match](math.inf)
        self._changed = trio.Event()
        self.version = 0  # counts touch(): a reader that saw N knows whether it missed one
        self._greeted: dict[PeerId, trio.Event] = {}  # peers greeted on this connection
        self._cancels: list[tuple[Signed[Cancel], str]] = []  # ours, and their topics

    @property
    def me(self) -> PeerId:
        return self.net.peer_id

    def now_ms(self) -> int:
        return self.clock.now_ms()

    def nonce(self, size: int = 16) -> bytes:
        return nonce(self.entropy, size)

    def touch(self) -> None:
        """Something observable changed (a job, the book, the ledger): wake the waiters."""
        self.version += 1
        self._changed.set()
        self._changed = trio.Event()

    async def changed(self) -> None:
        """Return at the next :meth:`touch`."""
        await self._changed.wait()

    def next_change(self) -> trio.Event:
        """The event the next :meth:`touch` sets: taken before looking at the state, it
        cannot miss a change that comes between the look and the wait."""
        return self._changed

    async def run(self, *, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Join the topics and serve hello, book and tape; runs until cancelled."""
        self._restore_tape()
        async with trio.open_nursery() as nursery:
            for topic in (OFFERS_TOPIC, BIDS_TOPIC):
                channel = await self.net.subscribe(topic, self._validate)
                nursery.start_soon(self._drain, channel)
            channel = await self.net.subscribe(TAPE_TOPIC, self._validate_print)
            nursery.start_soon(self._drain, channel)
            self.net.serve(HELLO, self._serve_hello)
            self.net.serve(BOOK, self._serve_book)
            self.net.serve(TAPE, self._serve_tape)
            nursery.start_soon(self._dispatch_matches)
            nursery.start_soon(self._store_prints)
            nursery.start_soon(self._maintain)
            nursery.start_soon(self.job_links.run)
            task_status.started()

    # -- gossip ------------------------------------------------------------------------

    def _validate(self, author: PeerId, data: bytes) -> Verdict:
        """The topic validator: admission plus the book, before anything is forwarded."""
        try:
            _, matches = self.trader.receive_order(data, now_ms=self.now_ms())
        except ProtocolError as exc:
            self.metrics.order_refused(exc.reason.value)
            harmless = exc.reason in _HARMLESS or isinstance(exc, LocalProtocolError)
            if not harmless:
                self.rejected[exc.reason.value] = self.rejected.get(exc.reason.value, 0) + 1
                log.info("refused gossip from %s: %s", author, exc)
            return Verdict.IGNORE if harmless else Verdict.REJECT
        self.metrics.order_admitted(len(matches))
        for match in matches:
            self._matches_send.send_nowait(match)
        self.touch()
        return Verdict.ACCEPT

    async def _drain(self, channel: trio.MemoryReceiveChannel[Any]) -> None:
        async for _ in channel:  # the validator already took each order into the book
            pass

    async def _dispatch_matches(self) -> None:
        async for match in self._matches:
            if match.buyer == self.trader.me.raw:
                self.on_match(match)

    async def publish(self, order: Signed[Any], *, topic: str | None = None) -> None:
        """Gossip one of our orders; a cancel names the topic of the order it cancels."""
        if topic is None:
            topic = BIDS_TOPIC if isinstance(order.payload, Bid) else OFFERS_TOPIC
        if isinstance(order.payload, Cancel):  # told again to every peer that connects
            self._cancels = self._live_cancels(self.now_ms())
            self._cancels.append((order, topic))
        await self.net.publish(topic, order.wire)

    # -- the tape ----------------------------------------------------------------------

    def _validate_print(self, author: PeerId, data: bytes) -> Verdict:
        """The tape topic's validator: both signatures, new, in its window; then stored."""
        try:
            signed = self.tape.admit(data, now_ms=self.now_ms())
        except ProtocolError as exc:
            if exc.reason in _HARMLESS:
                return Verdict.IGNORE
            self.rejected[exc.reason.value] = self.rejected.get(exc.reason.value, 0) + 1
            log.info("refused a trade print from %s: %s", author, exc)
            return Verdict.REJECT
        self._keep_print(signed)
        return Verdict.ACCEPT

    async def record_print(self, signed: SignedPrint) -> None:
        """Keep a print of our own trade and gossip it to the tape."""
        try:
            self.tape.keep(signed, now_ms=self.now_ms())
        except ProtocolError as exc:
            log.info("own trade print not kept: %s", exc)
            return
        self._keep_print(signed)
        await self.net.publish(TAPE_TOPIC, signed.wire)

    def _keep_print(self, signed: SignedPrint) -> None:
        # Stored in batches (_flush_prints): one commit per print held a node to a third
        # of its order ingest rate or less (bench/tape.py). A print lost to a crash is
        # public and comes back with the next tape exchange.
        self._unsaved_prints.append((signed.trade.trade_id, signed.trade.at_ms, signed.wire))
        self.touch()

    def _flush_prints(self) -> None:
        if self._unsaved_prints:
            self.db.save_prints(self._unsaved_prints)
            self._unsaved_prints = []

    async def _store_prints(self) -> None:
        try:
            while True:
                await trio.sleep(TAPE_FLUSH_S)
                self._flush_prints()
        finally:
            self._flush_prints()  # a clean stop keeps them all

    def _restore_tape(self) -> None:
        now = self.now_ms()
        for trade_id, wire in self.db.prints(now - self.tape.retention_ms):
            try:
                self.tape.admit(wire, now_ms=now)
            except ProtocolError as exc:
                self.db.quarantine("tape", trade_id, str(exc), now)

    async def sync_tape(self, peer: PeerId) -> int:
        """Take the recent prints ``peer`` kept; returns how many were new here."""
        return await self.pull(peer, TAPE, self._validate_print)

    async def _serve_tape(self, raw: Stream) -> None:
        stream = FramedStream(raw)
        read_control(await stream.receive_frame())
        self._flush_prints()
        for _, wire in self.db.prints(self.now_ms() - self.tape.retention_ms)[-TAPE_SYNC_MAX:]:
            await stream.send_frame(wire)

    async def _maintain(self) -> None:
        while True:
            await trio.sleep(self.timings.maintenance_s)
            now = self.now_ms()
            if self.trader.book.expire(now):
                self.touch()
            self.trader.guard.forget_expired(now)
            self.tape.forget_before(now - self.tape.retention_ms)
            self.db.forget_prints_before(now - self.tape.retention_ms)

    # -- peers -------------------------------------------------------------------------

    async def join(self, addr: str) -> PeerId:
        """Connect to ``addr``, swap addresses, dial the peers it knows, fetch its book.

        Raises NetworkError when ``addr`` cannot be reached.
        """
        peer = await self.net.connect(addr)
        self.addresses[peer] = addr
        await self.greet(peer)
        return peer

    async def greet(self, peer: PeerId) -> None:
        """Swap addresses with a newly connected peer, take its book, send ours again.

        Once per connection: ``node/market/peering.py`` calls it for every peer that
        connects and :meth:`forget` when it goes; a second call waits for the first.
        """
        if (done := self._greeted.get(peer)) is not None:
            await done.wait()
            return
        self._greeted[peer] = done = trio.Event()
        try:
            await self._hello(peer)
            await self.sync_book(peer)
            await self.sync_tape(peer)
            await self._announce()
            self.on_joined(peer)
        finally:
            done.set()

    def forget(self, peer: PeerId) -> None:
        """The connection to ``peer`` is gone: greet it again when it comes back."""
        self._greeted.pop(peer, None)

    async def _announce(self) -> None:
        """Gossip our own live orders again, now that we have peers to gossip them to.

        An order posted while this node had no peers (a provider's offer at start-up, a
        bid restored after a restart) reached nobody, and the book exchange only pulls.
        Peers that hold an order already ignore the repeat (admission's replay guard).
        """
        now = self.now_ms()
        for order in self.trader.live_orders(now, mine=True):
            await self.publish(order)
        for cancel, topic in self._live_cancels(now):
            await self.net.publish(topic, cancel.wire)

    def _live_cancels(self, now: int) -> list[tuple[Signed[Cancel], str]]:
        return [(c, topic) for c, topic in self._cancels if c.expires_ms > now]

    async def hello(self, peer: PeerId) -> None:
        """Swap addresses with ``peer`` again and dial the peers it knows that we do not."""
        await self._hello(peer)

    async def _hello(self, peer: PeerId) -> None:
        try:
            with trio.fail_after(self.timings.hello_timeout_s):
                stream = FramedStream(await self.net.open_stream(peer, HELLO))
                try:
                    await stream.send_frame(control(addrs=self.net.listen_addrs))
                    answer = read_control(await stream.receive_frame())
                finally:
                    await stream.aclose()
        except (NetworkError, trio.TooSlowError) as exc:
            log.info("hello to %s failed: %s", peer, exc)
            return
        for other, addr in answer.get("peers", []):
            if other == peer:  # where it says it is now, if it restarted elsewhere
                self.addresses[peer] = str(addr)
            await self._dial_learned(PeerId(str(other)), str(addr))

    async def _dial_learned(self, peer: PeerId, addr: str) -> None:
        if peer == self.me or peer in self.net.peers() or len(self.net.peers()) >= MAX_PEERS:
            self.addresses.setdefault(peer, addr)
            return
        try:
            await self.net.connect(addr)
            self.addresses[peer] = addr
        except NetworkError as exc:
            log.info("could not dial %s at %s: %s", peer, addr, exc)

    async def _serve_hello(self, raw: Stream) -> None:
        stream = FramedStream(raw)
        request = read_control(await stream.receive_frame())
        addrs = [str(a) for a in request.get("addrs", [])][:8]
        if addrs:
            self.addresses[raw.remote_peer] = addrs[0]
        known = [[p, a] for p, a in self.addresses.items() if p != raw.remote_peer]
        mine = [[self.me, a] for a in self.net.listen_addrs[:1]]
        await stream.send_frame(control(peers=(mine + known)[:MAX_PEERS]))

    async def sync_book(self, peer: PeerId) -> int:
        """Take the live orders of ``peer``'s book; returns how many were new here."""
        return await self.pull(peer, BOOK, self._validate)

    async def pull(
        self, peer: PeerId, protocol: ProtocolId, admit: Callable[[PeerId, bytes], Verdict]
    ) -> int:
        """Ask ``peer`` for what it serves on ``protocol`` and ``admit`` each frame as if it
        had come by gossip; returns how many were accepted."""
        taken = 0
        try:
            with trio.fail_after(self.timings.hello_timeout_s * 4):
                stream = FramedStream(await self.net.open_stream(peer, protocol))
                try:
                    await stream.send_frame(control())
                    while (frame := await stream.receive_frame()) is not None:
                        if admit(peer, frame) is Verdict.ACCEPT:
                            taken += 1
                finally:
                    await stream.aclose()
        except (NetworkError, trio.TooSlowError) as exc:
            log.info("%s from %s failed: %s", protocol, peer, exc)
        return taken

    async def _serve_book(self, raw: Stream) -> None:
        stream = FramedStream(raw)
        read_control(await stream.receive_frame())
        now = self.now_ms()
        orders: list[Signed[Any]] = self.trader.live_orders(now)
        orders += [cancel for cancel, _ in self._live_cancels(now)]
        for order in orders:
            if order.signer.peer_id != raw.remote_peer:  # its own it knows better than we do
                await stream.send_frame(order.wire)
