"""Whole nodes (``serve_peer``) on one in-memory network, for market tests: a cluster that
starts and stops them as a crash would, and helpers that answer with the control API's JSON
views (what a user of a node sees) and wait on the nodes' change events, never by polling.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from executor_support import searchable_dir
from fake_runner import FakeRunner

from node.api import views
from node.clock import Clock, Timings
from node.market.provider import Runner
from node.market.request import build_request
from node.net.memnet import MemoryHub, serve_memory_network
from node.net.transport import Network
from node.peer import Peer, serve_peer
from node.storage.home import Home, NodeConfig, ProviderConfig, init_home
from node.storage.image import import_image
from node.storage.store import BlobStore
from protocol.messages import Arch, Prices, Resources
from protocol.pricing import Pricing

BOUND = 30  # seconds: generous for a loaded CI machine, never a timing assertion
# The same under MockClock: virtual time passes at once, but each timer tick of the nodes
# is a clock jump that costs real time, so an hour of it is a few seconds.
VIRTUAL_BOUND = 3600
MiB = 1 << 20
PRICE = 90_000_000  # micro-credits per core-hour, the usual provider's
MEM_PRICE = 9_000_000
T0 = 1_800_000_000_000  # protocol time at the start of every virtual run


@dataclass
class Node:
    name: str
    home: Home
    peer: Peer
    scope: trio.CancelScope
    gone: trio.Event
    bound: float  # seconds of trio time a wait on this node may take

    @property
    def addr(self) -> str:
        return self.peer.net.listen_addrs[0]

    @property
    def peer_id(self) -> str:
        return self.peer.net.peer_id

    async def stop(self) -> None:
        """Stop the node abruptly, as a crash would: its tasks are cancelled mid-step."""
        self.scope.cancel()
        with trio.fail_after(self.bound):
            await self.gone.wait()


class Cluster:
    """Nodes on one in-memory hub. ``epoch_ms`` starts each node's protocol clock there
    (runs under MockClock), else at the wall clock; ``runner`` makes a provider's job runner
    from its home, else providers run real containers; ``wrap`` puts something (a fault
    injector) between a node and its memory network."""

    def __init__(
        self,
        nursery: trio.Nursery,
        root: Path,
        image_layout: Path,
        *,
        epoch_ms: int | None = None,
        runner: Callable[[Home], Runner] | None = None,
        wrap: Callable[[Home, Network], Network] | None = None,
    ) -> None:
        self.nursery = nursery
        self.wrap = wrap
        self.root = root
        self.hub = MemoryHub()
        self.image_layout = image_layout
        self.image = ""
        self.epoch_ms = epoch_ms
        self.started_at = trio.current_time()
        self.runner = runner
        self.bound = BOUND if epoch_ms is None else VIRTUAL_BOUND

    def home(
        self,
        name: str,
        *,
        price: int | None = None,
        cpu_milli: int = 2000,
        offer_ttl_ms: int = 3_600_000,
        pricing: Pricing | None = None,
    ) -> Home:
        provider = None
        if price is not None:
            provider = ProviderConfig(
                capacity=Resources(
                    cpu_milli=cpu_milli, memory_bytes=1024 * MiB, disk_bytes=1024 * MiB
                ),
                prices=Prices(cpu_core_hour=price, memory_gib_hour=MEM_PRICE),
                arch=Arch.AMD64,
                offer_ttl_ms=offer_ttl_ms,
                pricing=pricing,
            )
        return init_home(self.root / name, NodeConfig(provider=provider))

    def now_ms(self) -> int | None:
        """Protocol time for a node starting now: one timeline for the whole cluster, so a
        node restarted later does not start its clock at ``epoch_ms`` again."""
        if self.epoch_ms is None:
            return None
        return self.epoch_ms + int((trio.current_time() - self.started_at) * 1000)

    async def start(self, home: Home, timings: Timings | None = None) -> Node:
        """Run ``serve_peer`` on ``home`` with its own memory peer; returns once it serves."""
        gone = trio.Event()

        async def run(task_status: Any) -> None:
            try:
                with trio.CancelScope() as scope:
                    async with trio.open_nursery() as inner:
                        net = await inner.start(serve_memory_network, self.hub, home.key().peer_id)
                        if self.wrap is not None:
                            net = self.wrap(home, net)
                        peer = await inner.start(
                            functools.partial(
                                serve_peer,
                                home,
                                network=net,
                                timings=timings,
                                clock=Clock(self.now_ms()),
                                executor=None if self.runner is None else self.runner(home),
                            )
                        )
                        task_status.started((peer, scope))
            finally:
                gone.set()

        peer, scope = await self.nursery.start(run)
        return Node(home.root.name, home, peer, scope, gone, self.bound)

    async def provider(
        self, name: str, price: int = PRICE, timings: Timings | None = None, **kw: Any
    ) -> Node:
        return await self.start(self.home(name, price=price, **kw), timings)

    async def buyer(self, name: str, timings: Timings | None = None) -> Node:
        home = self.home(name)
        self.image = import_image(BlobStore(home.store_root), self.image_layout).manifest
        return await self.start(home, timings)


@contextlib.asynccontextmanager
async def cluster(image_layout: Path, **options: Any) -> AsyncIterator[Cluster]:
    """A :class:`Cluster` (``options`` are its own) whose nodes stop with the block."""
    root = searchable_dir("cx-market-")
    try:
        async with trio.open_nursery() as nursery:
            yield Cluster(nursery, root, image_layout, **options)
            nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def virtual(
    image_layout: Path, runners: dict[Path, FakeRunner]
) -> contextlib.AbstractAsyncContextManager[Cluster]:
    """A cluster on protocol time T0 whose providers run jobs on fake runners, kept in
    ``runners`` by home."""

    def runner(home: Home) -> FakeRunner:
        made = runners[home.root] = FakeRunner(BlobStore(home.store_root))
        return made

    return cluster(image_layout, epoch_ms=T0, runner=runner)


async def submit(
    node: Node, image: str, script: str, *, price: int = 100_000_000, **fields: Any
) -> dict[str, Any]:
    request = build_request(
        image=image,
        command=("sh", "-c", script),
        max_prices={"cpu_core_hour": price, "memory_gib_hour": 10_000_000},
        **{"cpu_milli": 500, "memory_bytes": 64 * MiB, "wall_ms": 60_000, **fields},
    )
    return views.job(await node.peer.submit(request))


async def gossip_peer(c: Cluster, node: Node, topic: str, peer_id: str) -> Network:
    """A bare network peer that speaks gossip only, linked to ``node`` alone; returns once
    ``node`` takes its gossip on ``topic``."""
    peer: Network = await c.nursery.start(serve_memory_network, c.hub, peer_id)
    await peer.connect(node.addr)
    with trio.fail_after(node.bound):
        await peer.wait_subscribed(node.peer_id, topic)
    return peer


def job(node: Node, job_id: str) -> dict[str, Any]:
    return views.job(node.peer.job(job_id))


def ledger(node: Node) -> dict[str, Any]:
    return views.ledger(node.peer.ledger(), node.peer.key.public_key.raw)


def market(node: Node) -> dict[str, Any]:
    m = node.peer.market
    return views.market(m.trader.book, list(m.tape.prints()), m.rejected, m.now_ms())


async def until(what: Callable[[], Any], *nodes: Node) -> Any:
    """Wait until ``what()`` is truthy, re-checking whenever one of ``nodes`` reports a
    change (a job, its book, its ledger); bounded."""
    with trio.fail_after(max(node.bound for node in nodes)):
        while True:
            changes = [node.peer.market.next_change() for node in nodes]  # before the look
            if value := what():
                return value
            async with trio.open_nursery() as nursery:
                for change in changes:
                    nursery.start_soon(_woken, change, nursery.cancel_scope)


async def _woken(change: trio.Event, scope: trio.CancelScope) -> None:
    await change.wait()
    scope.cancel()


async def state(node: Node, job_id: str, wanted: str) -> dict[str, Any]:
    """Wait until the job has reached ``wanted`` (its event log, so a state already left
    counts); returns the job as it is."""
    await until(lambda: wanted in {e["state"] for e in node.peer.db.events(job_id)}, node)
    return job(node, job_id)


async def finished(node: Node, job_id: str) -> dict[str, Any]:
    """Wait for the job to end; on timeout, fail with its events so far."""
    try:
        with trio.fail_after(node.bound):
            return views.job(await node.peer.wait(job_id))
    except trio.TooSlowError:
        pytest.fail("job never ended:\n" + "\n".join(events(node, job_id)))


def same_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A ledger entry as both parties hold it (the role and settling time are local)."""
    return {k: v for k, v in entry.items() if k not in ("role", "at_ms")}


def events(node: Node, job_id: str) -> list[str]:
    return [f"{e['state']}: {e['detail']}" for e in node.peer.db.events(job_id)]
