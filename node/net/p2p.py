"""The libp2p implementation of :class:`~node.net.transport.Network` (libp2p 0.8.1, pinned).

This is the only module of the project that imports libp2p. Each pitfall of 0.8.1
(``../shared/PLATFORM.md``, "libp2p 0.8.1") is handled here on purpose, and
``tests/node/test_network_p2p.py`` holds a regression test for each:

- Identity: the host key is the node's Ed25519 key, so the libp2p peer id is
  ``PrivateKey.peer_id``.
- Security: Noise only, muxer yamux only. ``new_host`` would also offer TLS, SECIO and
  plaintext, and mplex.
- Dial delay: ``Swarm.dial_peer`` waits 250 ms (happy eyeballs) after starting each dial
  unless the dial reaches ``max_connections_per_peer``; with one connection per peer a
  successful dial returns at once. Retries are cut to one so a dead peer fails fast.
- Negative dial cache and stale addresses: after a failed dial the swarm refuses the peer
  id for 60 s, and only the first TCP address in the peerstore is ever tried. An explicit
  :meth:`P2PNetwork.connect` lifts the block (``Swarm.unblock_peer``) and replaces the
  peer's stored addresses with the one given.
- GossipSub drops silently under load. Tuned explicitly: spam protection off (it capped
  10 msg/s per peer and topic, our validator and peer score do that job), adaptive gossip
  off with a fixed 1 s heartbeat (it stretched to 30-60 s), eclipse protection off by
  default (it counts distinct IPs, and a loopback testnet has one). Two queue depths have
  no parameter in 0.8.1 and are raised in :func:`_deepen_pubsub_queues`. And the
  publisher paces and batches: it bundles the messages queued at the moment into one
  pubsub message (``node/net/framing.py``) and holds the next bundle while any peer's
  outbound queue is above a high-water mark, so ``publish`` blocks (backpressure) instead
  of libp2p dropping.
- ``Pubsub.publish`` never yields: the publisher checkpoints after each bundle.
- Signed peer records: pubsub attaches the node's signed peer record to every RPC it
  publishes, rebuilt from ``host.get_addrs()`` (multiaddr parsing) each time, and its
  receiver checks and stores the record of every RPC twice, in pubsub's read loop and in
  GossipSub's handler (a signature check each): about 0.8 ms of CPU per message between
  two nodes, a quarter of a gossiped message's cost.
  :func:`_reuse_peer_records` keeps the record built for 10 s, and takes a record a peer
  sends again unchanged once a minute, which still refreshes its addresses' 2-hour TTL.
- Stream throughput is CPU-bound in py-libp2p (bench/transfer.py), and two yamux defaults
  of 0.8.1 cost about 1 ms of CPU per MB on each side. Both have no parameter and are set
  in :func:`_tune_yamux`; with :func:`_deepen_pubsub_queues`,
  :func:`_defer_read_loop_writes` ("Bulk data both ways") and :func:`_reuse_peer_records`
  they are the only changes this module makes to libp2p; each is process-wide,
  idempotent, read by libp2p at call time, and pinned by a test. Bulk blob transfer
  leaves libp2p for direct channels where it can (node/net/direct.py).

  - Frame size: yamux's ``MAX_MESSAGE_SIZE`` (64 KiB, header included) exceeds a Noise
    message (65535 - 16 tag = 65519 bytes of plaintext), so each full DATA frame was
    encrypted, sent and decrypted as two messages, the second 17 bytes long. It is set to
    65519: a 65507-byte payload plus the 12-byte header is exactly one Noise message.
    The receiving side does not depend on it (it accepts frames up to the window).
  - Window updates: with ``PY_YAMUX_RELEASE_ON_READ`` on (its default) a reader that
    still has a full window of credit outstanding returns the bytes of every read at
    once: one WINDOW_UPDATE frame (a Noise message each way) per read. Off, those bytes
    wait in the stream's pending count and go back with the next update, which libp2p
    sends as soon as a read brings the sender's credit plus the unread bytes below the
    target window, or half a window is pending (go-yamux's batching). So an update is
    skipped only while the sender holds credit: a reader that emptied its buffer has
    just sent one or left the sender a full window. No stall, stream by stream, however
    many streams share the connection (checked with a simulation of 0.8.1's code). The
    price is memory: a stream may buffer up to 1.5 times the 16 MiB maximum window
    instead of about 1.25 times. libp2p's only switch is that environment variable, read
    on every read, so this module sets it (overriding the user's value, and inherited by
    child processes, where only py-libp2p reads it).
- Validation: one libp2p topic validator per topic decodes the bundle and runs the
  caller's validator on each item. REJECT of any item rejects the bundle (not forwarded)
  and lowers the forwarder's score; all-IGNORE drops it without penalty; otherwise the
  accepted items are delivered. 0.8.1 penalises every failed validation and subtracts
  ``p4`` weights (the spec adds negative ones, so a go-style negative weight would
  *raise* the score): the :class:`_VerdictScorer` counts only our REJECTs and the weight
  here is positive; a test asserts the score goes down.
- Shutdown: ``host.close()`` is called (shielded) before leaving ``host.run()``, which
  otherwise leaks sockets.
- Logging: the ``libp2p`` logger is reset by ``import libp2p`` to not propagate; it is
  reconfigured here to propagate into the application's handlers at a chosen level.

- Bulk data both ways: yamux's read loop (``Yamux.handle_incoming``) writes control
  replies itself (the pong to the RTT ping sent 0.5 s after a connection opens and every
  30 s after, the ACK or RST of each new stream) and waited for the connection's write
  lock to do so. When both peers pushed stream data faster than the other read, each
  lock was held by a DATA write blocked on a full socket, neither read loop read again,
  and the connection hung, pubsub included (six 4 MiB streams each way on loopback hung
  three runs in four; rust-yamux has the same flaw, libp2p/rust-yamux#227).
  :func:`_defer_read_loop_writes` hands those replies to one writer task per connection,
  in order, so the read loop never waits on a write and keeps draining the socket, which
  unblocks the other side's writer. The queue is bounded (a peer flooding pings makes
  the read loop wait again, as before, instead of growing memory).
  ``test_large_streams_both_ways_at_once_do_not_deadlock`` pins it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import logging
import os
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import multiaddr
import trio
from libp2p import new_host
from libp2p.abc import IMultiselectCommunicator, IMuxedConn, INetConn, INetwork, INotifee
from libp2p.crypto.ed25519 import Ed25519PrivateKey
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.exceptions import BaseLibp2pError
from libp2p.host.autonat.autonat import AutoNATService, AutoNATStatus
from libp2p.host.basic_host import BasicHost
from libp2p.host.exceptions import StreamFailure
from libp2p.io.exceptions import IOException
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.network.config import ConnectionConfig, RetryConfig
from libp2p.network.exceptions import SwarmException
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.peer import peerstore as peerstore_module
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import InvalidAddrError, info_from_p2p_addr
from libp2p.peer.peerstore import PeerStoreError
from libp2p.protocol_muxer.exceptions import MultiselectClientError, MultiselectCommunicatorError
from libp2p.protocol_muxer.multiselect import is_valid_handshake
from libp2p.protocol_muxer.multiselect_client import (
    DEFAULT_NEGOTIATE_TIMEOUT,
    MULTISELECT_PROTOCOL_ID,
    PROTOCOL_NOT_FOUND_MSG,
    MultiselectClient,
)
from libp2p.pubsub import gossipsub as gossipsub_module
from libp2p.pubsub import pubsub as pubsub_module
from libp2p.pubsub import utils as pubsub_utils
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.rpc_queue import RpcQueue
from libp2p.pubsub.score import PeerScorer, ScoreParams, TopicScoreParams
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.security.noise.io import MAX_PLAINTEXT_LENGTH as NOISE_MAX_PLAINTEXT
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.exceptions import MuxedConnError, MuxedStreamError
from libp2p.stream_muxer.yamux import yamux as yamux_module
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from libp2p.tools.anyio_service import background_trio_service

from node.net.framing import FramingError, bundle_size, decode_bundle, encode_bundle
from node.net.transport import (
    DialError,
    ErrorMap,
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
    map_exceptions,
)
from protocol.identity import PrivateKey

if TYPE_CHECKING:
    from libp2p.abc import INetStream
    from libp2p.pubsub.subscription import TrioSubscriptionAPI
    from trio_typing import TaskStatus  # see node/net/memnet.py: trio-stubs shadow trio

__all__ = [
    "LIBP2P_VERSION",
    "GossipTuning",
    "NatTuning",
    "P2PConfig",
    "P2PNetwork",
    "configure_libp2p_logging",
    "libp2p_key_pair",
    "serve_network",
]

logger = logging.getLogger(__name__)

LIBP2P_VERSION = "0.8.1"
NOISE_ONLY = (str(NOISE_PROTOCOL_ID),)
# A whole yamux frame (12-byte header + payload) per Noise message: see _tune_yamux.
YAMUX_FRAME_SIZE = NOISE_MAX_PLAINTEXT  # 65535 - 16 bytes of Poly1305 tag = 65519

_DIAL_ERRORS: ErrorMap = {
    InvalidAddrError: (LocalNetworkError, NetReason.BAD_ADDRESS),
    StreamFailure: (DialError, NetReason.UNSUPPORTED_PROTOCOL),
    SwarmException: (DialError, NetReason.UNREACHABLE),
    trio.TooSlowError: (DialError, NetReason.UNREACHABLE),
    BaseLibp2pError: (DialError, NetReason.UNREACHABLE),
    OSError: (DialError, NetReason.UNREACHABLE),
}
_STREAM_ERRORS: ErrorMap = {
    IOException: (StreamClosed, NetReason.CLOSED),
    MuxedStreamError: (StreamClosed, NetReason.CLOSED),
    MuxedConnError: (StreamClosed, NetReason.CLOSED),
    BaseLibp2pError: (StreamClosed, NetReason.CLOSED),
    trio.BrokenResourceError: (StreamClosed, NetReason.CLOSED),
    trio.ClosedResourceError: (StreamClosed, NetReason.CLOSED),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class GossipTuning:
    """GossipSub and publisher settings; every default here is chosen, not inherited."""

    degree: int = 6
    degree_low: int = 4
    degree_high: int = 12
    heartbeat_interval: int = 1  # seconds, fixed: adaptive gossip is off
    gossip_window: int = 3
    gossip_history: int = 5
    eclipse_protection: bool = False  # needs >= 3 distinct IPs; loopback has one
    # Depths libp2p 0.8.1 hard-codes at 32 (see _deepen_pubsub_queues).
    peer_queue_depth: int = 4096
    subscription_depth: int = 8192
    # Publisher: batch what is queued, hold while a peer queue is above the mark.
    outbox_size: int = 4096  # messages publish() may queue before it blocks
    bundle_max_bytes: int = 64 * 1024
    bundle_max_items: int = 1024
    bundle_linger: float = 0.001  # seconds to wait for company before a lone message
    high_water: int = 8  # bundles queued to one peer before the publisher waits
    # Peer score: p4 (invalid messages). Positive: 0.8.1 subtracts it (see module doc).
    invalid_message_weight: float = 10.0
    invalid_message_decay: float = 0.98  # per heartbeat
    gossip_threshold: float = -100.0
    publish_threshold: float = -500.0
    graylist_threshold: float = -1000.0


@dataclass(frozen=True, slots=True, kw_only=True)
class NatTuning:
    """Reaching and being reached from behind NAT: AutoNAT, circuit relay v2, DCUtR."""

    enabled: bool = True
    relay_service: bool = True  # relay for peers behind NAT (circuit v2 hop)
    check_interval: float = 30.0  # seconds between AutoNAT rounds (sooner on new peers)
    servers: int = 4  # peers asked to dial us back per round
    confirmations: int = 2  # agreeing verdicts before the reachability flips
    dial_back_timeout: float = 5.0
    relays: int = 2  # reservations a node behind NAT keeps
    # What one relay gives the peers behind NAT it serves (0.8.1's defaults: 1 h, 1 GiB).
    circuit_duration: int = 3600
    circuit_bytes: int = 1 << 30
    max_circuits: int = 64
    max_reservations: int = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class P2PConfig:
    """How a node joins the libp2p network."""

    listen_addrs: tuple[str, ...] = ("/ip4/127.0.0.1/tcp/0",)
    bootstrap: tuple[str, ...] = ()  # multiaddrs ending in /p2p/<peer id>
    enable_dht: bool = True
    enable_mdns: bool = False  # binds every interface: opt-in only
    max_message_size: int = 256 * 1024  # one gossip message (one bundle item)
    dial_timeout: float = 10.0
    close_timeout: float = 5.0
    log_level: int = logging.WARNING
    gossip: GossipTuning = field(default_factory=GossipTuning)
    nat: NatTuning = field(default_factory=NatTuning)


def configure_libp2p_logging(level: int = logging.WARNING) -> None:
    """Make the ``libp2p`` logger behave like any other library logger.

    ``import libp2p`` runs ``setup_logging()``, which clears its handlers and sets
    ``propagate = False`` unless ``LIBP2P_DEBUG`` is set, so its warnings (including the
    pubsub drop warnings) would vanish. Here it propagates to the root handlers.
    """
    lib_logger = logging.getLogger("libp2p")
    lib_logger.handlers.clear()
    lib_logger.propagate = True
    lib_logger.setLevel(level)
    # Some modules pin their own level (auto_connector: INFO); make them inherit ours.
    for name, child in logging.Logger.manager.loggerDict.items():
        if name.startswith("libp2p.") and isinstance(child, logging.Logger):
            child.setLevel(logging.NOTSET)


class _DeepRpcQueue(RpcQueue):
    depth = 32

    def __init__(self, max_size: int = 32, max_message_size: int = 1 << 20) -> None:
        super().__init__(max(max_size, type(self).depth), max_message_size)


def _deepen_pubsub_queues(tuning: GossipTuning) -> None:
    """Raise the two pubsub queue depths that libp2p 0.8.1 offers no parameter for.

    - ``Pubsub._handle_new_peer`` builds each peer's outbound ``RpcQueue()`` with its
      default depth of 32 (bound when the class was defined); a full queue drops the RPC.
      The module's ``RpcQueue`` name is pointed at a subclass with a deeper default.
    - ``Pubsub.subscribe`` opens the delivery channel with the module constant
      ``SUBSCRIPTION_CHANNEL_SIZE`` (32); ``notify_subscriptions`` drops when it is full.

    Both are module globals read at call time; this is process-wide, idempotent, and only
    ever deepens. Checked by ``test_gossipsub_is_tuned_and_pubsub_queues_are_deepened``.
    """
    _DeepRpcQueue.depth = max(_DeepRpcQueue.depth, tuning.peer_queue_depth)
    pubsub_module.RpcQueue = _DeepRpcQueue  # type: ignore[attr-defined]
    pubsub_module.SUBSCRIPTION_CHANNEL_SIZE = max(
        pubsub_module.SUBSCRIPTION_CHANNEL_SIZE, tuning.subscription_depth
    )


def _tune_yamux() -> None:
    """Send each yamux DATA frame as one Noise message, window updates in batches, and
    the read loop's control replies from a writer task of their own.

    Both settings are explained in the module docstring ("Stream throughput").
    ``Yamux``/``YamuxStream`` take no options, and 0.8.1 reads both at call time:
    ``YamuxStream.write`` sizes frames from the module global ``MAX_MESSAGE_SIZE`` (the
    frame, header included: the payload is ``MAX_MESSAGE_SIZE - HEADER_SIZE``), and
    ``_auto_tune_and_send_window_update`` reads ``PY_YAMUX_RELEASE_ON_READ`` on each read.
    Process-wide and idempotent. Checked by ``test_yamux_frames_fill_one_noise_message``,
    ``test_yamux_window_updates_are_batched`` and
    ``test_many_large_streams_complete_under_flow_control``.
    """
    yamux_module.MAX_MESSAGE_SIZE = YAMUX_FRAME_SIZE
    os.environ["PY_YAMUX_RELEASE_ON_READ"] = "0"
    _defer_read_loop_writes()


_IN_READ_LOOP = contextvars.ContextVar("cx_yamux_read_loop", default=False)
_CONTROL_QUEUE = 256  # control frames (12 bytes each) waiting for the writer, per connection
_control_queues: weakref.WeakKeyDictionary[Yamux, trio.MemorySendChannel[bytes]] = (
    weakref.WeakKeyDictionary()
)
_PATCHED: list[str] = []  # what the functions below changed, so each changes it once
_WRITE_FAILURES = (BaseLibp2pError, trio.BrokenResourceError, trio.ClosedResourceError, OSError)


def _defer_read_loop_writes() -> None:
    """Make yamux's read loop queue its control replies instead of writing them (module
    docstring, "Bulk data both ways"). Process-wide and idempotent, like the settings."""
    if "read-loop writes" in _PATCHED:
        return
    _PATCHED.append("read-loop writes")
    read_loop, write_frame = Yamux.handle_incoming, Yamux._write_frame

    async def handle_incoming(self: Yamux) -> None:
        _IN_READ_LOOP.set(True)  # this task's context only: the read loop runs in its own
        await read_loop(self)

    async def deferred_write_frame(self: Yamux, data: bytes) -> None:
        if not _IN_READ_LOOP.get() or self._nursery is None:
            await write_frame(self, data)
            return
        queue = _control_queues.get(self)
        if queue is None:
            queue, pending = trio.open_memory_channel[bytes](_CONTROL_QUEUE)
            _control_queues[self] = queue
            self._nursery.start_soon(_write_control_frames, self, pending, write_frame)
        await queue.send(data)

    Yamux.handle_incoming = handle_incoming  # type: ignore[method-assign]
    Yamux._write_frame = deferred_write_frame  # type: ignore[method-assign]


async def _write_control_frames(
    muxer: Yamux,
    pending: trio.MemoryReceiveChannel[bytes],
    write_frame: Callable[[Yamux, bytes], Awaitable[None]],
) -> None:
    """The writer of one connection's deferred control frames, in the order queued."""
    async for data in pending:
        try:
            await write_frame(muxer, data)
        except _WRITE_FAILURES as exc:  # the connection is going; its read loop sees it too
            logger.debug("yamux control write to %s failed: %s", muxer.peer_id, exc)
            return


PEER_RECORD_BUILT_FOR_S = 10.0  # our record is rebuilt after this (new addresses)
PEER_RECORD_TAKEN_FOR_S = 60.0  # a peer's unchanged record is taken again after this
_PEER_RECORDS_KEPT = 4096  # peers whose last record is remembered, per host


def _reuse_peer_records() -> None:
    """Build our signed peer record once per ``PEER_RECORD_BUILT_FOR_S`` rather than for
    every pubsub RPC, and take a peer's record again only when it changed or after
    ``PEER_RECORD_TAKEN_FOR_S`` (module docstring, "Signed peer records"). Pubsub and
    GossipSub look both functions up in their modules at call time; ours call libp2p's in
    the modules that define them. Process-wide and idempotent. Checked by
    ``test_gossip_builds_and_checks_a_peer_record_once_not_per_message``.
    """
    if "peer records" in _PATCHED:
        return
    _PATCHED.append("peer records")
    built: weakref.WeakKeyDictionary[Any, tuple[bytes, float]] = weakref.WeakKeyDictionary()
    taken: weakref.WeakKeyDictionary[Any, dict[ID, tuple[bytes, float]]] = (
        weakref.WeakKeyDictionary()
    )

    def record_to_send(host: Any) -> tuple[bytes, bool]:  # noqa: ANN401 - libp2p's IHost
        now = time.monotonic()
        kept = built.get(host)
        if kept is not None and now - kept[1] < PEER_RECORD_BUILT_FOR_S:
            return kept[0], False
        envelope, fresh = peerstore_module.env_to_send_in_RPC(host)
        built[host] = (envelope, now)
        return envelope, fresh

    def take_record(rpc: rpc_pb2.RPC, host: Any, peer_id: ID) -> bool:  # noqa: ANN401
        if not rpc.HasField("senderRecord"):
            return True
        record, now = rpc.senderRecord, time.monotonic()
        last = taken.setdefault(host, {})
        seen = last.get(peer_id)
        if seen is not None and seen[0] == record and now - seen[1] < PEER_RECORD_TAKEN_FOR_S:
            return True  # the same bytes, checked and stored a moment ago
        if not pubsub_utils.maybe_consume_signed_record(rpc, host, peer_id):
            return False
        if len(last) >= _PEER_RECORDS_KEPT:
            last.clear()
        last[peer_id] = (record, now)
        return True

    for module in (pubsub_module, gossipsub_module):
        module.env_to_send_in_RPC = record_to_send  # type: ignore[attr-defined]
        module.maybe_consume_signed_record = take_record  # type: ignore[attr-defined]


class _PipelinedSelect(MultiselectClient):
    """Ask for a stream's one protocol in the same flight as the multistream header.

    0.8.1's client waits for the answer to its header before it names the protocol: one
    round trip more per stream than the protocol needs, and under load the larger part of
    a short request's time (node/market/joblink.py). The answering side reads the two
    messages in order as before (it sends its own header first, unasked), so only the
    waiting changes. Offers of several protocols go the old way.
    """

    async def select_one_of(
        self,
        protocols: Sequence[TProtocol],
        communicator: IMultiselectCommunicator,
        negotiate_timeout: int = DEFAULT_NEGOTIATE_TIMEOUT,
    ) -> TProtocol:
        if len(protocols) != 1 or protocols[0] is None:
            return await super().select_one_of(protocols, communicator, negotiate_timeout)
        [protocol] = protocols
        with trio.move_on_after(negotiate_timeout):
            try:
                await communicator.write(MULTISELECT_PROTOCOL_ID)
                await communicator.write(protocol)
                handshake = await communicator.read()
                answer = await communicator.read()
            except MultiselectCommunicatorError as exc:
                raise MultiselectClientError(f"negotiating {protocol}: {exc}") from exc
            if not is_valid_handshake(handshake):
                raise MultiselectClientError(f"multistream header mismatch: {handshake!r}")
            if answer == protocol:
                return protocol
            if answer == PROTOCOL_NOT_FOUND_MSG:
                raise MultiselectClientError(f"protocol not supported: {protocol}")
            raise MultiselectClientError(f"unrecognized answer {answer!r} to {protocol}")
        raise MultiselectClientError(f"no answer within {negotiate_timeout}s for {protocol}")


def _check_libp2p_version() -> None:
    if version("libp2p") != LIBP2P_VERSION:  # pragma: no cover - guard for upgrades
        logger.warning(
            "libp2p %s is not %s: re-check node/net/p2p.py's settings of libp2p internals "
            "(_deepen_pubsub_queues, _tune_yamux)",
            version("libp2p"),
            LIBP2P_VERSION,
        )


class _VerdictScorer(PeerScorer):
    """Counts invalid messages only when our validator said REJECT.

    0.8.1's ``Pubsub.push_msg`` calls ``on_invalid_message`` for every message whose
    validator returned False, which is also how IGNORE has to be expressed (there is no
    third outcome). So that hook does nothing and :meth:`penalise` does the counting.
    """

    def on_invalid_message(self, peer: ID, topic: str) -> None:
        return None

    def penalise(self, peer: ID, topic: str) -> None:
        super().on_invalid_message(peer, topic)


def libp2p_key_pair(key: PrivateKey) -> KeyPair:
    """The node's Ed25519 key as a libp2p key pair (same peer id)."""
    private = Ed25519PrivateKey.from_bytes(key.seed)
    return KeyPair(private, private.get_public_key())


def _score_params(tuning: GossipTuning) -> ScoreParams:
    return ScoreParams(
        p4_invalid_messages=TopicScoreParams(
            weight=tuning.invalid_message_weight,
            cap=1e6,
            decay=tuning.invalid_message_decay,
        ),
        gossip_threshold=tuning.gossip_threshold,
        publish_threshold=tuning.publish_threshold,
        graylist_threshold=tuning.graylist_threshold,
    )


def _build_host(key: PrivateKey, config: P2PConfig) -> BasicHost:
    key_pair = libp2p_key_pair(key)
    security = {
        NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=new_x25519_key_pair().private_key)
    }
    connections = ConnectionConfig(
        # One connection per peer: a successful dial then cancels the 250 ms wait.
        max_connections_per_peer=1,
        # Quiet auto-connector: it aims at (low + high) / 2 = 150 connections and would
        # dial every stored peer every 30 s; we dial who we are told to.
        min_connections=0,
        low_watermark=0,
        auto_connect_interval=24 * 3600.0,
        dial_timeout=config.dial_timeout,
    )
    host = new_host(
        key_pair=key_pair,
        sec_opt=security,
        muxer_opt={TProtocol(YAMUX_PROTOCOL_ID): Yamux},  # the default also offers mplex
        listen_addrs=[multiaddr.Multiaddr(a) for a in config.listen_addrs],
        enable_mDNS=config.enable_mdns,
        connection_config=connections,
    )
    swarm: Any = host.get_network()
    swarm.retry_config = RetryConfig(max_retries=1, initial_delay=0.05, max_delay=0.2)
    if not isinstance(host, BasicHost):  # pragma: no cover - new_host's contract
        raise TypeError(f"unexpected host type {type(host).__name__}")
    host.multiselect_client = _PipelinedSelect()
    return host


@functools.lru_cache(maxsize=4096)
def _peer(peer_id: ID) -> PeerId:
    # Asked for every gossip delivery and stream; base58 in Python costs ~24 µs each time.
    return PeerId(peer_id.to_base58())


def _dht_key(key: str) -> str:
    """A provider-record key as libp2p takes it: the hex of a sha2-256 multihash."""
    return "1220" + hashlib.sha256(key.encode()).hexdigest()


def _without_peer(addr: multiaddr.Multiaddr) -> str:
    with contextlib.suppress(Exception):
        peer = addr.value_for_protocol("p2p")
        if peer:
            return str(addr.decapsulate(multiaddr.Multiaddr(f"/p2p/{peer}")))
    return str(addr)


@dataclass(slots=True)
class _Outgoing:
    topic: str
    data: bytes


class _Libp2pStream:
    """A libp2p ``INetStream`` behind our :class:`~node.net.transport.Stream`."""

    __slots__ = ("_closed", "_remote", "_stream")

    def __init__(self, stream: INetStream, remote: PeerId) -> None:
        self._stream = stream
        self._remote = remote
        self._closed = False

    @property
    def remote_peer(self) -> PeerId:
        return self._remote

    @property
    def remote_host(self) -> str | None:
        if _is_relayed(self._stream.muxed_conn):  # the address would be the relay's
            return None
        address = self._stream.get_remote_address()
        return None if address is None else address[0]

    async def send_all(self, data: bytes) -> None:
        if self._closed:
            raise StreamClosed(NetReason.CLOSED, "send on a closed stream")
        with map_exceptions(_STREAM_ERRORS, f"send to {self._remote}"):
            await self._stream.write(data)

    async def receive_some(self, max_bytes: int = 65536) -> bytes:
        if self._closed:
            raise StreamClosed(NetReason.CLOSED, "receive on a closed stream")
        try:
            with map_exceptions(_STREAM_ERRORS, f"receive from {self._remote}"):
                return bytes(await self._stream.read(max_bytes))
        except StreamClosed as exc:
            if isinstance(exc.__cause__, StreamEOF):
                return b""
            raise

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(BaseLibp2pError, trio.BrokenResourceError, OSError):
            await self._stream.close()


def _is_relayed(conn: INetConn | IMuxedConn) -> bool:
    return any("/p2p-circuit" in str(a) for a in conn.get_transport_addresses())


def _ip(addr: multiaddr.Multiaddr) -> str | None:
    for proto in ("ip4", "ip6"):
        with contextlib.suppress(Exception):
            value = addr.value_for_protocol(proto)
            if value:
                return str(value)
    return None


def _tcp_target(addr: multiaddr.Multiaddr) -> tuple[str, int] | None:
    ip = _ip(addr)
    with contextlib.suppress(Exception):
        port = addr.value_for_protocol("tcp")
        if ip is not None and port:
            return ip, int(port)
    return None


class _DialBackAutoNAT(AutoNATService):
    """AutoNAT (v1) whose dial-back is a fresh TCP connection.

    0.8.1's server dials back with ``host.connect``, which returns at once when the asking
    peer is connected, and it always is: it asked over that connection. So every address
    that passes the observed-IP check was reported reachable, from behind NAT too. A
    reachable address accepts a new TCP connection; one behind NAT drops it unanswered.
    Pinned by ``test_autonat_dial_back_opens_a_new_connection``.
    """

    def __init__(self, host: BasicHost, *, confirmations: int, timeout: float) -> None:
        super().__init__(host, serve=True, confirmations=confirmations)
        self._timeout = timeout

    async def _try_dial(self, peer_id: ID, addrs: list[bytes]) -> bytes | None:
        for raw in addrs:
            with contextlib.suppress(Exception):
                target = _tcp_target(multiaddr.Multiaddr(raw))
                if target is None:
                    continue
                with trio.move_on_after(self._timeout):
                    stream = await trio.open_tcp_stream(*target)
                    await stream.aclose()
                    return bytes(raw)
        return None


class _NoCircuitTable(dict[ID, Any]):
    """Stays empty: see :class:`_CircuitRelay`."""

    def __setitem__(self, key: ID, value: Any) -> None:  # noqa: ANN401 - libp2p's streams
        return None


class _CircuitRelay(CircuitV2Protocol):
    """Circuit relay v2 whose circuits end one at a time.

    0.8.1 keeps its live circuits in a table keyed by peer id, and each relay direction,
    when it ends, closes the two streams the table holds for its peer: those of whichever
    circuit of that peer was registered last. So one circuit ending (a dialer that got a
    direct connection, say) cut every other circuit to or from the same peer. Here the
    table stays empty and each direction closes its own circuit's two streams. Pinned by
    ``test_one_circuit_ending_leaves_the_others_to_the_same_peer``.
    """

    def __init__(self, host: BasicHost, *, limits: RelayLimits, allow_hop: bool) -> None:
        super().__init__(host, limits=limits, allow_hop=allow_hop)
        self._active_relays = _NoCircuitTable()

    async def _relay_data(
        self,
        src_stream: INetStream,
        dst_stream: INetStream,
        peer_id: ID,
        deadline: float | None = None,
        circuit_data_limit: list[int] | None = None,
    ) -> None:
        try:
            await super()._relay_data(src_stream, dst_stream, peer_id, deadline, circuit_data_limit)
        finally:
            await self._close_stream(src_stream)
            await self._close_stream(dst_stream)


class _InboundDCUtR(DCUtRProtocol):
    """DCUtR started only by the side that accepted the relayed connection.

    The DCUtR spec has the inbound side (B, behind NAT) try a direct dial first and start
    the protocol if that fails. 0.8.1's loop starts it from both sides at once: the two
    sessions dial the same addresses from the same listen port, the second's dials fail
    with EADDRNOTAVAIL, and the timing the hole punch needs is lost (1 in 8 punches
    between two NATs failed so, in ``tests/node/test_netns_p2p.py``).
    """

    async def initiate_hole_punch(self, peer_id: ID) -> bool:
        swarm: Any = self.host.get_network()
        accepted = [
            c
            for c in swarm.get_connections(peer_id)
            if not c.is_closed and _is_relayed(c) and not c.muxed_conn.is_initiator
        ]
        if not accepted:
            return False
        return await super().initiate_hole_punch(peer_id)


class _Nat:
    """Reachability and the ways around NAT, all from libp2p 0.8.1's own parts.

    - AutoNAT: every ``check_interval`` (and when new peers connect) up to ``servers``
      directly connected peers are asked to dial us back; ``confirmations`` agreeing
      verdicts make us PUBLIC or PRIVATE.
    - Circuit relay v2: every node accepts relayed connections (stop) and, unless
      ``relay_service`` is off, relays for others (hop). A PRIVATE node, or one that no
      peer could dial back yet (:attr:`unreached`: one verdict is all a node behind NAT
      with a single public peer ever gets), keeps reservations on up to ``relays`` relays
      and advertises ``<relay>/p2p-circuit/p2p/<us>`` first (:meth:`circuit_addrs`); a
      PRIVATE node's DHT turns client-only, since nobody can dial it. A
      relay is a peer seen at an address it listens on (so not behind NAT itself),
      bootstrap peers first.
    - DCUtR: its own loop upgrades every relayed connection to a direct one, by a direct
      dial when the other side is reachable, by TCP simultaneous open through both NATs
      otherwise; the relayed connection is closed a minute after.
    """

    def __init__(self, host: BasicHost, tuning: NatTuning, bootstrap: tuple[str, ...]) -> None:
        self.host = host
        self.tuning = tuning
        limits = RelayLimits(
            duration=tuning.circuit_duration,
            data=tuning.circuit_bytes,
            max_circuit_conns=tuning.max_circuits,
            max_reservations=tuning.max_reservations,
        )
        self.protocol = _CircuitRelay(host, limits=limits, allow_hop=tuning.relay_service)
        roles = RelayRole.STOP | RelayRole.CLIENT
        if tuning.relay_service:
            roles |= RelayRole.HOP
        self.transport = CircuitV2Transport(
            host, self.protocol, RelayConfig(roles=roles, limits=limits)
        )
        self.dcutr = _InboundDCUtR(host)
        self.autonat = _DialBackAutoNAT(
            host, confirmations=tuning.confirmations, timeout=tuning.dial_back_timeout
        )
        self.relays: dict[ID, str] = {}  # relay -> its address, where we hold a reservation
        self._bootstrap = [_bootstrap_id(a) for a in bootstrap]
        self._nursery: trio.Nursery | None = None  # reservations refresh in it

    @property
    def private(self) -> bool:
        return self.autonat.get_status() == AutoNATStatus.PRIVATE

    @property
    def unreached(self) -> bool:
        """Every peer that tried to dial us back failed, too few yet for a verdict: a node
        behind NAT whose only direct peer is its bootstrap node stays here for good."""
        results = self.autonat.dial_results
        return bool(results) and not any(results.values())

    @property
    def reachability(self) -> str:
        return {AutoNATStatus.PUBLIC: "public", AutoNATStatus.PRIVATE: "private"}.get(
            self.autonat.get_status(), "unknown"
        )

    def circuit_addrs(self) -> list[str]:
        me = self.host.get_id()
        return [f"{addr}/p2p/{relay}/p2p-circuit/p2p/{me}" for relay, addr in self.relays.items()]

    def _direct(self, peer: ID) -> list[INetConn]:
        swarm: Any = self.host.get_network()
        return [c for c in swarm.get_connections(peer) if not c.is_closed and not _is_relayed(c)]

    def relay_address(self, peer: ID) -> str | None:
        """Where ``peer`` listens, if we see it there directly (it is not behind NAT)."""
        seen = {_ip(a) for c in self._direct(peer) for a in c.get_transport_addresses()}
        try:
            stored = self.host.get_peerstore().addrs(peer)
        except PeerStoreError:  # an inbound peer that told us nothing yet
            return None
        for addr in stored:
            target = _tcp_target(addr)
            if target is not None and target[0] in seen and "/p2p-circuit" not in str(addr):
                return f"/ip4/{target[0]}/tcp/{target[1]}"
        return None

    def relay_candidates(self) -> list[tuple[ID, str]]:
        swarm: Any = self.host.get_network()
        peers = sorted(swarm.connections, key=lambda p: p not in self._bootstrap)
        found = []
        for peer in peers:
            addr = self.relay_address(peer)
            if addr is not None:
                found.append((peer, addr))
        return found

    async def run(self, changed: Callable[[], trio.Event]) -> None:
        """Check reachability and keep reservations while the node runs."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            while True:
                wake = changed()
                try:
                    await self._check()
                except Exception:
                    # Top of one round: a libp2p surprise costs this round, not the node.
                    logger.exception("reachability check failed; trying again later")
                with trio.move_on_after(self.tuning.check_interval):
                    await wake.wait()
                    await trio.sleep(0.5)  # a burst of connections: one round after it

    async def _check(self) -> None:
        swarm: Any = self.host.get_network()
        for relay in [r for r in self.relays if not self._direct(r)]:
            logger.info("relay %s is gone; its reservation with it", relay)
            del self.relays[relay]
        asked = set(self.autonat.dial_results)
        servers = [p for p in swarm.connections if self._direct(p) and p not in asked]
        if servers:
            before = self.reachability
            await self.autonat.check_reachability(servers[: self.tuning.servers])
            if self.reachability != before:
                logger.info("AutoNAT: this node is %s", self.reachability)
        if self.private or self.unreached:  # a relay slot costs little; unreachable costs all
            await self._reserve()

    async def _reserve(self) -> None:
        for relay, addr in self.relay_candidates():
            if len(self.relays) >= self.tuning.relays:
                return
            if relay in self.relays:
                continue
            assert self._nursery is not None
            try:
                with trio.fail_after(self.tuning.dial_back_timeout * 2):
                    stream = await self.host.new_stream(relay, [HOP_PROTOCOL_ID])
                    reserved = await self.transport.reserve(stream, relay, self._nursery)
            except (BaseLibp2pError, trio.TooSlowError, OSError) as exc:
                logger.info("no reservation with %s: %s", relay, exc)
                continue
            if reserved:
                self.relays[relay] = addr
                logger.info("reserved a relay slot with %s at %s", relay, addr)


def _bootstrap_id(addr: str) -> ID | None:
    with contextlib.suppress(Exception):
        return info_from_p2p_addr(multiaddr.Multiaddr(addr)).peer_id
    return None


class _ConnectionEvents(INotifee):
    """Wakes whoever waits when any connection opens or closes (libp2p's notifee hook)."""

    def __init__(self) -> None:
        self.changed = trio.Event()

    def _touch(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        self._touch()

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        self._touch()

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        return None

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        return None

    async def listen(self, network: INetwork, multiaddr: multiaddr.Multiaddr) -> None:
        return None

    async def listen_close(self, network: INetwork, multiaddr: multiaddr.Multiaddr) -> None:
        return None


class P2PNetwork:
    """A running libp2p node; obtained from :func:`serve_network`."""

    def __init__(
        self,
        key: PrivateKey,
        config: P2PConfig,
        host: BasicHost,
        pubsub: Pubsub,
        router: GossipSub,
        scorer: _VerdictScorer,
        dht: KadDHT | None,
        nat: _Nat | None,
    ) -> None:
        self.config = config
        self.host = host
        self.pubsub = pubsub
        self.router = router
        self.dht = dht
        self.nat = nat
        self._events = _ConnectionEvents()
        host.get_network().register_notifee(self._events)
        self._scorer = scorer
        self._peer_id = key.peer_id
        self._own_id = host.get_id()
        self._running = False
        self._nursery: trio.Nursery | None = None
        self._handlers: dict[ProtocolId, StreamHandler] = {}
        self._subscribed: set[str] = set()
        # Where each peer was last reached (connect), newest first: libp2p's peerstore
        # forgets a peer's addresses once its connection is gone, so open_stream to a peer
        # that restarted (or was cut off a while) found "no known addresses".
        self._reached: dict[ID, list[str]] = {}
        # Accepted items of each bundle, keyed by libp2p message id, between the
        # validator (which decides) and the delivery task (which hands them over).
        self._accepted: dict[tuple[bytes, bytes], list[bytes]] = {}
        tuning = config.gossip
        self._outbox_send, self._outbox_receive = trio.open_memory_channel[_Outgoing](
            tuning.outbox_size
        )
        self._queued = 0
        self._sent = 0
        self._progress = trio.Event()
        self.stats: dict[str, int] = {
            "published": 0,
            "bundles": 0,
            "delivered": 0,
            "rejected": 0,
            "ignored": 0,
            "held_for_room": 0,
        }

    # -- identity and peers -------------------------------------------------------------

    @property
    def peer_id(self) -> PeerId:
        return self._peer_id

    @property
    def listen_addrs(self) -> list[str]:
        """Where to dial us: behind NAT, through our relays first."""
        direct = [str(a) for a in self.host.get_addrs()]
        if self.nat is None:
            return direct
        return self.nat.circuit_addrs() + direct  # none unless we hold reservations

    @property
    def reachability(self) -> str:
        """What AutoNAT found: ``public``, ``private`` (behind NAT) or ``unknown``."""
        return "unknown" if self.nat is None else self.nat.reachability

    def connection_kinds(self, peer: PeerId) -> set[str]:
        """``direct`` and/or ``relayed``: how we are connected to ``peer`` now."""
        swarm: Any = self.host.get_network()
        conns = [c for c in swarm.get_connections(ID.from_base58(peer)) if not c.is_closed]
        return {"relayed" if _is_relayed(c) else "direct" for c in conns}

    async def wait_peers_changed(self) -> None:
        await self._events.changed.wait()

    def offered_security(self) -> tuple[str, ...]:
        """Security protocols this host negotiates, in preference order."""
        swarm: Any = self.host.get_network()
        return tuple(str(p) for p in swarm.upgrader.security_multistream.transports)

    def offered_muxers(self) -> tuple[str, ...]:
        """Stream multiplexers this host negotiates, in preference order."""
        swarm: Any = self.host.get_network()
        return tuple(str(p) for p in swarm.upgrader.muxer_multistream.transports)

    def peers(self) -> frozenset[PeerId]:
        swarm: Any = self.host.get_network()
        return frozenset(
            _peer(peer)
            for peer, conns in swarm.connections.items()
            if any(not c.is_closed for c in conns)
        )

    def _has_live_connection(self, peer: ID) -> bool:
        swarm: Any = self.host.get_network()
        return any(not c.is_closed for c in swarm.get_connections(peer))

    def _check_running(self) -> None:
        if not self._running:
            raise LocalNetworkError(NetReason.NOT_RUNNING, "the libp2p node is not running")

    async def connect(self, addr: str) -> PeerId:
        self._check_running()
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        except (InvalidAddrError, ValueError, TypeError) as exc:
            raise LocalNetworkError(
                NetReason.BAD_ADDRESS, f"{addr!r} is not a multiaddr ending in /p2p/<id>"
            ) from exc
        if info.peer_id == self._own_id:
            raise LocalNetworkError(NetReason.BAD_ADDRESS, "refusing to dial ourselves")
        swarm: Any = self.host.get_network()
        with (
            map_exceptions(_DIAL_ERRORS, f"dial {addr}"),
            trio.fail_after(self.config.dial_timeout),
        ):
            circuit = "/p2p-circuit" in addr
            if circuit and not self._has_live_connection(info.peer_id):
                if self.nat is None:
                    raise LocalNetworkError(
                        NetReason.BAD_ADDRESS, f"{addr}: relayed dials need NAT traversal on"
                    )
                # The swarm never dials /p2p-circuit addresses; the relay transport does.
                await self.nat.transport.dial(multiaddr.Multiaddr(addr))
            elif not self._has_live_connection(info.peer_id):
                # Redial. BasicHost.connect returns early while the swarm still lists a
                # closed connection; the swarm refuses a peer for 60 s after a failed
                # dial; and it dials only the first stored TCP address (a stale one).
                # Drop all three before dialing the address we were given.
                if swarm.get_connections(info.peer_id):
                    await swarm.close_peer(info.peer_id)
                swarm.unblock_peer(info.peer_id)
                self.host.get_peerstore().clear_addrs(info.peer_id)
                await self.host.connect(info)
        if not self._has_live_connection(info.peer_id):
            raise DialError(NetReason.UNREACHABLE, f"dial {addr}: no connection came up")
        known = self._reached.setdefault(info.peer_id, [])
        if addr in known:
            known.remove(addr)
        known.insert(0, addr)
        del known[4:]
        if self.dht is not None:
            with contextlib.suppress(BaseLibp2pError, OSError):
                await self.dht.add_peer(info.peer_id)
        return _peer(info.peer_id)

    # -- discovery: DHT provider records ---------------------------------------------------

    def _dialable(self, peer: ID, addrs: list[multiaddr.Multiaddr]) -> list[str]:
        """Addresses to try for ``peer``: its direct ones, then through relays we know."""
        direct = [f"{_without_peer(a)}/p2p/{peer}" for a in addrs if "/p2p-circuit" not in str(a)]
        relayed = []
        if self.nat is not None:
            relayed = [
                f"{addr}/p2p/{relay}/p2p-circuit/p2p/{peer}"
                for relay, addr in self.nat.relay_candidates()[:3]
                if relay != peer
            ]
        return direct + relayed

    async def _redial(self, peer: ID) -> None:
        """Dial a peer we have no connection to: where it was last reached, else where the
        DHT says it is (a peer only heard of through gossip has no address here yet), and
        last through our relays (a peer behind NAT holds a slot on the public ones)."""
        candidates = list(self._reached.get(peer, ()))
        if not candidates and self.dht is not None:
            with trio.move_on_after(self.config.dial_timeout):
                info = await self.dht.find_peer(peer)
                if info is not None:
                    candidates = self._dialable(peer, list(info.addrs))
        candidates += [a for a in self._dialable(peer, []) if a not in candidates]
        for addr in candidates:
            with contextlib.suppress(DialError, LocalNetworkError):
                await self.connect(addr)
                return

    async def _tend_dht(self, dht: KadDHT) -> None:
        """Put every connected peer in the routing table (0.8.1 adds only those we dial
        through it), and turn client-only once AutoNAT says nobody can dial us."""
        known: set[ID] = set()
        while True:
            changed = self._events.changed
            swarm: Any = self.host.get_network()
            for peer in set(swarm.connections) - known:
                with contextlib.suppress(BaseLibp2pError, OSError):
                    await dht.add_peer(peer)
            known = set(swarm.connections)
            if self.nat is not None and self.nat.private and dht.mode == DHTMode.SERVER:
                await dht.switch_mode(DHTMode.CLIENT)
            with trio.move_on_after(self.config.nat.check_interval):
                await changed.wait()

    async def provide(self, key: str) -> None:
        if self.dht is None:
            return
        with trio.move_on_after(self.config.dial_timeout * 3):
            await self.dht.provide(_dht_key(key))

    async def find_providers(self, key: str, limit: int = 20) -> dict[PeerId, list[str]]:
        if self.dht is None:
            return {}
        with trio.move_on_after(self.config.dial_timeout * 3):
            infos = await self.dht.find_providers(_dht_key(key), limit)
            found: dict[PeerId, list[str]] = {}
            for info in infos:
                if info.peer_id != self._own_id:
                    found[_peer(info.peer_id)] = self._dialable(info.peer_id, info.addrs)
            return found
        return {}

    # -- gossip ---------------------------------------------------------------------------

    async def subscribe(
        self, topic: str, validator: Validator
    ) -> trio.MemoryReceiveChannel[Gossip]:
        self._check_running()
        if topic in self._subscribed:
            raise LocalNetworkError(NetReason.DUPLICATE_HANDLER, f"already subscribed to {topic}")
        assert self._nursery is not None
        self._subscribed.add(topic)
        self.pubsub.set_topic_validator(
            topic, self._make_hook(topic, validator), is_async_validator=False
        )
        subscription: TrioSubscriptionAPI = await self.pubsub.subscribe(topic)  # type: ignore[assignment]
        send, receive = trio.open_memory_channel[Gossip](self.config.gossip.subscription_depth)
        self._nursery.start_soon(self._deliver, subscription, send)
        return receive

    def _make_hook(self, topic: str, validator: Validator) -> Callable[[ID, rpc_pb2.Message], bool]:
        def hook(forwarder: ID, msg: rpc_pb2.Message) -> bool:
            # Runs inside Pubsub.push_msg, once per message id, before anything is
            # delivered or forwarded; True forwards the whole bundle.
            author = ID(msg.from_id)
            if author == self._own_id:
                return True  # our own bundle, on its way out
            try:
                items = decode_bundle(msg.data)
            except FramingError:
                self._reject(forwarder, topic, author, "malformed bundle")
                return False
            accepted: list[bytes] = []
            sender = _peer(author)
            for item in items:
                verdict = self._judge(validator, sender, item)
                if verdict is Verdict.REJECT:
                    self._reject(forwarder, topic, author, "validator rejected an item")
                    return False
                if verdict is Verdict.ACCEPT:
                    accepted.append(item)
                else:
                    self.stats["ignored"] += 1
            if not accepted:
                return False  # IGNORE: dropped, not forwarded, nobody penalised
            self._accepted[(msg.from_id, msg.seqno)] = accepted
            return True

        return hook

    @staticmethod
    def _judge(validator: Validator, sender: PeerId, item: bytes) -> Verdict:
        try:
            return validator(sender, item)
        except Exception:
            # A validator bug is ours, not the sender's: drop without penalty, loudly.
            logger.exception("gossip validator raised; message from %s ignored", sender)
            return Verdict.IGNORE

    def _reject(self, forwarder: ID, topic: str, author: ID, why: str) -> None:
        self.stats["rejected"] += 1
        self._scorer.penalise(forwarder, topic)
        logger.info("rejected gossip on %s from %s via %s: %s", topic, author, forwarder, why)

    async def _deliver(
        self, subscription: TrioSubscriptionAPI, send: trio.MemorySendChannel[Gossip]
    ) -> None:
        async with send:
            async for msg in subscription:
                if msg.from_id == self._own_id.to_bytes():
                    continue
                items = self._accepted.pop((msg.from_id, msg.seqno), None)
                if items is None:
                    continue
                sender = _peer(ID(msg.from_id))
                for item in items:
                    await send.send(Gossip(sender, item))
                self.stats["delivered"] += len(items)

    async def wait_subscribed(self, peer: PeerId, topic: str) -> None:
        self._check_running()
        # libp2p's own event-based wait; its timeout is ours to impose from outside.
        await self.router.wait_for_mesh(ID.from_base58(peer), topic, timeout=float("inf"))

    async def publish(self, topic: str, data: bytes) -> None:
        self._check_running()
        if len(data) > self.config.max_message_size:
            raise LocalNetworkError(
                NetReason.TOO_LARGE,
                f"gossip message of {len(data)} bytes exceeds {self.config.max_message_size}",
            )
        item = _Outgoing(topic, bytes(data))
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            # No yield while there is room: a burst of publishes then leaves in a few
            # bundles instead of one bundle per scheduler pass.
            self._outbox_send.send_nowait(item)
        except trio.WouldBlock:
            await self._outbox_send.send(item)
        self._queued += 1
        self.stats["published"] += 1

    async def flush(self) -> None:
        self._check_running()
        target = self._queued
        while self._sent < target:
            await self._progress.wait()
        # libp2p 0.8.1 exposes each peer queue's length but no wake-up when it drains.
        while any(len(q) for q in self.pubsub.peer_queues.values()):  # noqa: ASYNC110
            await trio.sleep(0.002)

    def score(self, peer: PeerId) -> float:
        return self._scorer.score(ID.from_base58(peer), sorted(self._subscribed))

    def queue_depths(self) -> dict[str, int]:
        return {
            "outbox": self._queued - self._sent,
            "peers": sum(len(q) for q in self.pubsub.peer_queues.values()),
        }

    async def _publisher(self) -> None:
        """Batch queued messages per topic into bundles and pace them out."""
        tuning = self.config.gossip
        carry: _Outgoing | None = None
        while True:
            first = carry if carry is not None else await self._outbox_receive.receive()
            carry = None
            if (
                tuning.bundle_linger > 0
                and self._outbox_receive.statistics().current_buffer_used == 0
            ):
                await trio.sleep(tuning.bundle_linger)
            items = [first.data]
            sizes = [len(first.data)]
            while len(items) < tuning.bundle_max_items:
                try:
                    nxt = self._outbox_receive.receive_nowait()
                except trio.WouldBlock:
                    break
                if nxt.topic != first.topic or bundle_size([*sizes, len(nxt.data)]) > max(
                    tuning.bundle_max_bytes, bundle_size(sizes)
                ):
                    carry = nxt
                    break
                items.append(nxt.data)
                sizes.append(len(nxt.data))
            await self._wait_for_room()
            await self.pubsub.publish(first.topic, encode_bundle(items))
            self.stats["bundles"] += 1
            self._sent += len(items)
            self._progress.set()
            self._progress = trio.Event()
            # Pubsub.publish never yields; let the sending tasks run.
            await trio.lowlevel.checkpoint()

    async def _wait_for_room(self) -> None:
        high_water = self.config.gossip.high_water
        if all(len(q) < high_water for q in self.pubsub.peer_queues.values()):
            return
        self.stats["held_for_room"] += 1
        # No wake-up exists for a draining RpcQueue in 0.8.1: poll its length.
        while any(len(q) >= high_water for q in self.pubsub.peer_queues.values()):  # noqa: ASYNC110
            await trio.sleep(0.001)

    # -- streams --------------------------------------------------------------------------

    async def open_stream(self, peer: PeerId, protocol_id: ProtocolId) -> Stream:
        self._check_running()
        try:
            peer_id = ID.from_base58(peer)
        except (ValueError, TypeError) as exc:
            raise LocalNetworkError(NetReason.BAD_ADDRESS, f"{peer!r} is not a peer id") from exc
        if not self._has_live_connection(peer_id):
            await self._redial(peer_id)
        with (
            map_exceptions(_DIAL_ERRORS, f"open {protocol_id} to {peer}"),
            trio.fail_after(self.config.dial_timeout),
        ):
            stream = await self.host.new_stream(peer_id, [TProtocol(protocol_id)])
        return _Libp2pStream(stream, peer)

    def serve(self, protocol_id: ProtocolId, handler: StreamHandler) -> None:
        self._check_running()
        if protocol_id in self._handlers:
            raise LocalNetworkError(
                NetReason.DUPLICATE_HANDLER, f"{protocol_id} already has a handler"
            )
        self._handlers[protocol_id] = handler

        async def on_stream(stream: INetStream) -> None:
            remote = _peer(stream.muxed_conn.peer_id)
            ours = _Libp2pStream(stream, remote)
            try:
                await handler(ours)
            except Exception:
                # Top of a per-stream task: log and drop this stream, keep the node.
                logger.exception("%s handler failed for %s", protocol_id, remote)
            finally:
                await ours.aclose()

        self.host.set_stream_handler(TProtocol(protocol_id), on_stream)


@contextlib.asynccontextmanager
async def _services(*services: Any) -> AsyncIterator[None]:  # noqa: ANN401 - libp2p Services
    """Run each libp2p ``Service`` that is not None for the duration of the block."""
    async with contextlib.AsyncExitStack() as stack:
        for service in services:
            if service is not None:
                await stack.enter_async_context(background_trio_service(service))
        yield


async def serve_network(
    key: PrivateKey,
    config: P2PConfig | None = None,
    *,
    task_status: TaskStatus[P2PNetwork] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a libp2p node for ``key`` until cancelled; ``nursery.start`` returns it.

    Connects to ``config.bootstrap`` peers before reporting started (a failed bootstrap
    peer is logged, not fatal). Raises LocalNetworkError if it cannot listen.
    """
    config = config or P2PConfig()
    tuning = config.gossip
    configure_libp2p_logging(config.log_level)
    _check_libp2p_version()
    _deepen_pubsub_queues(tuning)
    _tune_yamux()
    _reuse_peer_records()
    host = _build_host(key, config)
    router = GossipSub(
        protocols=[PROTOCOL_ID_V11, PROTOCOL_ID],
        degree=tuning.degree,
        degree_low=tuning.degree_low,
        degree_high=tuning.degree_high,
        heartbeat_interval=tuning.heartbeat_interval,
        gossip_window=tuning.gossip_window,
        gossip_history=tuning.gossip_history,
        adaptive_gossip_enabled=False,
        spam_protection_enabled=False,
        eclipse_protection_enabled=tuning.eclipse_protection,
    )
    scorer = _VerdictScorer(_score_params(tuning))
    router.scorer = scorer
    pubsub = Pubsub(host, router, strict_signing=True)
    dht = KadDHT(host, DHTMode.SERVER) if config.enable_dht else None
    nat = _Nat(host, config.nat, config.bootstrap) if config.nat.enabled else None
    net = P2PNetwork(key, config, host, pubsub, router, scorer, dht, nat)
    listen = [multiaddr.Multiaddr(a) for a in config.listen_addrs]
    started = time.monotonic()
    with map_exceptions({OSError: (LocalNetworkError, NetReason.BAD_ADDRESS)}, "listen"):
        async with host.run(listen):
            try:
                async with _services(
                    pubsub,
                    router,
                    dht,
                    *((nat.protocol, nat.dcutr) if nat is not None else ()),
                ):
                    await pubsub.wait_until_ready()
                    async with trio.open_nursery() as nursery:
                        net._nursery = nursery
                        net._running = True
                        nursery.start_soon(net._publisher)
                        if nat is not None:
                            nursery.start_soon(nat.run, lambda: net._events.changed)
                        if dht is not None:
                            nursery.start_soon(net._tend_dht, dht)
                        for addr in config.bootstrap:
                            try:
                                await net.connect(addr)
                            except DialError as exc:
                                logger.warning("bootstrap peer %s unreachable: %s", addr, exc)
                        logger.info(
                            "libp2p node %s up on %s in %.0f ms",
                            net.peer_id,
                            ", ".join(net.listen_addrs),
                            (time.monotonic() - started) * 1000,
                        )
                        task_status.started(net)
                        await trio.sleep_forever()
            finally:
                net._running = False
                # Without close() leaving host.run() leaks the sockets (0.8.1).
                with trio.CancelScope(shield=True), trio.move_on_after(config.close_timeout):
                    await host.close()
