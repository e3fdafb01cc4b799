"""The Network contract (node/net/transport.py), run against both implementations.

``memory`` is node/net/memnet.py; ``libp2p`` is node/net/p2p.py on loopback (integration). No
sleeps: every wait is on an event or a channel, bounded by trio.fail_after.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable

import pytest
import trio

from node.net.memnet import MemoryHub, serve_memory_network
from node.net.p2p import serve_network
from node.net.transport import (
    DialError,
    FramedStream,
    Gossip,
    LocalNetworkError,
    Network,
    PeerId,
    ProtocolId,
    Stream,
    Verdict,
)
from protocol.identity import PrivateKey

KINDS = [
    pytest.param("memory", id="memory"),
    pytest.param("libp2p", id="libp2p", marks=pytest.mark.integration),
]
TOPIC = "cx/test/v1"
ECHO = ProtocolId("/cx/test/echo/1")
BOUND = 20  # seconds; generous for a loaded 2-core CI machine, never a timing assertion


def accept_all(sender: PeerId, data: bytes) -> Verdict:
    return Verdict.ACCEPT


def key(i: int) -> PrivateKey:
    return PrivateKey.from_seed(bytes([i + 1]) * 32)


@contextlib.asynccontextmanager
async def open_nodes(kind: str, count: int) -> AsyncIterator[list[Network]]:
    async with trio.open_nursery() as nursery:
        nets: list[Network] = []
        hub = MemoryHub()
        for i in range(count):
            if kind == "memory":
                nets.append(await nursery.start(serve_memory_network, hub, key(i).peer_id))
            else:
                nets.append(await nursery.start(serve_network, key(i)))
        yield nets
        nursery.cancel_scope.cancel()


async def line(
    nets: list[Network], topic: str, validators: list[Callable[..., Verdict]] | None = None
) -> list[trio.MemoryReceiveChannel[Gossip]]:
    """Connect nets[i] to nets[i+1], subscribe all, wait until each link carries gossip."""
    for a, b in itertools.pairwise(nets):
        assert await a.connect(b.listen_addrs[0]) == b.peer_id
    channels = [
        await net.subscribe(topic, (validators[i] if validators else accept_all))
        for i, net in enumerate(nets)
    ]
    with trio.fail_after(BOUND):
        for a, b in itertools.pairwise(nets):
            await a.wait_subscribed(b.peer_id, topic)
            await b.wait_subscribed(a.peer_id, topic)
    return channels


async def receive_n(channel: trio.MemoryReceiveChannel[Gossip], n: int) -> list[Gossip]:
    return [await channel.receive() for _ in range(n)]


@pytest.mark.parametrize("kind", KINDS)
async def test_connect_and_peers(kind: str) -> None:
    async with open_nodes(kind, 2) as (a, b):
        assert a.listen_addrs
        assert all(addr.endswith(a.peer_id) for addr in a.listen_addrs)
        assert await a.connect(b.listen_addrs[0]) == b.peer_id
        assert b.peer_id in a.peers()
        with pytest.raises(LocalNetworkError):
            await a.connect("not an address")


@pytest.mark.parametrize("kind", KINDS)
async def test_gossip_reaches_every_node_over_several_hops(kind: str) -> None:
    async with open_nodes(kind, 5) as nets:
        channels = await line(nets, TOPIC)
        for i in range(20):
            await nets[2].publish(TOPIC, b"order %d" % i)
        await nets[2].flush()
        expected = [Gossip(nets[2].peer_id, b"order %d" % i) for i in range(20)]
        with trio.fail_after(BOUND):
            for index, channel in enumerate(channels):
                if index != 2:
                    assert sorted(await receive_n(channel, 20)) == sorted(expected)
        # No loop-back, no duplicates.
        for channel in channels:
            with pytest.raises(trio.WouldBlock):
                channel.receive_nowait()


@pytest.mark.parametrize("kind", KINDS)
async def test_rejected_message_is_not_forwarded_and_costs_score(kind: str) -> None:
    seen_by_last: list[bytes] = []

    def middle(sender: PeerId, data: bytes) -> Verdict:
        if data.startswith(b"bad"):
            return Verdict.REJECT
        if data.startswith(b"stale"):
            return Verdict.IGNORE
        return Verdict.ACCEPT

    def last(sender: PeerId, data: bytes) -> Verdict:
        seen_by_last.append(data)
        return Verdict.ACCEPT

    async with open_nodes(kind, 3) as nets:
        a, b, c = nets
        _, from_b, from_c = await line(nets, TOPIC, [accept_all, middle, last])
        await a.publish(TOPIC, b"stale offer")
        await a.flush()
        assert b.score(a.peer_id) == 0  # IGNORE is free
        await a.publish(TOPIC, b"bad offer")
        await a.flush()
        await a.publish(TOPIC, b"good offer")
        with trio.fail_after(BOUND):
            assert await from_c.receive() == Gossip(a.peer_id, b"good offer")
            assert await from_b.receive() == Gossip(a.peer_id, b"good offer")
        assert seen_by_last == [b"good offer"]
        assert b.score(a.peer_id) < 0
        assert c.score(b.peer_id) == 0


@pytest.mark.parametrize("kind", KINDS)
async def test_publish_refuses_oversized_message(kind: str) -> None:
    async with open_nodes(kind, 1) as (a,):
        with pytest.raises(LocalNetworkError):
            await a.publish(TOPIC, b"x" * (2 << 20))


async def echo(stream: Stream) -> None:
    framed = FramedStream(stream)
    while (frame := await framed.receive_frame()) is not None:
        await framed.send_frame(frame[::-1])


@pytest.mark.parametrize("kind", KINDS)
async def test_stream_round_trip(kind: str) -> None:
    async with open_nodes(kind, 2) as (a, b):
        b.serve(ECHO, echo)
        with pytest.raises(LocalNetworkError):
            b.serve(ECHO, echo)
        await a.connect(b.listen_addrs[0])
        with trio.fail_after(BOUND):
            stream = await a.open_stream(b.peer_id, ECHO)
            assert stream.remote_peer == b.peer_id
            framed = FramedStream(stream)
            for payload in (b"hello", b"", b"x" * 200_000):
                await framed.send_frame(payload)
                assert await framed.receive_frame() == payload[::-1]
            await framed.aclose()


@pytest.mark.parametrize("kind", KINDS)
async def test_stream_to_unserved_protocol_fails(kind: str) -> None:
    async with open_nodes(kind, 2) as (a, b):
        await a.connect(b.listen_addrs[0])
        with trio.fail_after(BOUND), pytest.raises(DialError):
            await a.open_stream(b.peer_id, ProtocolId("/cx/nobody/1"))
