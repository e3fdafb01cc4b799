"""Chunk manifests: how a large blob is cut up so it can be moved and verified piecewise
(spec/content.md).

Rules:
- A blob is named by the sha256 of its whole content (``sha256:<hex>``, as in OCI and
  :class:`protocol.messages.DataRef`). Chunking never changes that name.
- A blob is cut into consecutive chunks of exactly ``CHUNK_SIZE`` bytes; the last one may be
  shorter; an empty blob has no chunks. Each chunk is named by its own raw sha256.
- A manifest is the canonical encoding of ``{"v": 1, "blob", "size", "chunk_size",
  "chunks"}``. A one-chunk manifest is self-checking: its only chunk digest must equal the
  blob digest. For longer blobs the whole digest is checked once every chunk has arrived,
  and a mismatch there means the sender lied about the manifest.
- Pure: no I/O. Callers hand in bytes and get verified values back or an exception.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from protocol.encoding import decode, encode
from protocol.errors import InvalidMessage, Reason
from protocol.messages import check_digest

__all__ = [
    "CHUNK_SIZE",
    "MAX_CHUNKS",
    "ChunkManifest",
    "chunk_count",
    "decode_manifest",
    "digest_of",
]

CHUNK_SIZE = 4 * 1024 * 1024
# Bounded by the canonical decoder's array limit; 4096 x 4 MiB = 16 GiB per blob.
MAX_CHUNKS = 4096
_VERSION = 1


def digest_of(data: bytes) -> str:
    """The ``sha256:<hex>`` name of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def chunk_count(size: int, chunk_size: int = CHUNK_SIZE) -> int:
    """How many chunks a blob of ``size`` bytes has (0 for an empty blob)."""
    return -(-size // chunk_size)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkManifest:
    blob: str
    size: int
    chunks: tuple[bytes, ...]
    chunk_size: int = CHUNK_SIZE

    def __post_init__(self) -> None:
        _check(self)

    def encode(self) -> bytes:
        return encode(
            {
                "v": _VERSION,
                "blob": self.blob,
                "size": self.size,
                "chunk_size": self.chunk_size,
                "chunks": list(self.chunks),
            }
        )

    def digest(self) -> str:
        return digest_of(self.encode())

    def span(self, index: int) -> tuple[int, int]:
        """(offset, length) of chunk ``index`` within the blob.

        Raises:
            IndexError: no such chunk.
        """
        if not 0 <= index < len(self.chunks):
            raise IndexError(f"chunk {index} of {len(self.chunks)}")
        offset = index * self.chunk_size
        return offset, min(self.chunk_size, self.size - offset)

    def verify_chunk(self, index: int, data: bytes | memoryview) -> None:
        """Raise :class:`InvalidMessage` unless ``data`` is chunk ``index``."""
        _, length = self.span(index)
        if len(data) != length:
            raise InvalidMessage(
                Reason.BAD_FIELD, f"chunk {index} is {len(data)} bytes, expected {length}"
            )
        if hashlib.sha256(data).digest() != self.chunks[index]:
            raise InvalidMessage(Reason.BAD_FIELD, f"chunk {index} does not match its digest")

    @classmethod
    def of(cls, data: bytes) -> ChunkManifest:
        """The manifest of an in-memory blob (tests, small blobs)."""
        chunks = tuple(
            hashlib.sha256(data[i : i + CHUNK_SIZE]).digest()
            for i in range(0, len(data), CHUNK_SIZE)
        )
        return cls(blob=digest_of(data), size=len(data), chunks=chunks)


def _check(m: ChunkManifest) -> None:
    try:
        check_digest(m.blob, "blob")
    except ValueError as exc:
        raise InvalidMessage(Reason.BAD_FIELD, str(exc)) from exc
    if m.chunk_size != CHUNK_SIZE:
        raise InvalidMessage(Reason.BAD_FIELD, f"chunk_size must be {CHUNK_SIZE} in v1")
    if m.size < 0 or chunk_count(m.size, m.chunk_size) > MAX_CHUNKS:
        raise InvalidMessage(Reason.BAD_FIELD, f"size {m.size} outside 0..{MAX_CHUNKS} chunks")
    if len(m.chunks) != chunk_count(m.size, m.chunk_size):
        raise InvalidMessage(
            Reason.BAD_FIELD, f"{len(m.chunks)} chunk digests for a {m.size}-byte blob"
        )
    if any(not isinstance(c, bytes) or len(c) != 32 for c in m.chunks):
        raise InvalidMessage(Reason.BAD_FIELD, "a chunk digest is not 32 raw bytes")
    if m.size == 0 and m.blob != digest_of(b""):
        raise InvalidMessage(Reason.BAD_FIELD, "an empty blob has the digest of no bytes")
    if len(m.chunks) == 1 and "sha256:" + m.chunks[0].hex() != m.blob:
        raise InvalidMessage(Reason.BAD_FIELD, "a one-chunk blob's chunk digest is its digest")


def decode_manifest(data: bytes) -> ChunkManifest:
    """Decode and check a manifest from the bytes received.

    Raises:
        DecodeError: not one canonical encoding.
        InvalidMessage: decodes, but breaks a rule above (reason ``bad-field``,
            ``missing-field`` or ``unknown-field``).
    """
    value = decode(data)
    if not isinstance(value, dict):
        raise InvalidMessage(Reason.BAD_FIELD, "a manifest is a map")
    expected = {"v", "blob", "size", "chunk_size", "chunks"}
    if missing := expected - value.keys():
        raise InvalidMessage(Reason.MISSING_FIELD, f"missing {sorted(missing)}")
    if unknown := value.keys() - expected:
        raise InvalidMessage(Reason.UNKNOWN_FIELD, f"unknown {sorted(unknown)}")
    if value["v"] != _VERSION:
        raise InvalidMessage(Reason.BAD_FIELD, f"version {value['v']!r} is not {_VERSION}")
    blob, size, chunk_size, chunks = (
        value["blob"],
        value["size"],
        value["chunk_size"],
        value["chunks"],
    )
    if not isinstance(blob, str) or not isinstance(chunks, list):
        raise InvalidMessage(Reason.BAD_FIELD, "blob must be a str and chunks a list")
    if type(size) is not int or type(chunk_size) is not int:
        raise InvalidMessage(Reason.BAD_FIELD, "size and chunk_size must be integers")
    return ChunkManifest(
        blob=blob,
        size=size,
        chunk_size=chunk_size,
        chunks=tuple(c if isinstance(c, bytes) else b"" for c in chunks),
    )
