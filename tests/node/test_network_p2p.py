"""node/net/p2p.py over real libp2p 0.8.1 on loopback: one test per pitfall of PLATFORM.md.

Each of these would fail after a libp2p upgrade that changed the behaviour it guards.
No sleeps to synchronise; waits are bounded by trio.fail_after.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import multiaddr
import pytest
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.network.config import ConnectionConfig, RetryConfig
from libp2p.peer import peerstore as peerstore_module
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub import pubsub as pubsub_module
from libp2p.pubsub import utils as pubsub_utils
from libp2p.pubsub.pb import rpc_pb2
from libp2p.security.insecure.transport import PLAINTEXT_PROTOCOL_ID, InsecureTransport
from libp2p.security.noise.io import MAX_PLAINTEXT_LENGTH
from libp2p.security.secio.transport import ID as SECIO_PROTOCOL_ID
from libp2p.security.secio.transport import Transport as SecioTransport
from libp2p.stream_muxer.yamux import yamux as yamux_module

from node.net import p2p
from node.net.p2p import GossipTuning, P2PConfig, P2PNetwork, serve_network
from node.net.transport import (
    DialError,
    FramedStream,
    Gossip,
    NetworkError,
    PeerId,
    ProtocolId,
    Stream,
    Verdict,
)
from protocol.identity import PrivateKey

pytestmark = pytest.mark.integration

TOPIC = "cx/offers/v1"
BOUND = 30
ECHO = ProtocolId("/cx/test/echo/1")
SOURCE = ProtocolId("/cx/test/source/1")
PATTERN = bytes(range(256)) * 4096  # 1 MiB


def key(i: int) -> PrivateKey:
    return PrivateKey.from_seed(bytes([0x40 + i]) * 32)


def accept_all(sender: PeerId, data: bytes) -> Verdict:
    return Verdict.ACCEPT


@contextlib.asynccontextmanager
async def open_nodes(
    count: int, config: P2PConfig | None = None
) -> AsyncIterator[list[P2PNetwork]]:
    async with trio.open_nursery() as nursery:
        nets = [await nursery.start(serve_network, key(i), config) for i in range(count)]
        yield nets
        nursery.cancel_scope.cancel()


async def wait_until(predicate: object) -> None:
    """Wait for a condition libp2p offers no event for (a closed socket being noticed)."""
    assert callable(predicate)
    while not predicate():  # noqa: ASYNC110 - no event exists for these conditions
        await trio.sleep(0.01)


async def test_host_identity_is_the_node_key() -> None:
    async with open_nodes(1) as (net,):
        assert net.host.get_id().to_base58() == key(0).peer_id == net.peer_id
        assert all(addr.endswith("/p2p/" + key(0).peer_id) for addr in net.listen_addrs)
        assert all(addr.startswith("/ip4/127.0.0.1/tcp/") for addr in net.listen_addrs)


async def test_only_noise_and_yamux_are_offered() -> None:
    async with open_nodes(1) as (net,):
        assert net.offered_security() == ("/noise",)
        assert net.offered_muxers() == ("/yamux/1.0.0",)


@pytest.mark.parametrize("insecure", ["plaintext", "secio"])
async def test_plaintext_and_secio_dialers_are_refused(insecure: str) -> None:
    pair = create_new_key_pair()
    security = (
        {PLAINTEXT_PROTOCOL_ID: InsecureTransport(pair)}
        if insecure == "plaintext"
        else {SECIO_PROTOCOL_ID: SecioTransport(pair)}
    )
    client = new_host(
        key_pair=pair,
        sec_opt=security,
        connection_config=ConnectionConfig(max_connections_per_peer=1),
    )
    client.get_network().retry_config = RetryConfig(max_retries=0)
    async with open_nodes(1) as (net,):
        async with client.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
            with trio.fail_after(BOUND), pytest.raises(Exception, match=r"."):
                await client.connect(info_from_p2p_addr(multiaddr.Multiaddr(net.listen_addrs[0])))
            await client.close()
        assert net.peers() == frozenset()


async def test_gossip_under_load_loses_nothing() -> None:
    """2,000 orders published as fast as publish() allows reach all five nodes.

    Stock GossipSub 0.8.1 delivered 32 of 3,000 (spam cap, 32-deep queues). Bundles are
    capped at 8 orders here so that 250 pubsub messages cross each link in a burst, far
    past the 10 msg/s cap and the 32-deep queues.
    """
    count = 2000
    config = P2PConfig(gossip=GossipTuning(bundle_max_items=8))
    async with open_nodes(5, config) as nets:
        # i -> i+1 and i -> i+2: several paths, so duplicates must be suppressed too.
        for i, j in itertools.chain(
            itertools.pairwise(range(5)), zip(range(3), range(2, 5), strict=True)
        ):
            await nets[i].connect(nets[j].listen_addrs[0])
        channels = [await net.subscribe(TOPIC, accept_all) for net in nets]
        with trio.fail_after(BOUND):
            for i, j in itertools.pairwise(range(5)):
                await nets[i].wait_subscribed(nets[j].peer_id, TOPIC)
        sent = [b"order-%05d" % n for n in range(count)]
        received: list[list[Gossip]] = [[] for _ in nets]

        async def drain(index: int) -> None:
            for _ in range(count):
                received[index].append(await channels[index].receive())

        with trio.fail_after(BOUND):
            async with trio.open_nursery() as nursery:
                for index in range(1, 5):
                    nursery.start_soon(drain, index)
                for data in sent:
                    await nets[0].publish(TOPIC, data)
        for index in range(1, 5):
            assert sorted(g.data for g in received[index]) == sent, f"node {index}"
            assert {g.sender for g in received[index]} == {nets[0].peer_id}
            with pytest.raises(trio.WouldBlock):
                channels[index].receive_nowait()  # and nothing twice
        assert nets[0].stats["bundles"] >= count // 8


async def test_rejecting_sender_loses_score_with_the_right_sign() -> None:
    async with open_nodes(2) as (a, b):
        await a.connect(b.listen_addrs[0])
        await a.subscribe(TOPIC, accept_all)
        await b.subscribe(TOPIC, lambda sender, data: Verdict.REJECT)
        with trio.fail_after(BOUND):
            await a.wait_subscribed(b.peer_id, TOPIC)
            before = b.score(a.peer_id)
            await a.publish(TOPIC, b"forged offer")
            await a.flush()
            await wait_until(lambda: b.stats["rejected"] == 1)
        assert before == 0
        assert b.score(a.peer_id) < 0  # 0.8.1 subtracts p4; a go-style weight would add


async def test_malformed_bundle_is_rejected() -> None:
    async with open_nodes(2) as (a, b):
        await a.connect(b.listen_addrs[0])
        await a.subscribe(TOPIC, accept_all)
        from_b = await b.subscribe(TOPIC, accept_all)
        with trio.fail_after(BOUND):
            await a.wait_subscribed(b.peer_id, TOPIC)
            await a.pubsub.publish(TOPIC, b"\x07 not a bundle")  # bypasses our publisher
            await wait_until(lambda: b.stats["rejected"] == 1)
        assert b.score(a.peer_id) < 0
        with pytest.raises(trio.WouldBlock):
            from_b.receive_nowait()


async def echo(stream: Stream) -> None:
    framed = FramedStream(stream)
    while (frame := await framed.receive_frame()) is not None:
        await framed.send_frame(frame)


async def test_redial_after_restart_at_a_new_address() -> None:
    """A failed dial puts the peer in a 60 s negative cache and leaves its old address
    first in the peerstore; connect() to the restarted peer must still work at once."""
    async with open_nodes(1) as (a,):
        async with trio.open_nursery() as first_life:
            b = await first_life.start(serve_network, key(1))
            old_addr = b.listen_addrs[0]
            await a.connect(old_addr)
            first_life.cancel_scope.cancel()
        with trio.fail_after(BOUND):
            await wait_until(lambda: key(1).peer_id not in a.peers())
            with pytest.raises(DialError):
                await a.connect(old_addr)  # down: now negatively cached
        async with trio.open_nursery() as second_life:
            b = await second_life.start(serve_network, key(1))
            b.serve(ECHO, echo)
            assert b.listen_addrs[0] != old_addr
            with trio.fail_after(BOUND):
                assert await a.connect(b.listen_addrs[0]) == b.peer_id
                framed = FramedStream(await a.open_stream(b.peer_id, ECHO))
                await framed.send_frame(b"still there?")
                assert await framed.receive_frame() == b"still there?"
                await framed.aclose()
            second_life.cancel_scope.cancel()


async def test_a_stream_names_its_protocol_with_the_header_and_an_unserved_one_is_refused() -> None:
    """Our client sends the multistream header and the protocol in one flight
    (``_PipelinedSelect``): libp2p's answering side still takes them in order, and says
    "na" to a protocol it does not serve, which surfaces as a NetworkError."""
    async with open_nodes(2) as (a, b):
        b.serve(ECHO, echo)
        with trio.fail_after(BOUND):
            await a.connect(b.listen_addrs[0])
            for n in range(3):
                framed = FramedStream(await a.open_stream(b.peer_id, ECHO))
                await framed.send_frame(b"frame %d" % n)
                assert await framed.receive_frame() == b"frame %d" % n
                await framed.aclose()
            with pytest.raises(NetworkError):
                await a.open_stream(b.peer_id, ProtocolId("/cx/test/nobody-serves-this/1"))
            framed = FramedStream(await a.open_stream(b.peer_id, ECHO))  # the link survives
            await framed.send_frame(b"after")
            assert await framed.receive_frame() == b"after"
            await framed.aclose()


async def test_gossipsub_is_tuned_and_pubsub_queues_are_deepened() -> None:
    async with open_nodes(2) as (a, b):
        await a.connect(b.listen_addrs[0])
        await a.subscribe(TOPIC, accept_all)
        await b.subscribe(TOPIC, accept_all)
        with trio.fail_after(BOUND):
            await a.wait_subscribed(b.peer_id, TOPIC)
        router = a.router
        assert not router.spam_protection_enabled
        assert not router.adaptive_gossip_enabled
        assert router.heartbeat_interval == 1
        assert pubsub_module.SUBSCRIPTION_CHANNEL_SIZE >= 8192
        # The queue a new peer gets now takes far more than 32 RPCs before refusing.
        queue = pubsub_module.RpcQueue()  # type: ignore[attr-defined]
        assert all(queue.push(rpc_pb2.RPC()) for _ in range(1000))
        assert len(a.pubsub.peer_queues) == 1
        assert type(next(iter(a.pubsub.peer_queues.values()))) is type(queue)


async def test_gossip_builds_and_checks_a_peer_record_once_not_per_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """0.8.1 rebuilt our signed peer record (``env_to_send_in_RPC``: ``host.get_addrs()``)
    for every pubsub RPC and the receiver checked each record it got (``consume_envelope``,
    a signature) twice.
    Now messages reuse the record, and the receiver takes it again only after a while."""
    async with open_nodes(2) as (a, b):
        await a.connect(b.listen_addrs[0])
        await a.subscribe(TOPIC, accept_all)
        channel = await b.subscribe(TOPIC, accept_all)

        async def gossip(count: int) -> None:
            for n in range(count):
                await a.publish(TOPIC, b"message %d" % n)
                assert (await channel.receive()).data == b"message %d" % n

        with trio.fail_after(BOUND):
            await a.wait_subscribed(b.peer_id, TOPIC)
            await gossip(1)  # the first message may build and take the record
        assert b.host.get_peerstore().get_peer_record(a.host.get_id()) is not None
        # libp2p's own steps, looked up in their modules only on these paths (identify and
        # the DHT import their own references): building our record, checking a peer's.
        calls: list[str] = []
        build, consume = peerstore_module.env_to_send_in_RPC, pubsub_utils.consume_envelope
        monkeypatch.setattr(
            peerstore_module,
            "env_to_send_in_RPC",
            lambda host: (calls.append("built"), build(host))[1],
        )
        monkeypatch.setattr(
            pubsub_utils,
            "consume_envelope",
            lambda *args: (calls.append("taken"), consume(*args))[1],
        )
        monkeypatch.setattr(p2p, "PEER_RECORD_BUILT_FOR_S", 3600.0)  # no timing here
        monkeypatch.setattr(p2p, "PEER_RECORD_TAKEN_FOR_S", 3600.0)
        with trio.fail_after(BOUND):
            await gossip(20)
        assert calls == []
        monkeypatch.setattr(p2p, "PEER_RECORD_TAKEN_FOR_S", 0.0)  # taken again each time
        with trio.fail_after(BOUND):
            await gossip(20)
        assert calls.count("taken") >= 20
        assert "built" not in calls


async def test_libp2p_warnings_reach_our_handlers(caplog: pytest.LogCaptureFixture) -> None:
    async with open_nodes(1, P2PConfig(log_level=logging.WARNING)):
        caplog.set_level(logging.WARNING)
        logging.getLogger("libp2p.pubsub.pubsub").warning("probe from libp2p")
        assert any(r.getMessage() == "probe from libp2p" for r in caplog.records)
        noisy = logging.getLogger("libp2p.network.auto_connector")
        assert noisy.getEffectiveLevel() == logging.WARNING


async def test_bootstrap_and_dht() -> None:
    async with open_nodes(1) as (seed,):
        config = P2PConfig(bootstrap=(seed.listen_addrs[0],), enable_dht=True)
        async with trio.open_nursery() as nursery:
            net = await nursery.start(serve_network, key(7), config)
            assert seed.peer_id in net.peers()
            assert net.dht is not None
            assert net.dht.get_routing_table_size() >= 1
            nursery.cancel_scope.cancel()


# -- stream throughput: yamux frame size and window updates (node/net/p2p.py, _tune_yamux) ----


async def source(stream: Stream) -> None:
    """Send as many bytes of PATTERN (repeated) as the first frame asks for, in 1 MiB
    writes; hold the stream open until the reader says it has everything."""
    framed = FramedStream(stream)
    left = int(await framed.receive_frame() or b"0")
    while left:
        block = PATTERN[: min(left, len(PATTERN))]
        await stream.send_all(block)
        left -= len(block)
    await framed.receive_frame()


def expected_digest(total: int) -> bytes:
    digest = hashlib.sha256()
    for offset in range(0, total, len(PATTERN)):
        digest.update(PATTERN[: min(len(PATTERN), total - offset)])
    return digest.digest()


async def pull(net: P2PNetwork, peer: PeerId, total: int, read_sizes: list[int]) -> int:
    """Fetch ``total`` bytes from ``peer``'s SOURCE, checking them; returns the reads."""
    stream = await net.open_stream(peer, SOURCE)
    framed = FramedStream(stream)
    await framed.send_frame(str(total).encode())
    digest, got, reads = hashlib.sha256(), 0, 0
    for size in itertools.cycle(read_sizes):
        if got == total:
            break
        part = await stream.receive_some(min(size, total - got))
        assert part, f"stream ended after {got} of {total} bytes"
        digest.update(part)
        got += len(part)
        reads += 1
    assert digest.digest() == expected_digest(total)
    await framed.send_frame(b"done")
    await stream.aclose()
    return reads


@dataclass
class Tap:
    """What one side of a connection wrote: yamux frames and the Noise messages."""

    frames: list[tuple[int, int, int]] = field(default_factory=list)  # type, flags, size
    noise_messages: list[int] = field(default_factory=list)  # sizes, encrypted

    def window_updates(self) -> int:
        return sum(
            1
            for typ, flags, _ in self.frames
            if typ == yamux_module.TYPE_WINDOW_UPDATE and not flags
        )


def tap(monkeypatch: pytest.MonkeyPatch, net: P2PNetwork, peer: PeerId) -> Tap:
    """Record what ``net`` writes on its connection to ``peer`` from now on.

    Yamux writes each frame with one ``SecureSession.write``; Noise splits what it is
    given into messages of at most MAX_PLAINTEXT_LENGTH, each one ``write_msg`` below.
    """
    swarm: Any = net.host.get_network()
    (conn,) = swarm.get_connections(ID.from_base58(peer))
    session = conn.muxed_conn.secured_conn
    packets = session.conn.read_writer
    record = Tap()
    write, write_msg = session.write, packets.write_msg

    async def write_frame(data: bytes) -> None:
        _, typ, flags, _, _ = struct.unpack(yamux_module.YAMUX_HEADER_FORMAT, data[:12])
        record.frames.append((typ, flags, len(data)))
        await write(data)

    async def write_noise_message(msg: bytes) -> None:
        record.noise_messages.append(len(msg))
        await write_msg(msg)

    monkeypatch.setattr(session, "write", write_frame)
    monkeypatch.setattr(packets, "write_msg", write_noise_message)
    return record


async def test_yamux_frames_fill_one_noise_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.8.1's 64 KiB yamux frames are 17 bytes over a Noise message: each went out as
    two. Now every frame is one message, and a full one fills it exactly."""
    async with open_nodes(2) as (a, b):
        a.serve(SOURCE, source)
        await b.connect(a.listen_addrs[0])
        sent = tap(monkeypatch, a, b.peer_id)
        with trio.fail_after(BOUND):
            await pull(b, a.peer_id, 4 << 20, [1 << 20])
    data = [size for typ, _, size in sent.frames if typ == yamux_module.TYPE_DATA]
    assert sum(data) - 12 * len(data) >= 4 << 20
    assert len(sent.noise_messages) == len(sent.frames)
    assert max(data) == MAX_PLAINTEXT_LENGTH == 65535 - 16
    assert max(sent.noise_messages) == 65535


async def test_yamux_window_updates_are_batched(monkeypatch: pytest.MonkeyPatch) -> None:
    """With PY_YAMUX_RELEASE_ON_READ on (0.8.1's default) the reader sends a window
    update, one Noise message, after every read. Off, about every other read while the
    window grows to its 16 MiB maximum, then about once per half window."""
    async with open_nodes(2) as (a, b):
        a.serve(SOURCE, source)
        await b.connect(a.listen_addrs[0])
        received = tap(monkeypatch, b, a.peer_id)
        with trio.fail_after(BOUND):
            reads = await pull(b, a.peer_id, 64 << 20, [65536])
    assert reads >= 1024
    assert 0 < received.window_updates() <= reads // 2


async def test_many_large_streams_complete_under_flow_control(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Batched window updates stall no stream: eight at once on one connection, each
    many initial windows long, read in uneven sizes, all arrive intact, and libp2p
    reports no window overrun and no timed-out wait for a window update.

    One direction; both at once: the next test."""
    caplog.set_level(logging.WARNING)
    total = 4 << 20
    read_sizes = [4096, 65536, 1 << 20, 100_000, 7_000_000]
    async with open_nodes(2) as (a, b):
        a.serve(SOURCE, source)
        await b.connect(a.listen_addrs[0])
        with trio.fail_after(BOUND):
            async with trio.open_nursery() as nursery:
                for n in range(8):
                    sizes = [*read_sizes[n % 5 :], *read_sizes[: n % 5]]
                    nursery.start_soon(pull, b, a.peer_id, total, sizes)
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("libp2p")]
    assert not [w for w in warnings if "window" in w.lower()], warnings


async def test_large_streams_both_ways_at_once_do_not_deadlock() -> None:
    """Six 4 MiB streams each way on one connection, all at once, all arrive intact.

    Without the deferred control replies of node/net/p2p.py (``_defer_read_loop_writes``)
    both read loops wait for their connection's write lock, held by a DATA write blocked
    on a full socket, and this hangs until the bound."""
    async with open_nodes(2) as (a, b):
        a.serve(SOURCE, source)
        b.serve(SOURCE, source)
        await b.connect(a.listen_addrs[0])
        with trio.fail_after(BOUND):
            async with trio.open_nursery() as nursery:
                for _ in range(6):
                    nursery.start_soon(pull, b, a.peer_id, 4 << 20, [1 << 20])
                    nursery.start_soon(pull, a, b.peer_id, 4 << 20, [1 << 20])
