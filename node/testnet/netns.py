"""Linux network namespaces for a testnet that looks like the internet (needs root).

A :class:`Lab` builds, inside this machine only, one emulated internet:

- Every host gets its own network namespace, ``cx<pid>-<n>``, with loopback and one TUN
  device ``wan0`` on the emulated WAN, ``198.18.0.0/15`` (RFC 2544's benchmarking range:
  addresses that are not ours to route anywhere else, and that libp2p's NAT helpers count
  as public, unlike ``10/8``). IPv6 is off.
- The other end of every ``wan0`` is a descriptor of one router process,
  ``node/testnet/wan.py``, which applies latency, jitter, loss and partitions to each packet
  (the kernel here has no ``sch_netem``).
- A host behind NAT sits in its own namespace on a LAN (``10.<k>.0.2/24``, a veth pair) to a
  router namespace, ``cx<pid>-<n>r``, whose ``wan0`` has the public address: iptables
  masquerade outward, and inbound only what answers a connection from inside (unsolicited
  packets are dropped, as a home router does). Such a host can only be reached by relay or
  by hole punching.
- :func:`entered` runs a block of this thread inside a namespace, so a socket made there
  (the testnet's control-API calls to a node's 127.0.0.1) belongs to it.
- Namespaces of a lab whose process died are removed by the next lab.

Every address is inside namespaces this module made; nothing routes to the outside.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import json
import logging
import os
import re
import struct
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO

from node.testnet import wan
from node.testnet.wan import Impairment

__all__ = ["Host", "Lab", "LabError", "entered"]

log = logging.getLogger(__name__)

WAN = ipaddress.IPv4Network("198.18.0.0/15")
WAN_DEVICE = "wan0"
LAN_DEVICE = "lan0"
MTU = 1500
_TUNSETIFF = 0x400454CA
_IFF_TUN, _IFF_NO_PI = 0x0001, 0x1000
_CLONE_NEWNET = 0x40000000
_NAME = re.compile(r"^cx(\d+)-\d+r?$")
_ROUTER_RULES = f"""*nat
-A POSTROUTING -o {WAN_DEVICE} -j MASQUERADE
COMMIT
*filter
-A INPUT -i {WAN_DEVICE} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
-A INPUT -i {WAN_DEVICE} -j DROP
-A FORWARD -i {WAN_DEVICE} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
-A FORWARD -i {WAN_DEVICE} -j DROP
COMMIT
"""


class LabError(Exception):
    """The namespaces could not be made (not root, no iproute2 or iptables)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Host:
    name: str
    netns: str
    address: str  # where it listens: its LAN address when behind NAT
    public: str  # where the emulated internet sees it: its router's address behind NAT

    @property
    def nat(self) -> bool:
        return self.address != self.public


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc().setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise LabError(f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def entered(netns: str) -> Iterator[None]:
    """Run the block with this thread in ``netns``; sockets made there stay there."""
    with open("/proc/thread-self/ns/net", "rb") as home, open(f"/run/netns/{netns}", "rb") as ns:
        _setns(ns.fileno())
        try:
            yield
        finally:
            _setns(home.fileno())


def _run(argv: Sequence[str], stdin: str | None = None) -> None:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")


def _ip(netns: str | None, commands: list[str]) -> None:
    """Run iproute2 ``commands`` in one process, in ``netns`` (None: this namespace)."""
    where = ["-n", netns] if netns else []
    _run(["ip", *where, "-batch", "-"], "\n".join(commands) + "\n")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> None:
    """Delete namespaces left by labs whose process is gone (a crash, a kill -9)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    for line in listing.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        match = _NAME.match(name)
        if match and not _alive(int(match.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


class Lab:
    """The namespaces, NAT routers and WAN router of one emulated internet."""

    def __init__(self) -> None:
        if os.geteuid() != 0:
            raise LabError("a netns testnet needs root (namespaces, TUN devices, iptables)")
        remove_stale()
        self.prefix = f"cx{os.getpid()}"
        self.hosts: list[Host] = []
        self._namespaces: list[str] = []
        self._tuns: dict[str, int] = {}  # public address -> TUN descriptor (until the WAN)
        self._wan: subprocess.Popen[str] | None = None

    # -- building ----------------------------------------------------------------------

    def add_host(self, name: str, *, nat: bool = False) -> Host:
        """A new host on the WAN, or behind its own NAT router when ``nat``."""
        n = len(self.hosts)
        public = str(WAN.network_address + n + 1)
        netns = f"{self.prefix}-{n}"
        edge = f"{netns}r" if nat else netns
        self._namespace(netns)
        if nat:
            self._namespace(edge)
        self._tun(edge, public, tmp=f"{self.prefix}w{n}")
        address = public
        if nat:
            address = self._nat(edge, netns, n, tmp=f"{self.prefix}l{n}")
        host = Host(name=name, netns=netns, address=address, public=public)
        self.hosts.append(host)
        return host

    def _namespace(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self._namespaces.append(name)
        _ip(name, ["link set lo up"])
        _run(["ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])

    def _tun(self, netns: str, address: str, *, tmp: str) -> None:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", tmp.encode(), _IFF_TUN | _IFF_NO_PI))
        except OSError as exc:
            os.close(fd)
            raise LabError(f"cannot make a TUN device: {exc}") from exc
        self._tuns[address] = fd
        _ip(None, [f"link set {tmp} netns {netns}"])
        _ip(
            netns,
            [
                f"link set {tmp} name {WAN_DEVICE}",
                f"addr add {address}/{WAN.prefixlen} dev {WAN_DEVICE}",
                f"link set {WAN_DEVICE} mtu {MTU} up",
            ],
        )

    def _nat(self, router: str, inside: str, n: int, *, tmp: str) -> str:
        lan = ipaddress.IPv4Network(f"10.{(n % 250) + 1}.0.0/24")
        gateway, address = str(lan.network_address + 1), str(lan.network_address + 2)
        _ip(
            None,
            [
                f"link add {tmp}a type veth peer name {tmp}b",
                f"link set {tmp}a netns {router}",
                f"link set {tmp}b netns {inside}",
            ],
        )
        _ip(
            router,
            [
                f"link set {tmp}a name {LAN_DEVICE}",
                f"addr add {gateway}/24 dev {LAN_DEVICE}",
                f"link set {LAN_DEVICE} up",
            ],
        )
        _ip(
            inside,
            [
                f"link set {tmp}b name {LAN_DEVICE}",
                f"addr add {address}/24 dev {LAN_DEVICE}",
                f"link set {LAN_DEVICE} up",
                f"route add default via {gateway}",
            ],
        )
        _run(["ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        _run(["ip", "netns", "exec", router, "iptables-restore"], _ROUTER_RULES)
        return address

    # -- the WAN -----------------------------------------------------------------------

    def start_wan(self, impairment: Impairment, *, seed: int = 0) -> None:
        """Start the router process that carries every packet between the hosts."""
        fds = list(self._tuns.values())
        # By its path, not ``-m node.testnet.wan``: importing the package would import the
        # testnet runner and most of the node first (a second or more on a busy machine,
        # while the hosts' first packets wait). The router needs the standard library only.
        argv = [sys.executable, "-I", wan.__file__, f"--seed={seed}"]
        argv += [f"--link={fd}={address}" for address, fd in self._tuns.items()]
        argv += [
            f"--latency-ms={impairment.latency_s * 1000}",
            f"--jitter-ms={impairment.jitter_s * 1000}",
            f"--loss={impairment.loss}",
        ]
        self._wan = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, pass_fds=fds
        )
        for fd in fds:  # the router holds them now; a TUN device lives as long as its holder
            os.close(fd)
        self._tuns.clear()
        self.wan_stats()  # answered from the router's loop: it carries packets from now on

    def _control(self, line: str) -> IO[str]:
        if self._wan is None or self._wan.stdin is None or self._wan.stdout is None:
            raise LabError("the WAN is not running")
        self._wan.stdin.write(line + "\n")
        self._wan.stdin.flush()
        return self._wan.stdout

    def partition(self, groups: Sequence[Sequence[Host]]) -> None:
        """Cut the WAN between the groups (a host in no group is cut off from all)."""
        self._control("partition " + " ".join(",".join(h.public for h in g) for g in groups))

    def heal(self) -> None:
        self._control("heal")

    def wan_stats(self) -> dict[str, int]:
        stats: dict[str, int] = json.loads(self._control("stats").readline())
        return stats

    # -- running -----------------------------------------------------------------------

    @staticmethod
    def command(host: Host, argv: Sequence[str]) -> list[str]:
        """``argv`` to run inside ``host``'s network namespace.

        ``nsenter --net``, not ``ip netns exec``: the latter also remounts /sys for the
        namespace, which hides /sys/fs/cgroup from the node's container runtime.
        """
        return ["nsenter", f"--net=/run/netns/{host.netns}", "--", *argv]

    def close(self) -> None:
        """Stop the WAN and delete every namespace (their devices and rules go with them)."""
        if self._wan is not None:
            if self._wan.stdin is not None:
                with contextlib.suppress(OSError):
                    self._wan.stdin.close()
            try:
                self._wan.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._wan.kill()
                self._wan.wait()
            self._wan = None
        for fd in self._tuns.values():
            os.close(fd)
        self._tuns.clear()
        for name in reversed(self._namespaces):
            try:
                _run(["ip", "netns", "del", name])
            except LabError as exc:
                log.warning("could not remove namespace %s: %s", name, exc)
        self._namespaces.clear()

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
