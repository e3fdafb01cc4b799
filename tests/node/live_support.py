"""A provider and a buyer trading real container jobs (whole nodes on the in-memory network),
each serving its real control API, run in a thread of their own: for tests that use the
node from outside (a browser, a ``cx`` process)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from market_support import cluster, submit

from node.api.controller import serve_control


@dataclass
class Served:
    url: str
    home: Path
    peer_id: str


@dataclass
class Market:
    buyer: Served
    provider: Served
    image: str
    token: trio.lowlevel.TrioToken
    buyer_node: Any

    def submit(self, script: str, **fields: Any) -> str:
        async def go() -> str:
            return str((await submit(self.buyer_node, self.image, script, **fields))["id"])

        return str(trio.from_thread.run(go, trio_token=self.token))


@pytest.fixture(scope="module", name="market")
def market_fixture(image_layout: Path) -> Iterator[Market]:
    """A provider and a buyer on one hub, each with its control API, in a thread."""
    ready: queue.Queue[Market | BaseException] = queue.Queue()
    stop: list[trio.CancelScope] = []

    async def serve() -> None:
        try:
            with trio.CancelScope() as scope:
                stop.append(scope)
                async with cluster(image_layout) as c:
                    provider = await c.provider("provider")
                    buyer = await c.buyer("buyer")
                    await buyer.peer.join(provider.addr)
                    served = []
                    for node in (buyer, provider):
                        url = await c.nursery.start(serve_control, node.peer)
                        served.append(Served(url, node.home.root, node.peer_id))
                    token = trio.lowlevel.current_trio_token()
                    ready.put(Market(served[0], served[1], c.image, token, buyer))
                    await trio.sleep_forever()
        except BaseException as exc:  # the test thread must hear of a failed start
            ready.put(exc)
            raise

    thread = threading.Thread(target=trio.run, args=(serve,), daemon=True)
    thread.start()
    started = ready.get(timeout=120)
    if isinstance(started, BaseException):
        raise started
    try:
        yield started
    finally:
        trio.from_thread.run_sync(stop[0].cancel, trio_token=started.token)
        thread.join(60)
