"""The network seam: what the rest of the node may ask of the peer-to-peer network.

Rules:
- Nothing here imports libp2p. ``node/net/p2p.py`` implements :class:`Network` over libp2p,
  ``node/net/memnet.py`` implements it in memory for tests; every other module of ``node/``
  talks to the network only through these types (httpcore's ``AsyncNetworkStream``).
- Gossip is at-most-once per node and per message, and never loops back: a node does not
  receive what it published itself. A validator runs on every message *before* it is
  delivered or forwarded; only ACCEPT is delivered and forwarded, REJECT also lowers the
  score of the peer that forwarded it, IGNORE just drops it.
- ``publish`` applies backpressure: it returns once the message is queued, and blocks while
  the queue is full. Nothing is dropped silently: a loss is raised, or logged and counted.
- Errors: foreign exceptions are translated in one place (:func:`map_exceptions`) into this
  tree; nothing else escapes an implementation::

      NetworkError                 base; carries a machine-readable ``reason``
      +-- LocalNetworkError        we misused it (oversized message, not running, bad address)
      +-- RemoteNetworkError       a peer broke the rules (oversized frame, bad bundle)
      +-- DialError                could not reach the peer, or it does not speak the protocol
      +-- StreamClosed             the stream or its connection ended or was reset
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import NamedTuple, NewType, Protocol

import trio

from node.net.framing import (
    DEFAULT_MAX_FRAME,
    FrameDecoder,
    FramingError,
    encode_frame,
    frame_header,
)
from protocol.identity import PeerId

__all__ = [
    "DialError",
    "ErrorMap",
    "FramedStream",
    "Gossip",
    "LocalNetworkError",
    "NetReason",
    "Network",
    "NetworkError",
    "PeerId",
    "ProtocolId",
    "RemoteNetworkError",
    "Stream",
    "StreamClosed",
    "StreamHandler",
    "Validator",
    "Verdict",
    "map_exceptions",
]

ProtocolId = NewType("ProtocolId", str)
_JOIN_BELOW = 65536  # payloads up to this size are sent joined to their header, in one write


class NetReason(enum.StrEnum):
    """Why a network operation failed; stable strings for logs, scoring and the CLI."""

    NOT_RUNNING = "not-running"
    TOO_LARGE = "too-large"
    BAD_ADDRESS = "bad-address"
    DUPLICATE_HANDLER = "duplicate-handler"
    UNREACHABLE = "unreachable"
    UNSUPPORTED_PROTOCOL = "unsupported-protocol"
    CLOSED = "closed"
    BAD_FRAME = "bad-frame"
    INTERNAL = "internal"


class NetworkError(Exception):
    """Base of every error a :class:`Network` raises."""

    def __init__(self, reason: NetReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class LocalNetworkError(NetworkError):
    """The caller misused the network (fix the call, not the peer)."""


class RemoteNetworkError(NetworkError):
    """A peer sent something that breaks the wire rules; drop or penalise it."""


class DialError(NetworkError):
    """The peer could not be reached, or refused the protocol; try another peer or later."""


class StreamClosed(NetworkError):
    """The stream, or the connection under it, is gone."""


ErrorMap = Mapping[type[BaseException], tuple[type[NetworkError], NetReason]]


@contextlib.contextmanager
def map_exceptions(mapping: ErrorMap, what: str) -> Iterator[None]:
    """Translate foreign exceptions into our tree (httpcore's ``map_exceptions``).

    The first entry of ``mapping`` that matches (in order) wins; unmapped exceptions pass
    through untouched, so bugs are not disguised as network failures. Our own errors pass
    through too. The original is chained as ``__cause__``.
    """
    try:
        yield
    except NetworkError:
        raise
    except Exception as exc:
        for source, (target, reason) in mapping.items():
            if isinstance(exc, source):
                detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise target(reason, f"{what}: {detail or type(exc).__name__}") from exc
        raise


class Verdict(enum.Enum):
    """A topic validator's decision about one gossip message."""

    ACCEPT = "accept"  # deliver and forward
    IGNORE = "ignore"  # drop quietly (stale, duplicate); the forwarder is not at fault
    REJECT = "reject"  # drop and penalise the forwarder (bad signature, malformed)


class Gossip(NamedTuple):
    """One delivered gossip message: its author's peer id and its exact bytes."""

    sender: PeerId
    data: bytes


Validator = Callable[[PeerId, bytes], Verdict]
"""``validate(author, data)``: must be quick and must not block; it runs inline."""


class Stream(Protocol):
    """A reliable, ordered, bidirectional byte stream to one peer."""

    @property
    def remote_peer(self) -> PeerId: ...

    @property
    def remote_host(self) -> str | None:
        """The peer's IP address when this stream runs over a direct TCP connection to it
        (what a direct channel dials, spec/content.md); None when relayed or in memory."""

    async def send_all(self, data: bytes) -> None:
        """Raises StreamClosed if the stream is gone."""

    async def receive_some(self, max_bytes: int = 65536) -> bytes:
        """Some bytes, at most ``max_bytes``; ``b""`` once the peer closed its side.

        Raises StreamClosed if the stream was reset.
        """

    async def aclose(self) -> None:
        """Close both directions; idempotent, never raises."""


StreamHandler = Callable[[Stream], Awaitable[None]]


class FramedStream:
    """Length-prefixed messages over a :class:`Stream` (framing rules: ``node/net/framing.py``)."""

    __slots__ = ("_decoder", "max_frame", "stream")

    def __init__(self, stream: Stream, *, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.stream = stream
        self.max_frame = max_frame
        self._decoder = FrameDecoder(max_size=max_frame)

    async def send_frame(self, payload: bytes) -> None:
        """Raises LocalNetworkError if too large, StreamClosed if the stream is gone."""
        if len(payload) <= _JOIN_BELOW:
            try:
                frame = encode_frame(payload, max_size=self.max_frame)
            except FramingError as exc:
                raise LocalNetworkError(NetReason.TOO_LARGE, str(exc)) from exc
            await self.stream.send_all(frame)
            return
        if len(payload) > self.max_frame:
            raise LocalNetworkError(
                NetReason.TOO_LARGE, f"frame of {len(payload)} bytes exceeds {self.max_frame}"
            )
        # A large payload goes after its header, not copied behind it (a 4 MiB blob chunk).
        await self.stream.send_all(frame_header(len(payload)))
        await self.stream.send_all(payload)

    async def receive_frame(self) -> bytes | None:
        """The next frame, or None at a clean end of stream.

        Raises RemoteNetworkError on an oversized frame or a stream that ends mid-frame,
        StreamClosed if the stream was reset.
        """
        while True:
            try:
                frame = self._decoder.next_frame()
            except FramingError as exc:
                raise RemoteNetworkError(NetReason.BAD_FRAME, str(exc)) from exc
            if frame is not None:
                return frame
            chunk = await self.stream.receive_some(max(65536, self._decoder.wanted))
            if not chunk:
                if self._decoder.buffered:
                    raise RemoteNetworkError(NetReason.BAD_FRAME, "stream ended inside a frame")
                return None
            self._decoder.feed(chunk)

    async def aclose(self) -> None:
        await self.stream.aclose()


class Network(Protocol):
    """One node's view of the peer-to-peer network."""

    @property
    def peer_id(self) -> PeerId: ...

    @property
    def listen_addrs(self) -> list[str]:
        """Addresses other nodes can pass to :meth:`connect`, each naming this peer."""

    async def connect(self, addr: str) -> PeerId:
        """Connect to the peer at ``addr`` (which names its peer id); returns that id.

        Connecting again to a peer that restarted, even at a new address, works at once.
        Raises LocalNetworkError(BAD_ADDRESS) or DialError.
        """

    def peers(self) -> frozenset[PeerId]:
        """Peers with a live connection now."""

    async def wait_peers_changed(self) -> None:
        """Return once a connection opened or closed since the call (compare :meth:`peers`).

        Bound it with ``trio.fail_after`` or ``move_on_after``; it waits for ever otherwise.
        """

    async def provide(self, key: str) -> None:
        """Announce that this node serves ``key`` (a provider record in the DHT).

        Records expire and a node that announced before it had peers reached nobody:
        announce again from time to time. Never raises for an unreachable network.
        """

    async def find_providers(self, key: str, limit: int = 20) -> dict[PeerId, list[str]]:
        """Other nodes that announced ``key``, each with addresses to :meth:`connect` to
        in order (direct ones first, then through relays); empty when none are known."""

    async def subscribe(
        self, topic: str, validator: Validator
    ) -> trio.MemoryReceiveChannel[Gossip]:
        """Join ``topic``; accepted messages from other nodes arrive on the channel.

        Raises LocalNetworkError if already subscribed to ``topic``.
        """

    async def publish(self, topic: str, data: bytes) -> None:
        """Queue ``data`` for every subscriber of ``topic``; blocks while the queue is full.

        Raises LocalNetworkError(TOO_LARGE) if ``data`` exceeds the message cap.
        """

    async def flush(self) -> None:
        """Wait until everything published so far has left this node."""

    async def wait_subscribed(self, peer: PeerId, topic: str) -> None:
        """Wait until ``peer``, a connected neighbour, subscribed to ``topic`` and will
        receive what this node publishes there (it joined our mesh for the topic).

        Bound it with ``trio.fail_after``; it waits for ever otherwise.
        """

    def score(self, peer: PeerId) -> float:
        """This node's gossip score for ``peer``; rejected messages make it negative."""

    def queue_depths(self) -> dict[str, int]:
        """Gossip messages waiting now, per queue (``outbox``: published, not yet sent;
        ``peers``: sent to peer queues, not yet written; ``inbound``: accepted, not yet
        taken by the subscriber); for /metrics."""

    async def open_stream(self, peer: PeerId, protocol_id: ProtocolId) -> Stream:
        """Open a stream to ``peer`` speaking ``protocol_id``; with no connection left, the
        peer is dialled again where it was last reached.

        Raises DialError if the peer is unreachable or does not serve the protocol.
        """

    def serve(self, protocol_id: ProtocolId, handler: StreamHandler) -> None:
        """Run ``handler(stream)`` for every inbound stream of ``protocol_id``.

        The stream is closed when the handler returns. Raises
        LocalNetworkError(DUPLICATE_HANDLER) if the protocol already has a handler.
        """
