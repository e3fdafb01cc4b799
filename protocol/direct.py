"""The direct channel for bulk blob transfer: negotiation and records (spec/content.md,
"Direct channel"). Pure: nonces come in as arguments, no sockets here.

Rules:
- It is negotiated inside an authenticated ``/cx/blob/1`` stream. The requester sends
  ``{"op": "direct", "nonce": c}`` (32 random bytes); a server that offers one answers
  ``{"ok": true}`` then the frame ``{"nonce": s, "port": p}`` (32 random bytes, a TCP port
  on the address the requester reached it at) and accepts one connection there.
- Keys: HKDF-SHA256 (RFC 5869), salt ``cx/direct/v1``, input ``c || s``, info the direction
  (``c2s`` or ``s2c``) followed by the requester's then the server's peer id (UTF-8): one
  32-byte key per direction, fresh for every channel since both sides add a nonce, and
  bound to the two peers the libp2p stream authenticated (the nonces never leave it).
- Records, each way: a 4-byte big-endian ciphertext length, then AES-256-GCM ciphertext
  and tag, with the 12-byte nonce ``0x00000000 || u64 record number`` (from 0, per
  direction) and no associated data. A plaintext is 1 to :data:`MAX_RECORD` bytes.
- Record 0 each way is the hello (:data:`REQUESTER_HELLO`, :data:`SERVER_HELLO`): a side
  that cannot open the other's hello, or any later record, drops the connection. After
  the hellos the records carry the bytes of ``/cx/blob/1`` requests and replies, exactly
  as they would travel on the libp2p stream; the channel's end is the TCP connection's.

Errors: :class:`~protocol.errors.InvalidMessage` with ``MALFORMED`` (a bad negotiation
message), ``TOO_LARGE`` (a record length out of bounds) or ``BAD_SEAL`` (a record that
does not open: wrong key, tampered, reordered or replayed).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from protocol.encoding import Value, decode, encode
from protocol.errors import InvalidMessage, Reason

__all__ = [
    "MAX_RECORD",
    "NONCE_SIZE",
    "RECORD_HEADER",
    "REQUESTER_HELLO",
    "SERVER_HELLO",
    "TAG_SIZE",
    "DirectKeys",
    "DirectOffer",
    "Opener",
    "Sealer",
    "decode_offer",
    "derive_keys",
    "direct_request",
    "parse_direct_request",
]

NONCE_SIZE = 32
TAG_SIZE = 16
RECORD_HEADER = 4
# A 4 MiB chunk with its frame prefix fits one record, with room to spare.
MAX_RECORD = 4 * 1024 * 1024 + 64 * 1024
REQUESTER_HELLO = b"cx/direct/v1 requester"
SERVER_HELLO = b"cx/direct/v1 server"
_SALT = b"cx/direct/v1"
_LENGTH = struct.Struct(">I")


@dataclass(frozen=True, slots=True, kw_only=True)
class DirectKeys:
    """One side's keys: ``send`` seals what it writes, ``receive`` opens what it reads."""

    send: bytes
    receive: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class DirectOffer:
    """The server's answer: its nonce and the TCP port it listens on for this channel."""

    nonce: bytes
    port: int

    def encode(self) -> bytes:
        return encode({"nonce": self.nonce, "port": self.port})


def direct_request(nonce: bytes) -> dict[str, Value]:
    """The requester's ``/cx/blob/1`` request for a direct channel."""
    return {"op": "direct", "nonce": _checked_nonce(nonce)}


def parse_direct_request(request: dict[str, Value]) -> bytes:
    """The requester's nonce. Raises InvalidMessage(MALFORMED)."""
    if request.keys() != {"op", "nonce"} or request["op"] != "direct":
        raise InvalidMessage(Reason.MALFORMED, f"not a direct request: {sorted(request)}")
    return _checked_nonce(request["nonce"])


def decode_offer(data: bytes) -> DirectOffer:
    """Raises InvalidMessage (DecodeError) if ``data`` is not an offer."""
    value = decode(data)
    if not isinstance(value, dict) or value.keys() != {"nonce", "port"}:
        raise InvalidMessage(Reason.MALFORMED, "a direct offer is {nonce, port}")
    port = value["port"]
    if type(port) is not int or not 0 < port < 65536:
        raise InvalidMessage(Reason.MALFORMED, f"direct offer port {port!r} is not a port")
    return DirectOffer(nonce=_checked_nonce(value["nonce"]), port=port)


def _checked_nonce(nonce: Value) -> bytes:
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_SIZE:
        raise InvalidMessage(Reason.MALFORMED, f"a direct nonce is {NONCE_SIZE} bytes")
    return nonce


def derive_keys(
    requester_nonce: bytes, server_nonce: bytes, requester: str, server: str, *, we_request: bool
) -> DirectKeys:
    """Both directions' keys, from the side of the requester (``we_request``) or server."""
    prk = hmac.digest(_SALT, requester_nonce + server_nonce, hashlib.sha256)
    peers = requester.encode() + server.encode()

    def expand(direction: bytes) -> bytes:  # one HKDF-Expand block: 32 bytes
        return hmac.digest(prk, direction + peers + b"\x01", hashlib.sha256)

    c2s, s2c = expand(b"c2s"), expand(b"s2c")
    return DirectKeys(send=c2s, receive=s2c) if we_request else DirectKeys(send=s2c, receive=c2s)


def _nonce(counter: int) -> bytes:
    if counter >= 1 << 64:
        raise InvalidMessage(Reason.TOO_LARGE, "a direct channel ran out of record numbers")
    return counter.to_bytes(12, "big")


class Sealer:
    """Seals one direction's records in order, into one reused buffer."""

    __slots__ = ("_aead", "_buffer", "_counter", "_key")

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._aead = AESGCM(key)
        self._counter = 0
        self._buffer = bytearray()

    def seal(self, *parts: bytes | memoryview) -> memoryview:
        """One record whose plaintext is ``parts`` joined (a frame's header and its body,
        say, sealed without joining them first). The whole record, length prefix
        included, is valid until the next call (the buffer is reused: no allocation and
        no copy per 4 MiB chunk beyond the cipher's).

        Raises ValueError on a plaintext of the wrong size.
        """
        plain = sum(len(part) for part in parts)
        if not 0 < plain <= MAX_RECORD:
            raise ValueError(f"a record holds 1 to {MAX_RECORD} bytes, not {plain}")
        size = plain + TAG_SIZE
        if len(self._buffer) < RECORD_HEADER + size:
            self._buffer = bytearray(RECORD_HEADER + size)  # a new one: old views stay valid
        record = memoryview(self._buffer)[: RECORD_HEADER + size]
        _LENGTH.pack_into(record, 0, size)
        nonce = _nonce(self._counter)
        if len(parts) == 1:
            self._aead.encrypt_into(nonce, parts[0], None, record[RECORD_HEADER:])
        else:  # the same AES-256-GCM, fed piece by piece
            encryptor = Cipher(algorithms.AES(self._key), modes.GCM(nonce)).encryptor()
            at = RECORD_HEADER
            for part in parts:  # room to spare: the tag's 16 bytes follow the last part
                at += encryptor.update_into(part, record[at:])
            encryptor.finalize()
            record[at:] = encryptor.tag
        self._counter += 1
        return record


class Opener:
    """Opens one direction's records in order."""

    __slots__ = ("_aead", "_counter")

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self._counter = 0

    @staticmethod
    def record_size(header: bytes | bytearray | memoryview, *, limit: int = MAX_RECORD) -> int:
        """The ciphertext length a record header announces, for a plaintext of at most
        ``limit`` bytes. Raises InvalidMessage(TOO_LARGE)."""
        size: int = _LENGTH.unpack(header)[0]
        if not TAG_SIZE < size <= min(limit, MAX_RECORD) + TAG_SIZE:
            raise InvalidMessage(Reason.TOO_LARGE, f"a direct record of {size} bytes")
        return size

    def open(self, ciphertext: bytes | bytearray | memoryview) -> bytes:
        """The plaintext of the next record. Raises InvalidMessage(BAD_SEAL)."""
        out = bytearray(max(0, len(ciphertext) - TAG_SIZE))
        return bytes(self.open_into(ciphertext, out))

    def open_into(
        self, ciphertext: bytes | bytearray | memoryview, out: bytearray | memoryview
    ) -> memoryview:
        """The plaintext of the next record, written at the start of ``out`` (reused by
        the caller: no allocation per record). Raises InvalidMessage(BAD_SEAL), ValueError
        if ``out`` is too small."""
        if len(ciphertext) < TAG_SIZE:
            raise InvalidMessage(Reason.BAD_SEAL, "a direct record shorter than its tag")
        view = memoryview(out)[: len(ciphertext) - TAG_SIZE]
        if len(view) != len(ciphertext) - TAG_SIZE:
            raise ValueError(f"{len(out)} bytes cannot hold a {len(ciphertext)}-byte record")
        try:
            self._aead.decrypt_into(_nonce(self._counter), ciphertext, None, view)
        except InvalidTag as exc:
            raise InvalidMessage(Reason.BAD_SEAL, "a direct record did not open") from exc
        self._counter += 1
        return view
