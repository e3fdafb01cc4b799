"""Off loopback: the emulated WAN, and libp2p nodes behind real NAT (node/testnet/netns.py).

Every host is a network namespace on an emulated WAN (``node/testnet/wan.py``); a host
behind NAT sits behind its own iptables masquerade router that drops unsolicited packets,
so it can only be reached through a relay or by hole punching. The libp2p nodes are
``tests/node/netns_peer.py`` processes driven over stdin/stdout. Needs root, iproute2 and
iptables, which CI has. Waits are on conditions, bounded; the only time checked is a
lower bound the emulator guarantees (a packet is never early).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node.testnet.netns import Host, Lab, entered
from node.testnet.wan import Impairment

pytestmark = pytest.mark.integration

LATENCY_S = 0.02
HELPER = Path(__file__).with_name("netns_peer.py")
PORT = 4001


class Peer:
    """A netns_peer.py process in a host's namespace."""

    def __init__(self, lab: Lab, host: Host, logs: Path, seed: int, *bootstrap: str) -> None:
        argv = [sys.executable, str(HELPER), str(seed), f"/ip4/{host.address}/tcp/{PORT}"]
        with (logs / f"{host.name}.log").open("w") as log:
            self.process = subprocess.Popen(
                lab.command(host, [*argv, *bootstrap]),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        self.info = self._answer()
        self.id: str = self.info["peer"]

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"the peer process exited with {self.process.wait()}"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.process.stdin.flush()
        return self._answer()

    def do(self, op: str, **fields: Any) -> dict[str, Any]:
        answer = self.ask(op, **fields)
        assert "error" not in answer, f"{op} {fields}: {json.dumps(answer)}"
        return answer

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with Lab() as lab:
        for name in ("relay", "public", "dialer"):
            lab.add_host(name)
        for name in ("nat-a", "nat-b"):
            lab.add_host(name, nat=True)
        lab.start_wan(Impairment(latency_s=LATENCY_S))
        yield lab


def host(lab: Lab, name: str) -> Host:
    return next(h for h in lab.hosts if h.name == name)


@pytest.fixture(scope="module")
def peers(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Peer]]:
    """relay and public are reachable; nat-a and nat-b bootstrap from both (AutoNAT needs
    two verdicts); dialer knows only the relay. Their logs stay in pytest's tmp dir."""
    logs = tmp_path_factory.mktemp("netns-peers")
    started: dict[str, Peer] = {}
    try:
        started["relay"] = Peer(lab, host(lab, "relay"), logs, 1)
        seed = started["relay"].info["addrs"][0]
        started["public"] = Peer(lab, host(lab, "public"), logs, 2, seed)
        both = (seed, started["public"].info["addrs"][0])
        started["nat-a"] = Peer(lab, host(lab, "nat-a"), logs, 3, *both)
        started["nat-b"] = Peer(lab, host(lab, "nat-b"), logs, 4, *both)
        started["dialer"] = Peer(lab, host(lab, "dialer"), logs, 5, seed)
        yield started
    finally:
        for peer in started.values():
            peer.stop()


# -- the emulated internet ------------------------------------------------------------------


def tcp_listener(netns: str) -> socket.socket:
    with entered(netns):
        listener = socket.create_server(("0.0.0.0", 0))
    return listener


def tcp_connect(netns: str, address: str, port: int, timeout: float = 2.0) -> socket.socket:
    with entered(netns):
        sock = socket.socket()
    sock.settimeout(timeout)
    sock.connect((address, port))
    return sock


def test_the_wan_delays_every_packet_and_partitions_cut_and_heal(lab: Lab) -> None:
    a, b = host(lab, "relay"), host(lab, "public")
    listener = tcp_listener(a.netns)
    port = listener.getsockname()[1]
    started = time.monotonic()
    tcp_connect(b.netns, a.address, port).close()
    assert time.monotonic() - started >= 2 * LATENCY_S  # SYN out, SYN-ACK back: never early

    lab.partition([[a], [b]])
    with pytest.raises(TimeoutError):
        tcp_connect(b.netns, a.address, port, timeout=0.5)
    lab.heal()
    tcp_connect(b.netns, a.address, port).close()
    assert lab.wan_stats()["cut"] > 0
    listener.close()


def test_nat_lets_answers_in_and_nothing_else(lab: Lab) -> None:
    inside, outside = host(lab, "nat-a"), host(lab, "relay")
    listener = tcp_listener(outside.netns)
    conn = tcp_connect(inside.netns, outside.address, listener.getsockname()[1])
    accepted, (seen_from, _) = listener.accept()
    assert seen_from == inside.public != inside.address  # masqueraded
    conn.sendall(b"ping")
    assert accepted.recv(4) == b"ping"
    accepted.sendall(b"pong")  # an answer gets in
    assert conn.recv(4) == b"pong"
    for sock in (conn, accepted, listener):
        sock.close()

    behind = tcp_listener(inside.netns)
    port = behind.getsockname()[1]
    with pytest.raises(TimeoutError):  # dropped unanswered, as a home router does
        tcp_connect(outside.netns, inside.public, port, timeout=0.5)
    with pytest.raises(OSError, match="unreachable"):  # the LAN routes nowhere from outside
        tcp_connect(outside.netns, inside.address, port, timeout=0.5)
    behind.close()


# -- libp2p through NAT (node/net/p2p.py: AutoNAT, circuit relay v2, DCUtR, DHT) -------------


def test_a_node_behind_nat_learns_it_is_private_and_is_reached_through_a_relay(
    peers: dict[str, Peer],
) -> None:
    nat, dialer = peers["nat-a"], peers["dialer"]
    relayed = nat.do("await", what="relayed")  # AutoNAT said private; a relay holds a slot
    assert relayed["reachability"] == "private"
    assert peers["public"].do("await", what="reachability", value="public")
    circuit = relayed["addrs"][0]
    assert "/p2p-circuit/" in circuit
    lan = next(a for a in relayed["addrs"] if "/p2p-circuit" not in a)

    assert "error" in dialer.ask("connect", addr=lan, timeout=15)  # NAT: no way in directly
    dialer.do("connect", addr=circuit)
    # DCUtR upgrades the relayed connection: the node behind NAT dials the reachable one.
    dialer.do("await", what="connected", peer=nat.id, kind="direct")


def test_two_nodes_behind_nat_punch_a_direct_connection(peers: dict[str, Peer]) -> None:
    a, b = peers["nat-a"], peers["nat-b"]
    circuit = a.do("await", what="relayed")["addrs"][0]
    b.do("await", what="relayed")
    b.do("connect", addr=circuit)
    # Neither can dial the other: only a TCP simultaneous open through both NATs (DCUtR's
    # hole punch) makes a direct connection.
    b.do("await", what="connected", peer=a.id, kind="direct")
    a.do("await", what="connected", peer=b.id, kind="direct")


def test_the_dht_finds_a_provider_behind_nat_and_it_is_reached(peers: dict[str, Peer]) -> None:
    provider, finder = peers["nat-b"], peers["dialer"]
    provider.do("await", what="relayed")
    provider.do("provide", key="cx/offers/1/test")
    found = finder.do("find", key="cx/offers/1/test")["found"]
    assert list(found) == [provider.id]
    answers = [finder.ask("connect", addr=addr, timeout=15) for addr in found[provider.id]]
    assert any("error" not in answer for answer in answers), answers
    finder.do("await", what="connected", peer=provider.id, kind="direct")
