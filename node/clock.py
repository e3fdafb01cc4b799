"""The shell's side of the sans-IO contract: the time and the randomness ``protocol/`` takes
as arguments. Every module of ``node/`` gets them here."""

from __future__ import annotations

import os
import time

from protocol.envelope import NONCE_SIZE

__all__ = ["new_nonce", "now_ms"]


def now_ms() -> int:
    """Milliseconds since the Unix epoch (the protocol's clock)."""
    return time.time_ns() // 1_000_000


def new_nonce(size: int = NONCE_SIZE) -> bytes:
    return os.urandom(size)
