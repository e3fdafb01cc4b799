"""The local market demo: the testnet's scenario as whole nodes in this one process.

Every node is a real :func:`~node.peer.serve_peer` on its own home (key, SQLite, content
store; providers run jobs in real OCI containers), so the trade flow is the product's:
gossip, local matching, negotiation with fallback, transfer, the outbox, countersigned
receipts. Only the network is the in-memory one (node/net/memnet.py). ``cx testnet`` runs
the same scenario (node/workload.py) as node processes over libp2p; both end with the same
judgement: every job as planned, every receipt held alike, balances summing to zero.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio

from node.api import views
from node.net.memnet import MemoryHub, serve_memory_network
from node.peer import Peer, serve_peer
from node.storage.home import NodeConfig, ProviderConfig, init_home
from node.storage.image import build_rootfs, host_arch, import_image
from node.storage.store import BlobStore
from node.workload import WORKLOAD, JobPlan, Verdict, is_done, judge, provider_config, request_for

__all__ = ["run_demo"]

START_TIMEOUT_S = 30.0


async def run_demo(
    work: Path | None = None,
    *,
    providers: int = 3,
    buyers: int = 2,
    timeout_s: float = 120.0,
    progress: Callable[[list[dict[str, Any]]], None] = lambda _: None,
) -> Verdict:
    """Run the scenario under ``work`` (a temporary directory if None) and judge it.

    The TPM-attested job of the workload is left out: the demo has no software TPM.
    Raises trio.TooSlowError if the nodes do not see each other's offers in time.
    """
    owned = work is None
    root = Path(tempfile.mkdtemp(prefix="cx-demo-")) if work is None else work
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o711)  # containers run under a mapped uid and traverse the homes
    try:
        return await _run(root, providers, buyers, timeout_s, progress)
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)


async def _run(
    root: Path,
    providers: int,
    buyers: int,
    timeout_s: float,
    progress: Callable[[list[dict[str, Any]]], None],
) -> Verdict:
    hub = MemoryHub()
    homes: list[tuple[str, ProviderConfig | None]] = [
        provider_config(i, host_arch()) for i in range(providers)
    ]
    homes += [(f"buyer-{chr(ord('a') + i)}", None) for i in range(buyers)]
    build_rootfs(root / "image")
    async with trio.open_nursery() as nursery:
        nodes: dict[str, Peer] = {}
        image = ""
        for name, config in homes:
            home = init_home(root / name, NodeConfig(provider=config))
            if config is None:
                image = import_image(BlobStore(home.store_root), root / "image").manifest
            net = await nursery.start(serve_memory_network, hub, home.key().peer_id)
            nodes[name] = await nursery.start(partial(serve_peer, home, network=net))
        first, *rest = nodes.values()
        for peer in rest:
            await peer.join(first.net.listen_addrs[0])
        buying = [p for p in nodes.values() if p.provider is None]
        with trio.fail_after(START_TIMEOUT_S):
            for peer in buying:
                while len(list(peer.market.trader.book.live_offers(peer.market.now_ms()))) < (
                    providers
                ):
                    await peer.changed()
        plans = [p for p in WORKLOAD if p.trust == "none"]
        submitted = [
            (plan, buyer, (await buyer.submit(request_for(plan, image))).id)
            for plan in plans
            for buyer in [buying[plan.buyer % len(buying)]]
        ]
        names: dict[str, str] = {p.net.peer_id: name for name, p in nodes.items()}
        with trio.move_on_after(timeout_s):
            while True:
                jobs = _views(submitted, names)
                progress(jobs)
                if all(is_done(v) for v in jobs):
                    break
                await _any_change(buying)
        verdict = Verdict(jobs=_views(submitted, names))
        progress(verdict.jobs)
        for view, (_, buyer, job_id) in zip(verdict.jobs, submitted, strict=True):
            if view["expect"] == "unmatched":
                view["why"] = buyer.why(job_id).text
                await buyer.cancel(job_id)
        verdict.ledgers = {
            name: views.ledger(p.ledger(), p.key.public_key.raw) for name, p in nodes.items()
        }
        judge(verdict, names)
        nursery.cancel_scope.cancel()
    return verdict


def _views(
    submitted: list[tuple[JobPlan, Peer, str]], names: dict[str, str]
) -> list[dict[str, Any]]:
    out = []
    for plan, buyer, job_id in submitted:
        view = views.job(buyer.job(job_id))
        view.update(
            plan=plan.name,
            expect=plan.expect,
            buyer=names[buyer.net.peer_id],
            provider_name=names.get(view["provider"] or "", "-"),
        )
        out.append(view)
    return out


async def _any_change(peers: list[Peer]) -> None:
    """Return when any of ``peers`` reports a change."""
    async with trio.open_nursery() as nursery:
        for peer in peers:

            async def wait(peer: Peer = peer) -> None:
                await peer.changed()
                nursery.cancel_scope.cancel()

            nursery.start_soon(wait)
