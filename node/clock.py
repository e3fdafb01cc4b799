"""The shell's side of the sans-IO contract: the time, randomness and timeouts that
``protocol/`` takes as arguments. Every service of a node gets them as objects, never from a
module global, so a test (or the simulator) can run a whole market of nodes under trio's
``MockClock`` with seeded randomness and its own timings.

- :class:`Clock` is the protocol's time (milliseconds since the Unix epoch) and advances
  with trio's clock: under ``MockClock`` every expiry, heartbeat and timeout moves with
  virtual time. It is made inside ``trio.run``.
- :data:`Entropy` gives random bytes: :func:`os.urandom` in a node, a seeded generator in
  a simulation.
- :class:`Timings` holds every timeout and period of the market roles.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from protocol.envelope import NONCE_SIZE

__all__ = ["Clock", "Entropy", "Timings", "system_entropy"]

Entropy = Callable[[int], bytes]
system_entropy: Entropy = os.urandom


class Clock:
    """Protocol time: ``epoch_ms`` (default: the wall clock) at the moment it was made, then
    advancing with ``trio.current_time()``. Monotonic, so a clock step never reorders
    expiries. Create it inside ``trio.run``."""

    __slots__ = ("_offset_ms",)

    def __init__(self, epoch_ms: int | None = None) -> None:
        start = time.time_ns() // 1_000_000 if epoch_ms is None else epoch_ms
        self._offset_ms = start - int(trio.current_time() * 1000)

    def now_ms(self) -> int:
        return self._offset_ms + int(trio.current_time() * 1000)


def nonce(entropy: Entropy, size: int = NONCE_SIZE) -> bytes:
    """A fresh message nonce (16 bytes) or attestation nonce (32) from ``entropy``."""
    return entropy(size)


@dataclass(frozen=True, slots=True, kw_only=True)
class Timings:
    """Every timeout and period of a node's market roles, in seconds unless named ``_ms``.

    The defaults are the production values (spec/peer.md); tests shorten or lengthen them
    by passing their own, never by patching a module."""

    maintenance_s: float = 1.0  # book expiry and replay-guard upkeep
    hello_timeout_s: float = 5.0  # one hello exchange; a book sync gets four times this
    bid_ttl_ms: int = 3_600_000  # how long a bid rests in the books of the network
    negotiation_timeout_s: float = 30.0  # covers a TPM quote, or a preemption's grace
    agreement_timeout_s: float = 30.0  # provider: from its accept to the buyer's agreement
    heartbeat_s: float = 1.0  # buyer: how often it asks about a running job
    missed_heartbeats: int = 3  # ... and how many unanswered make it the provider's fault
    provider_fetch_timeout_s: float = 600.0  # provider: image, inputs and checkpoint
    buyer_fetch_timeout_s: float = 300.0  # buyer: outputs and logs before countersigning
    delivery_timeout_s: float = 330.0  # provider: one outbox message (covers the fetch)
    retry_s: float = 2.0  # provider: how often the outbox is retried
    offer_refresh: float = 0.9  # provider: re-post its offer at this share of its lifetime
