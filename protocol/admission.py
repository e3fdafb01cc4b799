"""Admission of fresh messages: expiry, clock skew, lifetime and replay (spec/identity.md).

Rules:
- A message is admitted at ``now_ms`` only if ``iat - max_skew <= now < exp`` and its
  lifetime ``exp - iat`` is within the limit for its type.
- Replay protection is nonce + expiry: the pair (signer, nonce) is remembered until the
  message expires, and a second message with the same pair is refused. Because lifetimes
  are bounded, so is the memory this takes.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from protocol.envelope import Signed
from protocol.errors import InvalidMessage, Reason

__all__ = ["DEFAULT_MAX_LIFETIME_MS", "AdmissionPolicy", "ReplayGuard", "admit"]

_MINUTE = 60_000
_HOUR = 60 * _MINUTE
DEFAULT_MAX_LIFETIME_MS = MappingProxyType(
    {
        "offer": 24 * _HOUR,
        "bid": 7 * 24 * _HOUR,  # standing bids wait until they match
        "cancel": 7 * 24 * _HOUR,
        "proposal": _HOUR,
        "accept": _HOUR,
        "reject": _HOUR,
        "job-status": _HOUR,
        "invitation": _HOUR,
        "usage-receipt": 30 * 24 * _HOUR,
        # TPM enrolment is one live exchange (spec/attestation.md §3.1)
        "enrolment": 10 * _MINUTE,
        "activation-challenge": 10 * _MINUTE,
        "activation-answer": 10 * _MINUTE,
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionPolicy:
    max_skew_ms: int = 30_000
    max_lifetime_ms: Mapping[str, int] = field(default_factory=lambda: DEFAULT_MAX_LIFETIME_MS)


@dataclass(slots=True)
class ReplayGuard:
    """Remembers (signer, nonce) pairs until their message expires."""

    _seen: set[tuple[bytes, bytes]] = field(default_factory=set)
    _expiry: list[tuple[int, bytes, bytes]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self._seen)

    def check_and_remember(self, msg: Signed[Any], now_ms: int) -> None:
        """Raises InvalidMessage(REPLAYED) for a pair seen before."""
        self.forget_expired(now_ms)
        pair = (msg.signer.raw, msg.nonce)
        if pair in self._seen:
            raise InvalidMessage(Reason.REPLAYED, f"{msg.type} from {msg.signer.peer_id} replayed")
        self._seen.add(pair)
        heapq.heappush(self._expiry, (msg.expires_ms, *pair))

    def forget_expired(self, now_ms: int) -> None:
        while self._expiry and self._expiry[0][0] <= now_ms:
            _, signer, nonce = heapq.heappop(self._expiry)
            self._seen.discard((signer, nonce))


def admit(
    msg: Signed[Any],
    now_ms: int,
    guard: ReplayGuard,
    policy: AdmissionPolicy = AdmissionPolicy(),
) -> None:
    """Admit ``msg`` at ``now_ms`` or raise.

    Raises:
        InvalidMessage: EXPIRED, NOT_YET_VALID, TTL_TOO_LONG or REPLAYED.
    """
    if now_ms >= msg.expires_ms:
        raise InvalidMessage(Reason.EXPIRED, f"{msg.type} expired at {msg.expires_ms}")
    if msg.issued_ms - policy.max_skew_ms > now_ms:
        raise InvalidMessage(Reason.NOT_YET_VALID, f"{msg.type} issued in the future")
    limit = policy.max_lifetime_ms[msg.type]
    if msg.expires_ms - msg.issued_ms > limit:
        raise InvalidMessage(Reason.TTL_TOO_LONG, f"{msg.type} lives longer than {limit} ms")
    guard.check_and_remember(msg, now_ms)
