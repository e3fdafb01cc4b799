"""Errors of the protocol core.

Tree::

    ProtocolError                 base of everything this package raises
    +-- LocalProtocolError        we misused the API (bad argument, illegal transition)
    +-- RemoteProtocolError       a peer sent something we must refuse
        +-- DecodeError           bytes are not one canonical, bounded encoding
        +-- InvalidMessage        well-formed bytes, but a rule of the protocol is broken

Every error carries a machine-readable ``reason`` (a :class:`Reason`), which peer scoring,
the CLI and the test vectors use; the message is for people.
"""

from __future__ import annotations

import enum

__all__ = [
    "DecodeError",
    "InvalidMessage",
    "LocalProtocolError",
    "ProtocolError",
    "Reason",
    "RemoteProtocolError",
]


class Reason(enum.StrEnum):
    """Why something was refused; the values appear in spec/ and its vectors."""

    # encoding (spec/encoding.md)
    TRUNCATED = "truncated"
    TRAILING_BYTES = "trailing-bytes"
    TOO_LARGE = "too-large"
    TOO_DEEP = "too-deep"
    TOO_LONG = "too-long"
    FORBIDDEN_TYPE = "forbidden-type"
    INVALID_UTF8 = "invalid-utf8"
    NON_STRING_KEY = "non-string-key"
    DUPLICATE_KEY = "duplicate-key"
    NON_CANONICAL = "non-canonical"
    MALFORMED = "malformed"
    # signing (spec/identity.md)
    BAD_SIGNATURE = "bad-signature"
    BAD_KEY = "bad-key"
    UNKNOWN_TYPE = "unknown-type"
    WRONG_TYPE = "wrong-type"
    EXPIRED = "expired"
    NOT_YET_VALID = "not-yet-valid"
    TTL_TOO_LONG = "ttl-too-long"
    REPLAYED = "replayed"
    # schema (spec/messages.md)
    MISSING_FIELD = "missing-field"
    UNKNOWN_FIELD = "unknown-field"
    BAD_FIELD = "bad-field"
    # sealed secrets (spec/messages.md)
    BAD_SEAL = "bad-seal"
    # trade (spec/lifecycle.md, spec/settlement.md)
    WRONG_PARTY = "wrong-party"
    TERMS_MISMATCH = "terms-mismatch"
    ILLEGAL_TRANSITION = "illegal-transition"
    # reputation (spec/reputation.md)
    SELF_DEALING = "self-dealing"


class ProtocolError(Exception):
    """Base class; ``reason`` says why in a machine-readable way."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason


class LocalProtocolError(ProtocolError):
    """The caller broke a rule (e.g. fired an event the state machine does not allow)."""


class RemoteProtocolError(ProtocolError):
    """A peer sent something the protocol refuses."""


class DecodeError(RemoteProtocolError):
    """Bytes that are not exactly one canonical encoding within the limits."""


class InvalidMessage(RemoteProtocolError):
    """A decodable message that breaks a rule: signature, timing, replay or schema."""
