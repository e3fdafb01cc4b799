"""An emulated wide-area network: one userspace router between the testnet's TUN devices.

Every namespace of a netns testnet (``node/testnet/netns.py``) reaches the others through
one TUN device, ``wan0``, whose other end is a file descriptor held by this process. The
kernel has no ``sch_netem`` on the machines we run on (and modules cannot be loaded), so
latency, jitter and loss are applied here, to real IP packets:

Rules:
- A packet is routed by its IPv4 destination to the TUN device of that address; a packet
  to an unknown address (or not IPv4) is dropped and counted.
- Each packet is dropped with probability ``loss``, else delivered after ``latency`` plus a
  uniform ``[-jitter, +jitter]`` (never less than zero). Packets of one (source, destination)
  pair keep their order: a packet never overtakes an earlier one of the same pair, so the
  jitter does not reorder a TCP stream (``tc netem`` would).
- While a partition holds, packets between addresses of different groups are dropped
  (an address in no group is cut off from everyone).
- One seeded random generator drives jitter and loss.
- Control: one command a line on stdin: ``partition A,B C,D`` (groups of addresses,
  separated by spaces), ``heal``, ``stats`` (answered with one JSON line on stdout).
  End of stdin stops the router.

Measured on the 2-core development machine (TCP between two namespaces, MTU 1500):
152 MB/s with no delay; with 25 ms each way a 1-byte round trip takes 50.9 ms at the median
(+0.9 ms over the nominal 50 ms; vde2's wirefilter, evaluated beside it, gave 49.5 ms and
67 MB/s with no delay). See the README, "Testnets that look like the internet".

Run as a script, ``python wan.py --link FD=ADDRESS ... --latency-ms 50`` with the
descriptors inherited (``pass_fds``); :class:`~node.testnet.netns.Lab` does that. It imports
the standard library only, so it starts in tens of milliseconds.
"""

from __future__ import annotations

import argparse
import heapq
import ipaddress
import json
import os
import random
import select
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["Impairment", "Router", "main"]

_READ_BURST = 64  # packets read from one device before looking at the others
_MAX_PACKET = 65536


@dataclass(frozen=True, slots=True, kw_only=True)
class Impairment:
    """What every path of the emulated network does to a packet (one way)."""

    latency_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.jitter_s < 0:
            raise ValueError("latency and jitter cannot be negative")
        if not 0.0 <= self.loss < 1.0:
            raise ValueError("loss is a probability below 1")


@dataclass(slots=True)
class Router:
    """The forwarding state; :meth:`route` decides, :meth:`due` releases."""

    devices: dict[bytes, int]  # packed IPv4 address -> TUN descriptor
    impairment: Impairment
    rng: random.Random
    groups: dict[bytes, int] | None = None  # address -> partition group, while one holds
    stats: dict[str, int] = field(
        default_factory=lambda: {"forwarded": 0, "lost": 0, "cut": 0, "unroutable": 0}
    )
    _queue: list[tuple[float, int, int, bytes]] = field(default_factory=list)
    _last: dict[tuple[bytes, bytes], float] = field(default_factory=dict)
    _seq: int = 0

    def route(self, packet: bytes, now: float) -> None:
        """Queue ``packet`` for its destination, or drop it."""
        if len(packet) < 20 or packet[0] >> 4 != 4:
            self.stats["unroutable"] += 1
            return
        src, dst = packet[12:16], packet[16:20]
        out = self.devices.get(dst)
        if out is None:
            self.stats["unroutable"] += 1
            return
        if self.groups is not None and self.groups.get(src, -1) != self.groups.get(dst, -2):
            self.stats["cut"] += 1
            return
        imp = self.impairment
        if imp.loss and self.rng.random() < imp.loss:
            self.stats["lost"] += 1
            return
        jitter = self.rng.uniform(-imp.jitter_s, imp.jitter_s) if imp.jitter_s else 0.0
        delay = imp.latency_s + jitter
        at = max(now + max(delay, 0.0), self._last.get((src, dst), 0.0))
        self._last[(src, dst)] = at
        self._seq += 1
        heapq.heappush(self._queue, (at, self._seq, out, packet))

    def due(self, now: float) -> list[tuple[int, bytes]]:
        """The packets whose time has come, in order, as (descriptor, packet)."""
        ready = []
        while self._queue and self._queue[0][0] <= now:
            _, _, out, packet = heapq.heappop(self._queue)
            ready.append((out, packet))
        return ready

    def next_due(self) -> float | None:
        return self._queue[0][0] if self._queue else None

    def partition(self, groups: Iterable[Iterable[str]]) -> None:
        self.groups = {
            ipaddress.IPv4Address(a).packed: i for i, group in enumerate(groups) for a in group
        }

    def heal(self) -> None:
        self.groups = None


def _command(router: Router, line: str) -> None:
    words = line.split()
    if not words:
        return
    if words[0] == "partition":
        router.partition(group.split(",") for group in words[1:])
    elif words[0] == "heal":
        router.heal()
    elif words[0] == "stats":
        sys.stdout.write(json.dumps(router.stats) + "\n")
        sys.stdout.flush()
    else:
        sys.stderr.write(f"wan: unknown command {words[0]!r}\n")


def serve(router: Router) -> None:
    """Forward until stdin closes."""
    poller = select.epoll()
    for fd in router.devices.values():
        poller.register(fd, select.EPOLLIN)
    control = sys.stdin.fileno()
    poller.register(control, select.EPOLLIN | select.EPOLLHUP)
    pending = b""
    while True:
        nxt = router.next_due()
        timeout = -1.0 if nxt is None else max(0.0, nxt - time.monotonic())
        for fd, _ in poller.poll(timeout):
            if fd == control:
                chunk = os.read(control, 4096)
                if not chunk:
                    return
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    _command(router, line.decode())
                continue
            now = time.monotonic()
            for _ in range(_READ_BURST):
                try:
                    router.route(os.read(fd, _MAX_PACKET), now)
                except BlockingIOError:
                    break
        for out, packet in router.due(time.monotonic()):
            try:
                os.write(out, packet)
                router.stats["forwarded"] += 1
            except OSError:  # the namespace is going away, or its queue is full
                router.stats["lost"] += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the emulated WAN of a netns testnet")
    parser.add_argument("--link", action="append", default=[], help="FD=IPV4, inherited")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--loss", type=float, default=0.0, help="a fraction, 0.01 for 1%%")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    devices = {}
    for link in args.link:
        fd, _, address = link.partition("=")
        devices[ipaddress.IPv4Address(address).packed] = int(fd)
        os.set_blocking(int(fd), False)
    impairment = Impairment(
        latency_s=args.latency_ms / 1000, jitter_s=args.jitter_ms / 1000, loss=args.loss
    )
    serve(Router(devices, impairment, random.Random(args.seed)))  # noqa: S311 - emulation
    return 0


if __name__ == "__main__":
    sys.exit(main())
