"""Signed messages (spec/identity.md, "Signed messages").

Rules:
- The wire form is ``signature (64 bytes) || body``; ``body`` is the canonical encoding of
  ``{"type", "from", "nonce", "iat", "exp", "data"}``. The signature covers
  ``b"cx/<type>/v1" || 0x00 || body``: exactly the bytes that travel, never a re-encoding,
  and the type is in the domain, so no message can be replayed as another type.
- A message's id is ``sha256(body)``. Ed25519 signatures are not malleable in libsodium,
  but the id does not depend on that.
- Opening a message checks encoding, signature and schema. Time and replay are checked
  separately, at admission (protocol.admission), so a stored receipt can be re-verified
  long after it expired.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Generic, NewType, TypeVar

from protocol import messages as m
from protocol.encoding import DEFAULT_LIMITS, Limits, decode, encode
from protocol.errors import DecodeError, InvalidMessage, LocalProtocolError, Reason
from protocol.fastpath import FastCodec
from protocol.identity import PrivateKey, PublicKey
from protocol.schema import from_value, to_value

__all__ = [
    "MESSAGE_TYPES",
    "MessageId",
    "Signed",
    "check_sealable",
    "domain_of",
    "open_signed",
    "seal",
]

MessageId = NewType("MessageId", bytes)

MESSAGE_TYPES: dict[str, type] = {
    "offer": m.Offer,
    "bid": m.Bid,
    "cancel": m.Cancel,
    "proposal": m.Proposal,
    "accept": m.Accept,
    "reject": m.Reject,
    "job-status": m.JobStatus,
    "usage-receipt": m.UsageReceipt,
    "job-secrets": m.JobSecrets,
    "enrolment": m.Enrolment,
    "activation-challenge": m.ActivationChallenge,
    "activation-answer": m.ActivationAnswer,
    "invitation": m.Invitation,
}
_TYPE_NAMES = {cls: name for name, cls in MESSAGE_TYPES.items()}
_DOMAINS = {name: f"cx/{name}/v1".encode() for name in MESSAGE_TYPES}
_BODY_KEYS = frozenset({"type", "from", "nonce", "iat", "exp", "data"})
SIGNATURE_SIZE = 64
NONCE_SIZE = 16

T = TypeVar("T")


def domain_of(type_name: str) -> bytes:
    return _DOMAINS[type_name]


@dataclass(frozen=True, slots=True)
class Signed(Generic[T]):
    """A verified message, keeping the exact bytes it arrived as."""

    wire: bytes
    id: MessageId
    type: str
    signer: PublicKey
    nonce: bytes
    issued_ms: int
    expires_ms: int
    payload: T

    @property
    def body(self) -> bytes:
        return self.wire[SIGNATURE_SIZE:]


def seal(
    key: PrivateKey, payload: T, *, nonce: bytes, issued_ms: int, expires_ms: int
) -> Signed[T]:
    """Sign ``payload``; ``nonce`` (16 random bytes) and times come from the caller."""
    type_name = _TYPE_NAMES.get(type(payload))
    if type_name is None:
        raise LocalProtocolError(Reason.UNKNOWN_TYPE, f"{type(payload).__name__} is not a message")
    if len(nonce) != NONCE_SIZE:
        raise LocalProtocolError(Reason.BAD_FIELD, f"nonce must be {NONCE_SIZE} bytes")
    if expires_ms <= issued_ms:
        raise LocalProtocolError(Reason.BAD_FIELD, "a message must expire after it is issued")
    body = encode(
        {
            "type": type_name,
            "from": key.public_key.raw,
            "nonce": nonce,
            "iat": issued_ms,
            "exp": expires_ms,
            "data": to_value(payload),
        }
    )
    wire = key.sign(_DOMAINS[type_name], body) + body
    return Signed(
        wire=wire,
        id=MessageId(hashlib.sha256(body).digest()),
        type=type_name,
        signer=key.public_key,
        nonce=nonce,
        issued_ms=issued_ms,
        expires_ms=expires_ms,
        payload=payload,
    )


_ANY_TIME = 2**64 - 1  # the longest an ``iat`` or ``exp`` can encode


def check_sealable(payload: object, limits: Limits = DEFAULT_LIMITS) -> None:
    """Check that ``payload``, sealed by any key at any time, is a message every receiver
    decoding with ``limits`` takes: its whole wire form within ``limits.max_size`` and its
    body within every other limit, checked exactly as :func:`open_signed` checks it.

    Raises:
        DecodeError: the limit it breaks (TOO_LARGE, TOO_LONG, TOO_DEEP, ...).
        LocalProtocolError(UNKNOWN_TYPE): ``payload`` is not a message.
    """
    type_name = _TYPE_NAMES.get(type(payload))
    if type_name is None:
        raise LocalProtocolError(Reason.UNKNOWN_TYPE, f"{type(payload).__name__} is not a message")
    body = encode(
        {
            "type": type_name,
            "from": bytes(32),
            "nonce": bytes(NONCE_SIZE),
            "iat": _ANY_TIME,
            "exp": _ANY_TIME,
            "data": to_value(payload),
        }
    )
    wire = SIGNATURE_SIZE + len(body)
    if wire > limits.max_size:
        limit = limits.max_size
        raise DecodeError(Reason.TOO_LARGE, f"signed, it is {wire} bytes; the limit is {limit}")
    decode(body, limits)


def open_signed(
    wire: bytes, expect: type[T] | None = None, limits: Limits = DEFAULT_LIMITS
) -> Signed[T]:
    """Decode and verify a signed message; ``expect`` pins its type.

    Raises:
        DecodeError: the body is not one canonical value within ``limits``.
        InvalidMessage: BAD_SIGNATURE, BAD_KEY, UNKNOWN_TYPE, WRONG_TYPE or a schema reason.
    """
    if len(wire) <= SIGNATURE_SIZE:
        raise InvalidMessage(Reason.MALFORMED, "shorter than a signature")
    signature, body = wire[:SIGNATURE_SIZE], wire[SIGNATURE_SIZE:]
    codec = _fast_codec(limits)
    fast = codec.open(body) if codec is not None else None
    if fast is not None:
        type_name, raw_signer, nonce, issued_ms, expires_ms, fast_payload = fast
        if expect is not None and type(fast_payload) is not expect:
            expected = _TYPE_NAMES[expect]
            raise InvalidMessage(Reason.WRONG_TYPE, f"expected {expected}, got {type_name}")
        signer = _signer(raw_signer)
        signer.verify(_DOMAINS[type_name], body, signature)
        return Signed(
            wire=bytes(wire),
            id=MessageId(hashlib.sha256(body).digest()),
            type=type_name,
            signer=signer,
            nonce=nonce,
            issued_ms=issued_ms,
            expires_ms=expires_ms,
            payload=fast_payload,
        )
    head = _parse_body(decode(body, limits))
    type_name = head["type"]
    cls = MESSAGE_TYPES.get(type_name)
    if cls is None:
        raise InvalidMessage(Reason.UNKNOWN_TYPE, f"unknown message type {type_name!r}")
    if expect is not None and cls is not expect:
        raise InvalidMessage(Reason.WRONG_TYPE, f"expected {_TYPE_NAMES[expect]}, got {type_name}")
    signer = _signer(head["from"])
    signer.verify(_DOMAINS[type_name], body, signature)
    payload: T = from_value(cls, head["data"])
    return Signed(
        wire=bytes(wire),
        id=MessageId(hashlib.sha256(body).digest()),
        type=type_name,
        signer=signer,
        nonce=head["nonce"],
        issued_ms=head["iat"],
        expires_ms=head["exp"],
        payload=payload,
    )


_default_codec: FastCodec | None = None
# Gossip brings many orders from few signers: their keys are parsed once.
_SIGNERS: dict[bytes, PublicKey] = {}
_SIGNERS_KEPT = 4096


def _signer(raw: bytes) -> PublicKey:
    signer = _SIGNERS.get(raw)
    if signer is None:
        if len(_SIGNERS) >= _SIGNERS_KEPT:
            _SIGNERS.clear()
        signer = _SIGNERS[raw] = PublicKey(raw)
    return signer


def _fast_codec(limits: Limits) -> FastCodec | None:
    """The fast path for the default limits (the only ones peers use); None for others."""
    global _default_codec  # built on first use: building it costs milliseconds
    if limits is not DEFAULT_LIMITS:
        return None
    if _default_codec is None:
        _default_codec = FastCodec(MESSAGE_TYPES, DEFAULT_LIMITS, NONCE_SIZE)
    return _default_codec


def _parse_body(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidMessage(Reason.BAD_FIELD, "message body is not a map")
    if value.keys() != _BODY_KEYS:
        missing = ", ".join(sorted(_BODY_KEYS - value.keys()))
        if missing:
            raise InvalidMessage(Reason.MISSING_FIELD, f"body: missing {missing}")
        extra = ", ".join(sorted(value.keys() - _BODY_KEYS))
        raise InvalidMessage(Reason.UNKNOWN_FIELD, f"body: unknown {extra}")
    checks = (
        ("type", str),
        ("from", bytes),
        ("nonce", bytes),
        ("iat", int),
        ("exp", int),
    )
    for key, kind in checks:
        if type(value[key]) is not kind:
            raise InvalidMessage(Reason.BAD_FIELD, f"body.{key} has the wrong type")
    if len(value["nonce"]) != NONCE_SIZE:
        raise InvalidMessage(Reason.BAD_FIELD, f"body.nonce must be {NONCE_SIZE} bytes")
    if value["iat"] < 0 or value["exp"] <= value["iat"]:
        raise InvalidMessage(Reason.BAD_FIELD, "body.exp must be after body.iat >= 0")
    return value
