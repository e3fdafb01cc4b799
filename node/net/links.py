"""Keeping a node connected, over any :class:`~node.net.transport.Network`.

Rules:
- :func:`keep_connected`: every address (ending in ``/p2p/<peer id>``) is dialled at start,
  and again whenever its peer is not connected, after a delay that doubles from
  ``Backoff.first_s`` up to ``Backoff.cap_s`` while dials fail and starts over once one
  succeeds. Each delay is spread by ``±jitter`` so that nodes restarted together do not
  redial in step. A peer that went away (killed, restarted elsewhere, partitioned) is
  dialled again without anyone asking.
- :func:`watch_peers`: ``on_up(peer)`` runs for every peer a connection comes up with,
  inbound or outbound, and again after it went away and came back, each in a task of its
  own (a slow one holds up nothing; an exception is logged and the watch goes on);
  ``on_down(peer)``, which must not block, when the last connection to it closed.
- Time is ``trio.current_time()``: a test's ``MockClock`` drives the backoff.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from node.net.transport import Network, NetworkError, PeerId

if TYPE_CHECKING:
    from trio_typing import TaskStatus  # see node/net/memnet.py: trio-stubs shadow trio

__all__ = ["Backoff", "keep_connected", "peer_of", "watch_peers"]

log = logging.getLogger(__name__)

PeerHook = Callable[[PeerId], Awaitable[None]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    first_s: float = 1.0
    cap_s: float = 30.0
    jitter: float = 0.2  # each delay is multiplied by a factor in [1 - jitter, 1 + jitter]

    def after(self, delay_s: float) -> float:
        """The delay before the next dial, given the last one (0 after a success)."""
        return min(self.cap_s, max(self.first_s, delay_s * 2))

    def spread(self, delay_s: float, rng: random.Random) -> float:
        return delay_s * rng.uniform(1 - self.jitter, 1 + self.jitter)


def peer_of(addr: str) -> PeerId:
    """The peer id an address names (its last ``/p2p/`` component).

    Raises ValueError if it names none.
    """
    _, sep, peer = addr.rpartition("/p2p/")
    if not sep or not peer or "/" in peer:
        raise ValueError(f"{addr!r} does not end in /p2p/<peer id>")
    return PeerId(peer)


async def keep_connected(
    net: Network,
    addrs: Sequence[str],
    *,
    backoff: Backoff = Backoff(),
    rng: random.Random | None = None,
    task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep a connection to each of ``addrs``; started once each was dialled once.

    Raises ValueError for an address that names no peer.
    """
    rng = rng or random.Random()  # noqa: S311 - spreads redials, no secret
    peers = {addr: peer_of(addr) for addr in addrs}
    delay = dict.fromkeys(addrs, 0.0)
    due = dict.fromkeys(addrs, trio.current_time())

    async def dial(addr: str) -> None:
        try:
            await net.connect(addr)
        except NetworkError as exc:
            delay[addr] = backoff.after(delay[addr])
            due[addr] = trio.current_time() + backoff.spread(delay[addr], rng)
            log.warning("peer %s unreachable (%s); next try in %.1f s", addr, exc, delay[addr])
        else:
            delay[addr] = 0.0

    for addr in addrs:
        await dial(addr)
    task_status.started()
    while True:
        now = trio.current_time()
        missing = [a for a in addrs if peers[a] not in net.peers()]
        for addr in missing:
            if due[addr] <= now:  # a peer that was connected is redialled at once
                await dial(addr)
        missing = [a for a in addrs if peers[a] not in net.peers()]
        next_due = min((due[a] for a in missing), default=None)
        wait = backoff.cap_s if next_due is None else max(0.0, next_due - trio.current_time())
        with trio.move_on_after(wait):
            await net.wait_peers_changed()


async def watch_peers(net: Network, on_up: PeerHook, on_down: Callable[[PeerId], None]) -> None:
    """Call ``on_up``/``on_down`` as peers come and go, until cancelled."""
    async with trio.open_nursery() as nursery:
        known: frozenset[PeerId] = frozenset()
        while True:
            now = net.peers()
            for peer in sorted(known - now):
                on_down(peer)
            for peer in sorted(now - known):
                nursery.start_soon(_guarded, on_up, peer)
            known = now
            await net.wait_peers_changed()


async def _guarded(hook: PeerHook, peer: PeerId) -> None:
    try:
        await hook(peer)
    except Exception:
        # Top of a per-peer task: log it, keep watching the others.
        log.exception("peer hook %r failed for %s", hook, peer)
