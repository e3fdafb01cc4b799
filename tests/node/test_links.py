"""node/net/links.py over the in-memory network, on trio's MockClock (the backoff's delays
pass instantly and exactly)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from node.net.links import Backoff, keep_connected, peer_of, watch_peers
from node.net.memnet import MemoryHub, MemoryNetwork, serve_memory_network
from node.net.transport import PeerId
from protocol.identity import PrivateKey

ME, OTHER = (PrivateKey.from_seed(bytes([i]) * 32).peer_id for i in (1, 2))


@contextlib.asynccontextmanager
async def running(hub: MemoryHub, peer: PeerId) -> AsyncIterator[MemoryNetwork]:
    async with trio.open_nursery() as nursery:
        yield await nursery.start(serve_memory_network, hub, peer)
        nursery.cancel_scope.cancel()


class Dials:
    """When ``net.connect`` was called (the clock's time), for the peer at ``OTHER``."""

    def __init__(self, net: MemoryNetwork) -> None:
        self.at: list[float] = []
        self._connect = net.connect
        net.connect = self.connect  # type: ignore[method-assign]

    async def connect(self, addr: str) -> PeerId:
        self.at.append(trio.current_time())
        return await self._connect(addr)


async def test_a_peer_that_is_down_is_redialled_with_growing_delays_until_it_is_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hub = MemoryHub()
    backoff = Backoff(first_s=1.0, cap_s=8.0, jitter=0.0)
    async with running(hub, ME) as net, trio.open_nursery() as nursery:
        dials = Dials(net)
        start = trio.current_time()
        await nursery.start(
            lambda task_status: keep_connected(
                net, [f"/memory/p2p/{OTHER}"], backoff=backoff, task_status=task_status
            )
        )
        await trio.sleep(20)
        assert [t - start for t in dials.at] == [0, 1, 3, 7, 15]  # 1, 2, 4, 8, 8...

        async with running(hub, OTHER):
            with trio.fail_after(backoff.cap_s + 1):
                while OTHER not in net.peers():
                    await net.wait_peers_changed()
            before = len(dials.at)
            gone = trio.current_time()
        await trio.testing.wait_all_tasks_blocked()
        assert dials.at[before:] == [gone]  # it went away: dialled again at once
        nursery.cancel_scope.cancel()


async def test_peers_coming_and_going_are_reported_once_each_way() -> None:
    hub = MemoryHub()
    seen: list[str] = []
    changed = trio.Event()

    async def up(peer: PeerId) -> None:
        seen.append(f"up {peer == OTHER}")
        changed.set()

    def down(peer: PeerId) -> None:
        seen.append(f"down {peer == OTHER}")

    async with running(hub, ME) as net, trio.open_nursery() as nursery:
        nursery.start_soon(watch_peers, net, up, down)
        for _ in range(2):
            async with running(hub, OTHER) as other:
                await other.connect(f"/memory/p2p/{ME}")
                with trio.fail_after(5):
                    await changed.wait()
                changed = trio.Event()
            await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert seen == ["up True", "down True", "up True", "down True"]


def test_an_address_names_its_peer() -> None:
    assert peer_of(f"/ip4/1.2.3.4/tcp/1/p2p/{ME}/p2p-circuit/p2p/{OTHER}") == OTHER
    with pytest.raises(ValueError, match="does not end in /p2p/"):
        peer_of("/ip4/1.2.3.4/tcp/1")
