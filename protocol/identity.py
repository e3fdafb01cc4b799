"""Identities: Ed25519 keys and libp2p-compatible peer ids (spec/identity.md).

Rules:
- A node has one Ed25519 key. The same key is its libp2p identity, so its peer id is the
  libp2p one: base58btc of the identity multihash of the protobuf-encoded public key
  (``08 01 12 20 || key``), which always starts ``12D3KooW``.
- Every signature is domain-separated: the signed bytes are ``domain || 0x00 || data``, so a
  signature made for one purpose can never be replayed as another (the key also signs Noise
  handshakes and libp2p records).
- Key material is serialised in libp2p's protobuf form so libp2p can load the same key file.
  This module does no file I/O; the node writes key files with mode 0600.
"""

from __future__ import annotations

from typing import NewType

import base58
import nacl.exceptions
import nacl.signing

from protocol.errors import InvalidMessage, LocalProtocolError, Reason

__all__ = ["PeerId", "PrivateKey", "PublicKey", "signing_input"]

PeerId = NewType("PeerId", str)

# libp2p crypto.proto: KeyType Ed25519 = 1; field 1 (type) varint, field 2 (data) bytes.
_PUBLIC_PREFIX = b"\x08\x01\x12\x20"
_PRIVATE_PREFIX = b"\x08\x01\x12\x40"
# multihash: identity (0x00), length 36.
_IDENTITY_MULTIHASH = b"\x00\x24"


def signing_input(domain: bytes, data: bytes) -> bytes:
    """The exact bytes a signature covers: ``domain || 0x00 || data``."""
    if b"\x00" in domain:
        raise LocalProtocolError(Reason.BAD_FIELD, "a signing domain may not contain NUL")
    return domain + b"\x00" + data


class PublicKey:
    """An Ed25519 public key; equal keys compare and hash equal."""

    __slots__ = ("_verify_key", "raw")

    def __init__(self, raw: bytes) -> None:
        """Raises InvalidMessage(BAD_KEY) if ``raw`` is not a 32-byte Ed25519 key."""
        if len(raw) != 32:
            raise InvalidMessage(Reason.BAD_KEY, f"public key is {len(raw)} bytes, not 32")
        try:
            self._verify_key = nacl.signing.VerifyKey(raw)
        except (nacl.exceptions.ValueError, nacl.exceptions.TypeError) as exc:
            raise InvalidMessage(Reason.BAD_KEY, "not an Ed25519 public key") from exc
        self.raw = bytes(raw)

    @property
    def peer_id(self) -> PeerId:
        return PeerId(base58.b58encode(_IDENTITY_MULTIHASH + _PUBLIC_PREFIX + self.raw).decode())

    @classmethod
    def from_peer_id(cls, peer_id: str) -> PublicKey:
        """Recover the key from a ``12D3KooW...`` peer id.

        Raises InvalidMessage(BAD_KEY) for anything else.
        """
        try:
            decoded = base58.b58decode(peer_id)
        except ValueError as exc:
            raise InvalidMessage(Reason.BAD_KEY, "peer id is not base58") from exc
        prefix = _IDENTITY_MULTIHASH + _PUBLIC_PREFIX
        if len(decoded) != len(prefix) + 32 or not decoded.startswith(prefix):
            raise InvalidMessage(Reason.BAD_KEY, "peer id is not an Ed25519 identity peer id")
        return cls(decoded[len(prefix) :])

    def verify(self, domain: bytes, data: bytes, signature: bytes) -> None:
        """Check ``signature`` over ``domain || 0 || data``.

        Raises InvalidMessage(BAD_SIGNATURE) if it does not verify.
        """
        if len(signature) != 64:
            raise InvalidMessage(Reason.BAD_SIGNATURE, "signature is not 64 bytes")
        try:
            self._verify_key.verify(signing_input(domain, data), signature)
        except nacl.exceptions.BadSignatureError as exc:
            raise InvalidMessage(Reason.BAD_SIGNATURE, "signature does not verify") from exc

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PublicKey) and other.raw == self.raw

    def __hash__(self) -> int:
        return hash(self.raw)

    def __repr__(self) -> str:
        return f"PublicKey({self.peer_id})"


class PrivateKey:
    """An Ed25519 signing key. Randomness comes from the caller (``from_seed``)."""

    __slots__ = ("_signing_key", "public_key")

    def __init__(self, seed: bytes) -> None:
        if len(seed) != 32:
            raise LocalProtocolError(Reason.BAD_KEY, "an Ed25519 seed is 32 bytes")
        self._signing_key = nacl.signing.SigningKey(seed)
        self.public_key = PublicKey(bytes(self._signing_key.verify_key))

    @classmethod
    def from_seed(cls, seed: bytes) -> PrivateKey:
        return cls(seed)

    @property
    def seed(self) -> bytes:
        return bytes(self._signing_key)

    @property
    def peer_id(self) -> PeerId:
        return self.public_key.peer_id

    def sign(self, domain: bytes, data: bytes) -> bytes:
        """Sign ``domain || 0 || data``; returns the 64-byte signature."""
        return self._signing_key.sign(signing_input(domain, data)).signature

    def to_libp2p_bytes(self) -> bytes:
        """libp2p's protobuf PrivateKey: type Ed25519, data = seed || public key."""
        return _PRIVATE_PREFIX + self.seed + self.public_key.raw

    @classmethod
    def from_libp2p_bytes(cls, data: bytes) -> PrivateKey:
        """Parse a libp2p protobuf Ed25519 private key; checks the embedded public key.

        Raises LocalProtocolError(BAD_KEY) if the bytes are not such a key.
        """
        if len(data) != len(_PRIVATE_PREFIX) + 64 or not data.startswith(_PRIVATE_PREFIX):
            raise LocalProtocolError(Reason.BAD_KEY, "not a libp2p Ed25519 private key")
        body = data[len(_PRIVATE_PREFIX) :]
        key = cls(body[:32])
        if key.public_key.raw != body[32:]:
            raise LocalProtocolError(Reason.BAD_KEY, "private key does not match its public key")
        return key

    def __repr__(self) -> str:
        return f"PrivateKey({self.peer_id})"
