"""A local testnet: N providers and M buyers as separate ``cx node`` processes.

Each node has its own home (key, config, SQLite, store) and, for a provider that attests,
its own swtpm; the software TPMs' EK certificates come from one local CA the buyers trust.
The first provider is everyone's bootstrap peer; the rest find each other by hello.
:class:`Testnet` drives them through the same control API the CLI uses, so a test can
kill a node (``kill -9``) mid-job and restart it on its home, and ``cx testnet`` runs a
scenario (node/workload.py) and checks that nothing was lost: every job reached the outcome
it should, every receipt is in both ledgers, and the balances sum to zero.

By default the nodes share loopback. With :attr:`Conditions.netns` each runs in a network
namespace of its own on an emulated WAN (``node/testnet/netns.py``: latency, jitter, loss),
the last :attr:`Conditions.nat` of them behind NAT (never the first, the bootstrap peer);
churn and a partition (``node/testnet/schedule.py``) happen while the workload runs. Every
node listens on a fixed address, so a restarted one is where it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.api.client import ApiClient, ClientError
from node.api.common import read_api_info
from node.storage.home import Home, NodeConfig, ProviderConfig, init_home
from node.storage.image import build_rootfs, host_arch, import_image
from node.storage.store import BlobStore
from node.testnet.netns import Host, Lab, entered
from node.testnet.schedule import Event, Kind, plan
from node.testnet.wan import Impairment
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

__all__ = ["Conditions", "Node", "Testnet"]

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
SETTLE_S = 30.0  # after the jobs end, for each receipt to reach both ledgers
POLL_S = 0.1
P2P_PORT = 4001  # each node's libp2p port in its own namespace


@dataclass(frozen=True, slots=True, kw_only=True)
class Conditions:
    """What the nodes go through besides the workload (``cx testnet``'s flags)."""

    netns: bool = False  # a namespace each, on an emulated WAN; else all on loopback
    impairment: Impairment = field(default_factory=Impairment)  # on every WAN path
    nat: int = 0  # nodes behind NAT, counted from the last
    partition_s: float = 0.0  # one partition of this long during the run
    churn: float = 0.0  # the fraction of nodes killed and restarted during the run
    seed: int = 0

    def __post_init__(self) -> None:
        if self.nat < 0:
            raise ValueError("--nat counts nodes: 0 or more")
        wan = self.nat or self.partition_s or self.impairment != Impairment()
        if wan and not self.netns:
            raise ValueError("latency, jitter, loss, NAT and partitions need --netns")


class _NetnsClient(ApiClient):
    """The control API of a node in a namespace: its 127.0.0.1 is only reachable there."""

    def __init__(self, netns: str, base_url: str, token: str, *, home: Path) -> None:
        super().__init__(base_url, token, timeout_s=10.0, home=home)
        self._netns = netns

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | str | None = None,
        *,
        timeout_s: float | None = None,
    ) -> Any:  # noqa: ANN401 - whatever JSON the route returns
        with entered(self._netns):
            return super().call(method, path, body, timeout_s=timeout_s)


@dataclass(slots=True)
class Node:
    name: str
    home: Home
    provider: bool
    listen: str = ""  # its libp2p address, fixed for its life
    host: Host | None = None  # its namespace, in a netns testnet
    process: subprocess.Popen[bytes] | None = None
    client: ApiClient | None = None
    peer_id: str = ""
    addr: str = ""

    @property
    def nat(self) -> bool:
        return self.host is not None and self.host.nat

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
        conditions: Conditions | None = None,
    ) -> None:
        """``tpm``: give the first provider a swtpm (None: when swtpm is installed and the
        scenario has attested jobs).

        Raises ValueError when more nodes are to be behind NAT than may be.
        """
        self.conditions = conditions or Conditions()
        if self.conditions.nat >= providers + buyers:
            raise ValueError(
                f"--nat {self.conditions.nat}: at most {providers + buyers - 1} of "
                f"{providers + buyers} nodes (the first is everyone's bootstrap peer)"
            )
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
        self.lab: Lab | None = None
        self.events: list[dict[str, Any]] = []  # the kills, restarts and partitions of run

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
        self._place(progress)
        layout = self.root / "image"
        build_rootfs(layout)
        for node in self.buyers:
            self.image = import_image(BlobStore(node.home.store_root), layout).manifest
        first, *rest = self.nodes
        progress(f"starting {len(self.nodes)} nodes")
        self._configure(first, bootstrap=())
        for node in rest:
            self._configure(node, bootstrap=(f"{first.listen}/p2p/{first.home.key().peer_id}",))
        self.launch(first)
        for node in rest:
            self.launch(node, wait=False)
        for node in rest:
            self._await_api(node)
        self.await_offers(len(self.providers))
        self.await_relayed()

    def _make(self, name: str, roots: tuple[str, ...], provider: ProviderConfig | None) -> Node:
        home = init_home(self.root / name, NodeConfig(ek_roots=roots, provider=provider))
        node = Node(name, home, provider is not None)
        self.nodes.append(node)
        return node

    def _place(self, progress: Callable[[str], None]) -> None:
        """Give every node its address: a namespace of its own, or a loopback port."""
        c = self.conditions
        if not c.netns:
            for node in self.nodes:
                node.listen = f"/ip4/127.0.0.1/tcp/{_free_port()}"
            return
        behind = {n.name for n in self.nodes[len(self.nodes) - c.nat :]}
        self.lab = Lab()
        for node in self.nodes:
            node.host = self.lab.add_host(node.name, nat=node.name in behind)
            node.listen = f"/ip4/{node.host.address}/tcp/{P2P_PORT}"
        imp = c.impairment
        progress(
            f"{len(self.nodes)} namespaces on an emulated WAN: latency {imp.latency_s * 1000:g} "
            f"ms, jitter {imp.jitter_s * 1000:g} ms, loss {imp.loss:.1%}"
            + (f"; behind NAT: {', '.join(sorted(behind))}" if behind else "")
        )
        self.lab.start_wan(imp, seed=c.seed)

    def _configure(self, node: Node, *, bootstrap: tuple[str, ...]) -> None:
        config = node.home.config()
        node.home.save_config(
            dataclasses.replace(config, bootstrap=bootstrap, listen=(node.listen,))
        )

    def launch(self, node: Node, *, wait: bool = True) -> None:
        """Start ``node``'s process on its home (again, after :meth:`kill`)."""
        (node.home.root / "api.json").unlink(missing_ok=True)
        argv = [sys.executable, "-m", "node.cli", "node", "--home", str(node.home.root)]
        if node.host is not None:
            argv = Lab.command(node.host, argv)
        log_file = open(node.home.root / "node.log", "ab")  # noqa: SIM115 - the child keeps it
        node.process = subprocess.Popen(
            argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's Ctrl-C goes to cx testnet, which stops them
        )
        log_file.close()
        node.client = None
        if wait:
            self._await_api(node)

    def _await_api(self, node: Node) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._try_api(node):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{node.name} did not start within {START_TIMEOUT_S:.0f} s; see its node.log"
                )
            time.sleep(POLL_S)

    def _try_api(self, node: Node) -> bool:
        """Connect to ``node``'s control API if it serves one yet.

        Raises RuntimeError when its process has exited.
        """
        if node.client is not None:
            return True
        if node.process is None:  # killed, not restarted yet
            return False
        if node.process.poll() is not None:
            log_path = node.home.root / "node.log"
            raise RuntimeError(f"{node.name} exited with {node.process.returncode}; see {log_path}")
        with contextlib.suppress(ClientError, OSError, ValueError):
            if node.host is None:
                client = ApiClient.from_home(node.home.root, timeout_s=10.0)
            else:
                url, token = read_api_info(node.home.root)
                client = _NetnsClient(node.host.netns, url, token, home=node.home.root)
            info = client.node_info()
            node.client, node.peer_id, node.addr = client, info["peer_id"], info["addrs"][0]
            return True
        return False

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

    def await_relayed(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until every node behind NAT can be reached: it holds a relay reservation,
        so it advertises a ``/p2p-circuit`` address."""
        deadline = time.monotonic() + timeout_s
        for node in self.nodes:
            while node.nat and not any("/p2p-circuit/" in a for a in _addrs(node)):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{node.name} found no relay: nobody can reach it")
                time.sleep(POLL_S)

    def kill(self, node: Node) -> None:
        """``kill -9`` the node's process, and its software TPM: a machine that crashed."""
        if node.process is not None and node.process.poll() is None:
            node.process.send_signal(signal.SIGKILL)
            node.process.wait()
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((node.home.tpm_dir / "swtpm.pid").read_text()), signal.SIGKILL)
        node.process = None
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
        if self.lab is not None:
            self.lab.close()
            self.lab = None
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
        happened: Callable[[dict[str, Any]], None] = lambda _: None,
    ) -> Verdict:
        """Submit the scenario's workload phase by phase, follow it to the end through the
        churn and partition of :attr:`conditions` (recorded in :attr:`events`), and check
        everything that must hold."""
        c = self.conditions
        rng = random.Random(c.seed)  # noqa: S311 - a reproducible plan, not a secret
        events = plan(
            [n.name for n in self.nodes], churn=c.churn, partition_s=c.partition_s, rng=rng
        )
        started = time.monotonic()
        deadline = started + timeout_s
        plans: list[JobPlan] = []
        ids: list[str] = []
        views: dict[str, dict[str, Any]] = {}
        phases = self.scenario.phases()
        for index, phase in enumerate(phases):
            for p in (p for p in phase if self.tpm or p.trust == "none"):
                while not self._try_api(self.buyers[p.buyer % len(self.buyers)]):
                    self._disturb_due(events, started, happened)  # its buyer is down
                    time.sleep(POLL_S)
                plans.append(p)
                ids.append(self.submit(p))
            last = index == len(phases) - 1
            while True:
                self._disturb_due(events, started, happened)
                for p, job_id in zip(plans, ids, strict=True):
                    with contextlib.suppress(ClientError):  # its buyer is down: the last view
                        views[p.name] = self._view(p, job_id)
                progress(list(views.values()))
                up = all(self._try_api(node) for node in self.nodes)  # restarted ones too
                if up and all(is_done(v) for v in views.values()) and not (last and events):
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(POLL_S * 2)
        verdict = Verdict(jobs=list(views.values()), trades=self.buyers[0].api().trades())
        for view in verdict.jobs:
            if view["expect"] == "unmatched":
                buyer = self.buyers[view["plan_buyer"]]
                with contextlib.suppress(ClientError):
                    view["why"] = buyer.api().why(view["id"])["explanation"]
                    buyer.api().cancel(view["id"])
        settle_by = time.monotonic() + SETTLE_S
        while True:  # a receipt may still be on its way to the provider's ledger
            verdict.problems.clear()
            self.check(verdict)
            if verdict.ok or time.monotonic() > settle_by:
                break
            time.sleep(POLL_S * 5)
        return verdict

    def _disturb_due(
        self, events: list[Event], started: float, happened: Callable[[dict[str, Any]], None]
    ) -> None:
        """Carry out the events of ``events`` whose time has come (removing them)."""
        while events and events[0].at_s <= time.monotonic() - started:
            self.events.append(self._disturb(events.pop(0), time.monotonic() - started))
            happened(self.events[-1])

    def _disturb(self, event: Event, at_s: float) -> dict[str, Any]:
        """Carry out one event of :func:`node.testnet.schedule.plan`; what happened."""
        by_name = {n.name: n for n in self.nodes}
        if event.kind is Kind.KILL:
            self.kill(by_name[event.nodes[0]])
        elif event.kind is Kind.RESTART:
            self.launch(by_name[event.nodes[0]], wait=False)
        elif event.kind is Kind.PARTITION:
            assert self.lab is not None
            side = [n for n in self.nodes if n.name in event.nodes]
            other = [n for n in self.nodes if n.name not in event.nodes]
            self.lab.partition([[_host(n) for n in side], [_host(n) for n in other]])
            return {
                "at_s": round(at_s, 1),
                "event": "partition",
                "nodes": [[n.name for n in side], [n.name for n in other]],
            }
        else:
            assert self.lab is not None
            self.lab.heal()
        return {"at_s": round(at_s, 1), "event": event.kind.value, "nodes": list(event.nodes)}

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


def _addrs(node: Node) -> list[str]:
    addrs: list[str] = node.api().node_info()["addrs"]
    return addrs


def _host(node: Node) -> Host:
    assert node.host is not None
    return node.host


def _free_port() -> int:
    """A TCP port free on loopback now, for a node to keep across restarts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
