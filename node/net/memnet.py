"""An in-memory :class:`~node.net.transport.Network`: many fake peers in one trio process.

For tests of everything above the network (the market loop, negotiation, transfer). It
keeps the contract of ``node/net/transport.py`` and nothing of libp2p:

Rules:
- A :class:`MemoryHub` is the whole network. :func:`serve_memory_network` starts one peer
  on it from a nursery and hands back its :class:`MemoryNetwork`; leaving it takes the peer
  off the hub (its links and streams close).
- Links are explicit: ``connect(addr)`` links two peers both ways. Gossip floods along the
  links between subscribers of the topic, like a GossipSub mesh: each subscriber runs its
  validator once per message before delivering; only ACCEPT is delivered and forwarded,
  REJECT lowers the forwarder's score by :data:`REJECT_PENALTY`, IGNORE drops it.
- Delivery applies backpressure instead of dropping: ``publish`` waits while a
  subscriber's channel is full. Keep consumers draining (or buffers large) so two peers
  that publish from their gossip loops cannot wait on each other.
- Provider records are kept on the hub and found while their provider runs: a DHT that
  is always complete.
- Streams are pairs of bounded memory channels; a handler runs in the serving peer's
  nursery and its stream is closed when it returns.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from node.net.transport import (
    DialError,
    Gossip,
    LocalNetworkError,
    NetReason,
    PeerId,
    ProtocolId,
    Stream,
    StreamClosed,
    StreamHandler,
    Validator,
    Verdict,
)

if TYPE_CHECKING:
    # libp2p pulls in trio-typing, whose trio-stubs shadow trio's own inline types for
    # mypy and spell TaskStatus here; at runtime the annotation is never evaluated.
    from trio_typing import TaskStatus

__all__ = ["REJECT_PENALTY", "MemoryHub", "MemoryNetwork", "MemoryStream", "serve_memory_network"]

logger = logging.getLogger(__name__)

REJECT_PENALTY = 10.0
_ADDR_PREFIX = "/memory/p2p/"


class MemoryHub:
    """The shared medium of a set of in-memory peers."""

    def __init__(
        self,
        *,
        max_message_size: int = 256 * 1024,  # as P2PConfig.max_message_size
        subscription_buffer: int = 4096,
        stream_buffer: int = 16,
    ) -> None:
        self.max_message_size = max_message_size
        self.subscription_buffer = subscription_buffer
        self.stream_buffer = stream_buffer
        self._nodes: dict[PeerId, MemoryNetwork] = {}
        self._providers: dict[str, set[PeerId]] = {}  # the DHT's provider records
        self._message_ids = itertools.count()
        self._changed = trio.Event()

    def _touch(self) -> None:
        """Wake everyone waiting for the topology or the subscriptions to change."""
        self._changed.set()
        self._changed = trio.Event()

    def node(self, peer: PeerId) -> MemoryNetwork | None:
        return self._nodes.get(peer)

    def _register(self, net: MemoryNetwork) -> None:
        if net.peer_id in self._nodes:
            raise LocalNetworkError(NetReason.BAD_ADDRESS, f"{net.peer_id} is already running")
        self._nodes[net.peer_id] = net

    def _unregister(self, net: MemoryNetwork) -> None:
        self._nodes.pop(net.peer_id, None)
        for other in self._nodes.values():
            other._links.discard(net.peer_id)
        self._touch()

    async def _flood(self, origin: MemoryNetwork, topic: str, data: bytes) -> None:
        message_id = next(self._message_ids)
        origin._seen.add(message_id)
        frontier = deque((origin.peer_id, peer) for peer in sorted(origin._links))
        while frontier:
            forwarder, peer = frontier.popleft()
            node = self._nodes.get(peer)
            if node is None or message_id in node._seen:
                continue
            subscription = node._subscriptions.get(topic)
            if subscription is None:
                continue
            node._seen.add(message_id)
            verdict = subscription.judge(origin.peer_id, data)
            if verdict is Verdict.REJECT:
                node._scores[forwarder] -= REJECT_PENALTY
                continue
            if verdict is Verdict.IGNORE:
                continue
            try:
                await subscription.send.send(Gossip(origin.peer_id, data))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                node._subscriptions.pop(topic, None)  # the consumer went away
                continue
            frontier.extend((peer, nxt) for nxt in sorted(node._links) if nxt != forwarder)


@dataclass(slots=True)
class _Subscription:
    validator: Validator
    send: trio.MemorySendChannel[Gossip]

    def judge(self, author: PeerId, data: bytes) -> Verdict:
        try:
            return self.validator(author, data)
        except Exception:
            # A validator bug is ours, not the sender's: drop without penalty, loudly.
            logger.exception("gossip validator raised; message from %s ignored", author)
            return Verdict.IGNORE


@dataclass(eq=False)
class MemoryNetwork:
    """One peer on a :class:`MemoryHub`; implements :class:`~node.net.transport.Network`."""

    hub: MemoryHub
    _peer_id: PeerId
    _nursery: trio.Nursery
    _running: bool = True
    _links: set[PeerId] = field(default_factory=set)
    _subscriptions: dict[str, _Subscription] = field(default_factory=dict)
    _handlers: dict[ProtocolId, StreamHandler] = field(default_factory=dict)
    _seen: set[int] = field(default_factory=set)
    _scores: dict[PeerId, float] = field(default_factory=lambda: _ZeroDict())

    @property
    def peer_id(self) -> PeerId:
        return self._peer_id

    @property
    def listen_addrs(self) -> list[str]:
        return [_ADDR_PREFIX + self._peer_id]

    def _check_running(self) -> None:
        if not self._running:
            raise LocalNetworkError(NetReason.NOT_RUNNING, "this memory peer has stopped")

    async def connect(self, addr: str) -> PeerId:
        self._check_running()
        await trio.lowlevel.checkpoint()
        if not addr.startswith(_ADDR_PREFIX):
            raise LocalNetworkError(NetReason.BAD_ADDRESS, f"not a memory address: {addr!r}")
        peer = PeerId(addr[len(_ADDR_PREFIX) :])
        other = self.hub.node(peer)
        if other is None or peer == self._peer_id:
            raise DialError(NetReason.UNREACHABLE, f"no memory peer {peer} is running")
        self._links.add(peer)
        other._links.add(self._peer_id)
        self.hub._touch()
        return peer

    def peers(self) -> frozenset[PeerId]:
        return frozenset(p for p in self._links if self.hub.node(p) is not None)

    async def wait_peers_changed(self) -> None:
        await self.hub._changed.wait()

    async def provide(self, key: str) -> None:
        await trio.lowlevel.checkpoint()
        self.hub._providers.setdefault(key, set()).add(self._peer_id)

    async def find_providers(self, key: str, limit: int = 20) -> dict[PeerId, list[str]]:
        await trio.lowlevel.checkpoint()
        found = sorted(
            p
            for p in self.hub._providers.get(key, ())
            if p != self._peer_id and self.hub.node(p) is not None
        )
        return {p: [_ADDR_PREFIX + p] for p in found[:limit]}

    async def subscribe(
        self, topic: str, validator: Validator
    ) -> trio.MemoryReceiveChannel[Gossip]:
        self._check_running()
        await trio.lowlevel.checkpoint()
        if topic in self._subscriptions:
            raise LocalNetworkError(NetReason.DUPLICATE_HANDLER, f"already subscribed to {topic}")
        send, receive = trio.open_memory_channel[Gossip](self.hub.subscription_buffer)
        self._subscriptions[topic] = _Subscription(validator, send)
        self.hub._touch()
        return receive

    async def wait_subscribed(self, peer: PeerId, topic: str) -> None:
        while True:
            other = self.hub.node(peer)
            if peer in self._links and other is not None and topic in other._subscriptions:
                await trio.lowlevel.checkpoint()
                return
            await self.hub._changed.wait()

    async def publish(self, topic: str, data: bytes) -> None:
        self._check_running()
        if len(data) > self.hub.max_message_size:
            raise LocalNetworkError(
                NetReason.TOO_LARGE,
                f"gossip message of {len(data)} bytes exceeds {self.hub.max_message_size}",
            )
        await self.hub._flood(self, topic, bytes(data))

    async def flush(self) -> None:
        await trio.lowlevel.checkpoint()

    def score(self, peer: PeerId) -> float:
        return self._scores[peer]

    def queue_depths(self) -> dict[str, int]:
        waiting = (s.send.statistics().current_buffer_used for s in self._subscriptions.values())
        return {"outbox": 0, "inbound": sum(waiting)}

    async def open_stream(self, peer: PeerId, protocol_id: ProtocolId) -> Stream:
        self._check_running()
        await trio.lowlevel.checkpoint()
        other = self.hub.node(peer)
        if other is None:
            raise DialError(NetReason.UNREACHABLE, f"no memory peer {peer} is running")
        handler = other._handlers.get(protocol_id)
        if handler is None:
            raise DialError(NetReason.UNSUPPORTED_PROTOCOL, f"{peer} does not serve {protocol_id}")
        ours, theirs = MemoryStream.pair(self._peer_id, peer, self.hub.stream_buffer)
        other._nursery.start_soon(_run_handler, handler, theirs, protocol_id)
        return ours

    def serve(self, protocol_id: ProtocolId, handler: StreamHandler) -> None:
        self._check_running()
        if protocol_id in self._handlers:
            raise LocalNetworkError(
                NetReason.DUPLICATE_HANDLER, f"{protocol_id} already has a handler"
            )
        self._handlers[protocol_id] = handler


class _ZeroDict(dict[PeerId, float]):
    def __missing__(self, key: PeerId) -> float:
        return 0.0


async def _run_handler(handler: StreamHandler, stream: MemoryStream, protocol: str) -> None:
    try:
        await handler(stream)
    except Exception:
        # Top of a per-stream task: log and drop this stream, keep the node.
        logger.exception("%s handler failed for %s", protocol, stream.remote_peer)
    finally:
        await stream.aclose()


class MemoryStream:
    """One end of an in-memory stream."""

    def __init__(
        self,
        remote: PeerId,
        send: trio.MemorySendChannel[bytes],
        receive: trio.MemoryReceiveChannel[bytes],
    ) -> None:
        self._remote = remote
        self._send = send
        self._receive = receive
        self._pending = b""
        self._closed = False

    @classmethod
    def pair(cls, a: PeerId, b: PeerId, buffer: int) -> tuple[MemoryStream, MemoryStream]:
        a_to_b_send, a_to_b_receive = trio.open_memory_channel[bytes](buffer)
        b_to_a_send, b_to_a_receive = trio.open_memory_channel[bytes](buffer)
        return cls(b, a_to_b_send, b_to_a_receive), cls(a, b_to_a_send, a_to_b_receive)

    @property
    def remote_peer(self) -> PeerId:
        return self._remote

    @property
    def remote_host(self) -> str | None:
        return None  # no sockets: transfers stay on the stream

    async def send_all(self, data: bytes) -> None:
        if self._closed:
            raise StreamClosed(NetReason.CLOSED, "send on a closed stream")
        try:
            await self._send.send(bytes(data))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise StreamClosed(NetReason.CLOSED, "the peer closed the stream") from exc

    async def receive_some(self, max_bytes: int = 65536) -> bytes:
        if self._closed:
            raise StreamClosed(NetReason.CLOSED, "receive on a closed stream")
        if not self._pending:
            try:
                self._pending = await self._receive.receive()
            except trio.EndOfChannel:
                return b""
            except trio.ClosedResourceError as exc:
                raise StreamClosed(NetReason.CLOSED, "the stream was closed") from exc
        chunk, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return chunk

    async def aclose(self) -> None:
        self._closed = True
        await self._send.aclose()
        await self._receive.aclose()


async def serve_memory_network(
    hub: MemoryHub,
    peer_id: PeerId,
    *,
    task_status: TaskStatus[MemoryNetwork] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one in-memory peer until cancelled; ``nursery.start`` returns its network."""
    async with trio.open_nursery() as nursery:
        net = MemoryNetwork(hub, peer_id, nursery)
        hub._register(net)
        try:
            task_status.started(net)
            await trio.sleep_forever()
        finally:
            net._running = False
            hub._unregister(net)
            for subscription in net._subscriptions.values():
                subscription.send.close()
            nursery.cancel_scope.cancel()
