"""Deterministic keys, nonces and realistic orders for protocol tests and benchmarks."""

from __future__ import annotations

import hashlib
import itertools

from protocol.identity import PrivateKey
from protocol.messages import (
    Arch,
    Bid,
    Constraints,
    ExitReason,
    JobSpec,
    JobState,
    Offer,
    Prices,
    Resources,
    TrustLevel,
    Usage,
)
from protocol.selling import Selling

GIB = 1 << 30
HOUR_MS = 3_600_000
T0 = 1_800_000_000_000  # a fixed "now" in ms
IMAGE = "sha256:" + "ab" * 32


def key(name: str) -> PrivateKey:
    return PrivateKey.from_seed(hashlib.sha256(name.encode()).digest())


class Nonces:
    """Distinct 16-byte nonces, deterministic."""

    def __init__(self, label: str = "n") -> None:
        self._label = label
        self._count = itertools.count()

    def __call__(self, size: int = 16) -> bytes:
        digest = hashlib.sha256(f"{self._label}{next(self._count)}".encode()).digest()
        return digest[:size]


def offer(
    *,
    cpu_milli: int = 4000,
    memory: int = 8 * GIB,
    cpu_price: int = 100_000,
    mem_price: int = 10_000,
    arch: Arch = Arch.AMD64,
    region: str = "eu",
    trust: tuple[TrustLevel, ...] = (TrustLevel.NONE,),
) -> Offer:
    return Offer(
        capacity=Resources(cpu_milli=cpu_milli, memory_bytes=memory, disk_bytes=20 * GIB),
        prices=Prices(cpu_core_hour=cpu_price, memory_gib_hour=mem_price, disk_gib_hour=100),
        arch=arch,
        trust=trust,
        region=region,
    )


def bid(
    *,
    cpu_milli: int = 1000,
    memory: int = GIB,
    cpu_limit: int = 200_000,
    mem_limit: int = 20_000,
    wall_ms: int = HOUR_MS,
    constraints: Constraints | None = None,
    command: tuple[str, ...] = ("sh", "-c", "echo hello > /out/greeting"),
) -> Bid:
    return Bid(
        job=JobSpec(image=IMAGE, command=command, env={"LANG": "C"}, wall_ms=wall_ms),
        resources=Resources(cpu_milli=cpu_milli, memory_bytes=memory),
        max_prices=Prices(cpu_core_hour=cpu_limit, memory_gib_hour=mem_limit, disk_gib_hour=200),
        constraints=constraints or Constraints(),
    )


def end_job(selling: Selling, nonce: Nonces, agreement_id: bytes, now_ms: int = T0) -> None:
    """Run an agreed job to its receipt on the provider's side: its capacity frees."""
    for state in (JobState.TRANSFERRING, JobState.RUNNING):
        selling.status(agreement_id, state, nonce=nonce(), now_ms=now_ms)
    selling.issue_receipt(
        agreement_id,
        usage=Usage(wall_ms=1000, cpu_us=1000),
        exit_reason=ExitReason.SUCCESS,
        exit_code=0,
        nonce=nonce(),
        now_ms=now_ms,
    )
