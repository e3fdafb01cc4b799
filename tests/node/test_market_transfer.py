"""Egress-aware matching between whole nodes (spec/matching.md, "Transfer cost"): real
``serve_peer`` nodes on the in-memory network, jobs run by the fake runner (where a job
runs is the question here, not how). Through the real CLI where it has flags: `cx run`
states where the data lives, `cx why` names the figures, `cx offers` shows who holds it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from fake_runner import FakeRunner
from market_support import (
    MEM_PRICE,
    Cluster,
    MiB,
    Node,
    cluster,
    market,
    submit,
    until,
    virtual,
)

from node.api.controller import serve_control
from node.cli import main
from node.storage.home import NodeConfig, ProviderConfig, init_home
from node.storage.image import import_image
from node.storage.store import BlobStore
from protocol.messages import Arch, Prices, Resources
from protocol.transfer import holds

FAR_PRICE = 80_000_000  # 0.17 credits less for a core-minute than NEAR_PRICE
NEAR_PRICE = 90_000_000


async def provider(c: Cluster, name: str, price: int, region: str, **transfer: int) -> Node:
    config = ProviderConfig(
        capacity=Resources(cpu_milli=2000, memory_bytes=1024 * MiB, disk_bytes=1024 * MiB),
        prices=Prices(cpu_core_hour=price, memory_gib_hour=MEM_PRICE),
        arch=Arch.AMD64,
        region=region,
        **transfer,
    )
    return await c.start(init_home(c.root / name, NodeConfig(provider=config)))


async def far_near_and_buyer(c: Cluster) -> tuple[Node, Node, Node]:
    far = await provider(c, "far", FAR_PRICE, "us")
    near = await provider(c, "near", NEAR_PRICE, "eu")
    buyer = await c.buyer("buyer")
    for p in (far, near):
        await buyer.peer.join(p.addr)
    await until(lambda: market(buyer)["offers"] == 2, buyer)
    await c.nursery.start(serve_control, buyer.peer)
    return far, near, buyer


async def test_cx_run_picks_the_provider_beside_large_data_and_the_cheap_far_one_for_small(
    image_layout: Path, capsys: Any
) -> None:
    """10 GiB in eu at 0.09 credits per GiB out of it: the provider in us asks 0.17 less
    for the job but moving the data there costs 0.90, so the one in eu runs it, and `cx
    why` says so in credits. With 100 MiB the move costs 0.01 and the far one wins. Over
    an egress budget the far one does not fit at all."""

    async def cx(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        home = ["--home", str(buyer.home.root)]
        code = await trio.to_thread.run_sync(main, [argv[0], *home, *argv[1:]])
        out, err = capsys.readouterr()
        return code, out, err

    def run(size: str, *more: str) -> tuple[str, ...]:
        return (
            "run", "--json", "--wait-match", "30s", "--max-price", "100", "--timeout", "1m",
            "--data-region", "eu", "--data-size", size, "--data-egress-price", "0.09",
            *more, c.image, "--", "true",
        )  # fmt: skip

    runner = {"runner": lambda home: FakeRunner(BlobStore(home.store_root))}
    async with cluster(image_layout, **runner) as c:
        far, near, buyer = await far_near_and_buyer(c)

        code, out, err = await cx(*run("10Gi"))
        assert code == 0, err
        large = json.loads(out)
        assert large["provider"] == near.peer_id
        code, out, _ = await cx("why", large["id"])
        assert code == 0
        assert (
            f"it was matched with {near.peer_id}: it asked 1.5375 credits and moving 10 GiB "
            "costs nothing, 1.5375 in all; "
            f"{far.peer_id} (region us) asked 1.370833 but moving 10 GiB costs 0.90 credits "
            "(egress 0.90), 2.270833 in all"
        ) in out

        code, out, err = await cx(*run("100Mi"))
        assert code == 0, err
        assert json.loads(out)["provider"] == far.peer_id

        code, out, err = await cx(*run("10Gi", "--region", "us", "--egress-budget", "0.5", "-d"))
        assert code == 0, err
        code, out, _ = await cx("why", json.loads(out)["id"])
        assert "transfer rules out 1" in out
        assert (
            "moving 10 GiB costs 0.90 credits (egress 0.90) to the cheapest of them, over the "
            "egress budget of 0.50 credits"
        ) in out

        code, _, err = await cx("run", "--max-price", "1", "--egress-budget", "1", c.image, "true")
        assert code != 0
        assert "egress_budget needs data_region" in err


async def test_the_provider_holding_the_data_wins_and_its_offer_follows_its_store(
    clock: trio.testing.MockClock, image_layout: Path
) -> None:
    """Two providers beside the data charge 100 credits per GiB brought in; the dearer one
    holds the job's image from the start and gets its input blob later: its offer is
    re-posted saying so, and the job, costing nothing to move there, goes to it."""
    blob = bytes(range(256)) * (8 * 1024)  # 2 MiB: large enough to be listed
    ingress = {"ingress_gib": 100_000_000}
    async with virtual(image_layout, {}) as c:
        cheap = await provider(c, "cheap", FAR_PRICE, "eu", **ingress)
        holder_home = init_home(
            c.root / "holder",
            NodeConfig(
                provider=ProviderConfig(
                    capacity=Resources(cpu_milli=2000, memory_bytes=1024 * MiB),
                    prices=Prices(cpu_core_hour=NEAR_PRICE, memory_gib_hour=MEM_PRICE),
                    arch=Arch.AMD64,
                    region="eu",
                    **ingress,
                )
            ),
        )
        image = import_image(BlobStore(holder_home.store_root), image_layout).manifest
        holder = await c.start(holder_home)
        buyer = await c.buyer("buyer")
        assert c.image == image
        for p in (cheap, holder):
            await buyer.peer.join(p.addr)
        await until(lambda: market(buyer)["offers"] == 2, buyer)
        digest = BlobStore(buyer.home.store_root).put_bytes(blob)
        assert not _holds(buyer, holder, digest)
        assert _holds(buyer, holder, image)

        BlobStore(holder.home.store_root).put_bytes(blob)
        await until(lambda: _holds(buyer, holder, digest), buyer)
        assert not _holds(buyer, cheap, image)

        job = await submit(
            buyer,
            image,
            "true",
            inputs=[{"path": "/in/blob", "digest": digest, "size": len(blob)}],
            data_region="eu",
        )
        await until(lambda: buyer.peer.job(job["id"]).provider, buyer)
        assert buyer.peer.job(job["id"]).provider == holder.peer_id


def _holds(buyer: Node, provider: Node, digest: str) -> bool:
    book = buyer.peer.market.trader.book
    offers = [
        o.offer
        for o in book.live_offers(buyer.peer.market.now_ms())
        if o.order.signer.peer_id == provider.peer_id
    ]
    return any(holds(o, digest) for o in offers)
