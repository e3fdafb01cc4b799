"""A local testnet: N providers and M buyers as separate ``cx node`` processes on loopback.

Each node has its own home (key, config, SQLite, store) and, for a provider that attests,
its own swtpm; the software TPMs' EK certificates come from one local CA the buyers trust.
The first provider is everyone's bootstrap peer; the rest find each other by hello.
:class:`Testnet` drives them through the same control API the CLI uses, so a test can
kill a node (``kill -9``) mid-job and restart it on its home, and ``cx testnet`` runs a
scenario (node/workload.py) and checks that nothing was lost: every job reached the outcome
it should, every receipt is in both ledgers, and the balances sum to zero.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.api.client import ApiClient, ClientError
from node.storage.home import Home, NodeConfig, ProviderConfig, init_home
from node.storage.image import build_rootfs, host_arch, import_image
from node.storage.store import BlobStore
from node.tpm import swtpm
from node.workload import (
    SCENARIOS,
    JobPlan,
    Scenario,
    Verdict,
    is_done,
    judge,
    provider_config,
    request_for,
)

__all__ = ["Node", "Testnet"]

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
POLL_S = 0.1


@dataclass(slots=True)
class Node:
    name: str
    home: Home
    provider: bool
    process: subprocess.Popen[bytes] | None = None
    client: ApiClient | None = None
    peer_id: str = ""
    addr: str = ""

    def api(self) -> ApiClient:
        if self.client is None:
            raise ClientError(f"{self.name} is not running")
        return self.client


class Testnet:
    __test__ = False  # not a pytest test class

    def __init__(
        self,
        providers: int = 3,
        buyers: int = 2,
        *,
        work: Path | None = None,
        tpm: bool | None = None,
        scenario: Scenario = SCENARIOS["demo"],
    ) -> None:
        """``tpm``: give the first provider a swtpm (None: when swtpm is installed and the
        scenario has attested jobs)."""
        self.owned = work is None
        self.root = Path(tempfile.mkdtemp(prefix="cx-testnet-")) if work is None else work
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o711)  # containers run under a mapped uid and traverse the homes
        if tpm is None:
            tpm = scenario.needs_tpm and shutil.which("swtpm") is not None
        self.tpm = tpm
        self.scenario = scenario
        self.nodes: list[Node] = []
        self.provider_count = providers
        self.buyer_count = buyers
        self.image = ""

    @property
    def providers(self) -> list[Node]:
        return [n for n in self.nodes if n.provider]

    @property
    def buyers(self) -> list[Node]:
        return [n for n in self.nodes if not n.provider]

    # -- life cycle --------------------------------------------------------------------

    def start(self, progress: Callable[[str], None] = lambda _: None) -> None:
        """Create every home, start every node and wait until each buyer sees every offer."""
        ca = self.root / "tpm-ca"
        roots = (str(ca / "swtpm-localca-rootca-cert.pem"),) if self.tpm else ()
        for i in range(self.provider_count):
            attests = self.tpm and i == 0
            name, config = provider_config(
                i, host_arch(), tpm=attests, pricing=self.scenario.pricing(i)
            )
            node = self._make(name, roots, provider=config)
            if attests:
                progress(f"manufacturing a software TPM for {node.name}")
                (node.home.tpm_dir).mkdir(parents=True)
                ca.mkdir(exist_ok=True)
                (node.home.tpm_dir / "ca").symlink_to(ca)  # one EK CA for the whole testnet
                swtpm.manufacture(node.home.tpm_dir)
        for i in range(self.buyer_count):
            self._make(f"buyer-{chr(ord('a') + i)}", roots, provider=None)
        layout = self.root / "image"
        build_rootfs(layout)
        for node in self.buyers:
            self.image = import_image(BlobStore(node.home.store_root), layout).manifest
        first, *rest = self.nodes
        progress(f"starting {len(self.nodes)} nodes")
        self.launch(first)
        for node in rest:
            self._bootstrap(node, first.addr)
            self.launch(node, wait=False)
        for node in rest:
            self._await_api(node)
        self.await_offers(len(self.providers))

    def _make(self, name: str, roots: tuple[str, ...], provider: ProviderConfig | None) -> Node:
        home = init_home(self.root / name, NodeConfig(ek_roots=roots, provider=provider))
        node = Node(name, home, provider is not None)
        self.nodes.append(node)
        return node

    def _bootstrap(self, node: Node, addr: str) -> None:
        node.home.save_config(dataclasses.replace(node.home.config(), bootstrap=(addr,)))

    def launch(self, node: Node, *, wait: bool = True) -> None:
        """Start ``node``'s process on its home (again, after :meth:`kill`)."""
        (node.home.root / "api.json").unlink(missing_ok=True)
        log_file = open(node.home.root / "node.log", "ab")  # noqa: SIM115 - the child keeps it
        node.process = subprocess.Popen(
            [sys.executable, "-m", "node.cli", "node", "--home", str(node.home.root)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's Ctrl-C goes to cx testnet, which stops them
        )
        log_file.close()
        if wait:
            self._await_api(node)

    def _await_api(self, node: Node) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert node.process is not None
            if node.process.poll() is not None:
                log_path = node.home.root / "node.log"
                code = node.process.returncode
                raise RuntimeError(f"{node.name} exited with {code}; see {log_path}")
            with contextlib.suppress(ClientError, OSError):
                client = ApiClient.from_home(node.home.root, timeout_s=10.0)
                info = client.node_info()
                node.client, node.peer_id, node.addr = client, info["peer_id"], info["addrs"][0]
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{node.name} did not start within {START_TIMEOUT_S:.0f} s; see its node.log"
                )
            time.sleep(POLL_S)

    def await_offers(self, count: int, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until every running buyer's book holds ``count`` offers."""
        deadline = time.monotonic() + timeout_s
        for node in self.buyers:
            while node.client is not None and node.api().market()["offers"] < count:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{node.name} sees {node.api().market()['offers']} of {count} offers"
                    )
                time.sleep(POLL_S)

    def kill(self, node: Node) -> None:
        """``kill -9`` the node's process."""
        if node.process is not None and node.process.poll() is None:
            node.process.send_signal(signal.SIGKILL)
            node.process.wait()
        node.client = None

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL after 10 s); remove a temporary root."""
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signal.SIGTERM)
        for node in self.nodes:
            if node.process is not None:
                try:
                    node.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.kill(node)
            node.client = None
        if self.owned:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Testnet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- jobs --------------------------------------------------------------------------

    def submit(self, plan: JobPlan) -> str:
        buyer = self.buyers[plan.buyer % len(self.buyers)]
        return str(buyer.api().submit(request_for(plan, self.image))["id"])

    def run(
        self,
        *,
        timeout_s: float = 120.0,
        progress: Callable[[list[dict[str, Any]]], None] = lambda _: None,
    ) -> Verdict:
        """Submit the scenario's workload phase by phase, follow it to the end, and check
        everything that must hold."""
        deadline = time.monotonic() + timeout_s
        plans: list[JobPlan] = []
        ids: list[str] = []
        views: list[dict[str, Any]] = []
        for phase in self.scenario.phases():
            phase = [p for p in phase if self.tpm or p.trust == "none"]
            plans += phase
            ids += [self.submit(p) for p in phase]
            while True:
                views = [self._view(p, i) for p, i in zip(plans, ids, strict=True)]
                progress(views)
                if all(is_done(v) for v in views) or time.monotonic() > deadline:
                    break
                time.sleep(POLL_S * 2)
        verdict = Verdict(jobs=views, trades=self.buyers[0].api().trades())
        for view in views:
            if view["expect"] == "unmatched":
                buyer = self.buyers[view["plan_buyer"]]
                view["why"] = buyer.api().why(view["id"])["explanation"]
                with contextlib.suppress(ClientError):
                    buyer.api().cancel(view["id"])
        self.check(verdict)
        return verdict

    def _view(self, plan: JobPlan, job_id: str) -> dict[str, Any]:
        buyer_index = plan.buyer % len(self.buyers)
        view = dict(self.buyers[buyer_index].api().job(job_id))
        view.update(plan=plan.name, expect=plan.expect, plan_buyer=buyer_index)
        view["buyer"] = self.buyers[buyer_index].name
        view["provider_name"] = self.name_of(view.get("provider"))
        return view

    def name_of(self, peer_id: str | None) -> str:
        return next((n.name for n in self.nodes if peer_id and n.peer_id == peer_id), "-")

    def check(self, verdict: Verdict) -> None:
        """Outcomes as planned; each receipt in both ledgers; balances that sum to zero."""
        verdict.ledgers = {n.name: n.api().ledger() for n in self.nodes if n.client is not None}
        judge(verdict, {n.peer_id: n.name for n in self.nodes})
        for check in self.scenario.checks:
            check(verdict)
