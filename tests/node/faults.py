"""A fault injector for whole-node simulation tests: a :class:`Network` wrapper that drops,
delays, duplicates and (by delaying) reorders gossip, fails dials and resets streams
mid-message, every choice drawn from one seeded ``random.Random``.

It sits between a real node (``serve_peer``) and the in-memory network, so the node's own
code meets the faults; the network under it stays the real memnet.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import trio

from node.net.transport import (
    DialError,
    Gossip,
    NetReason,
    Network,
    PeerId,
    ProtocolId,
    Stream,
    StreamClosed,
    StreamHandler,
    Validator,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultRates:
    drop: float = 0.1  # a published message never leaves
    duplicate: float = 0.1  # it leaves twice
    delay_s: float = 2.0  # each publish and stream write waits up to this long
    dial_failure: float = 0.05
    reset: float = 0.02  # a stream write resets the stream instead


@dataclass(slots=True)
class FaultCounts:
    dropped: int = 0
    duplicated: int = 0
    dials_failed: int = 0
    resets: int = 0


@dataclass(eq=False)
class FaultyNetwork:
    inner: Network
    rng: random.Random
    rates: FaultRates = FaultRates()
    counts: FaultCounts = field(default_factory=FaultCounts)

    @property
    def peer_id(self) -> PeerId:
        return self.inner.peer_id

    @property
    def listen_addrs(self) -> list[str]:
        return self.inner.listen_addrs

    async def connect(self, addr: str) -> PeerId:
        return await self.inner.connect(addr)

    def peers(self) -> frozenset[PeerId]:
        return self.inner.peers()

    async def wait_peers_changed(self) -> None:
        await self.inner.wait_peers_changed()

    async def provide(self, key: str) -> None:
        await self.inner.provide(key)

    async def find_providers(self, key: str, limit: int = 20) -> dict[PeerId, list[str]]:
        return await self.inner.find_providers(key, limit)

    def queue_depths(self) -> dict[str, int]:
        return self.inner.queue_depths()

    async def subscribe(
        self, topic: str, validator: Validator
    ) -> trio.MemoryReceiveChannel[Gossip]:
        return await self.inner.subscribe(topic, validator)

    async def wait_subscribed(self, peer: PeerId, topic: str) -> None:
        await self.inner.wait_subscribed(peer, topic)

    def score(self, peer: PeerId) -> float:
        return self.inner.score(peer)

    def serve(self, protocol_id: ProtocolId, handler: StreamHandler) -> None:
        self.inner.serve(protocol_id, handler)

    async def flush(self) -> None:
        await self.inner.flush()

    async def publish(self, topic: str, data: bytes) -> None:
        if self.rng.random() < self.rates.drop:
            self.counts.dropped += 1
            return
        await trio.sleep(self.rng.uniform(0, self.rates.delay_s))
        await self.inner.publish(topic, data)
        if self.rng.random() < self.rates.duplicate:
            self.counts.duplicated += 1
            await self.inner.publish(topic, data)

    async def open_stream(self, peer: PeerId, protocol_id: ProtocolId) -> Stream:
        if self.rng.random() < self.rates.dial_failure:
            self.counts.dials_failed += 1
            raise DialError(NetReason.UNREACHABLE, f"injected: {peer} unreachable")
        return FaultyStream(await self.inner.open_stream(peer, protocol_id), self)


@dataclass(eq=False)
class FaultyStream:
    inner: Stream
    net: FaultyNetwork

    @property
    def remote_peer(self) -> PeerId:
        return self.inner.remote_peer

    @property
    def remote_host(self) -> str | None:
        return self.inner.remote_host

    async def send_all(self, data: bytes) -> None:
        net = self.net
        await trio.sleep(net.rng.uniform(0, net.rates.delay_s))
        if net.rng.random() < net.rates.reset:
            net.counts.resets += 1
            await self.inner.send_all(data[: len(data) // 2])
            await self.inner.aclose()
            raise StreamClosed(NetReason.CLOSED, "injected: stream reset mid-message")
        await self.inner.send_all(data)

    async def receive_some(self, max_bytes: int = 65536) -> bytes:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()
