"""One blob being received in chunks (spec/content.md, rules 7-9): ``partial/<key>`` and
its ``.have`` list of recorded chunk indices, as :class:`~node.storage.store.BlobStore`
lays them out.

Rules:
- Chunks may be stored from several threads at once: each is verified against the
  manifest, written at its offset and fsynced outside any lock. Only recording its index
  in ``.have`` (after the bytes are durable, so a crash re-fetches it) is serialized.
- The whole blob is hashed in order while the chunks arrive: whichever thread has just
  stored a chunk advances the hash over every contiguous chunk recorded so far (one
  thread at a time, the others go on storing), so little is left to hash at the end.
  :meth:`PartialBlob.seal` hashes what remains and gives the whole digest; the store
  then commits the blob, or discards it when the digest is not the manifest's (rule 8).

Errors: ``InvalidMessage`` (a chunk that does not match the manifest: the sender
misbehaved; nothing is recorded), ``OSError`` (the disk).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from pathlib import Path
from typing import IO

from node.net.buffers import aligned_buffer
from protocol.content import ChunkManifest

__all__ = ["PartialBlob"]


class PartialBlob:
    """The receiving end of one blob's chunks; :meth:`close` it (or use ``with``)."""

    def __init__(
        self,
        manifest: ChunkManifest,
        data_path: Path,
        have_path: Path,
        have: set[int],
    ) -> None:
        self.manifest = manifest
        self.data_path, self._have_path = data_path, have_path
        self._have = have
        self._fd = os.open(data_path, os.O_RDWR | os.O_CREAT, 0o600)
        self._have_file: IO[str] = open(have_path, "a")  # noqa: SIM115 (closed in close())
        self._record = threading.Lock()  # the .have file and the set
        self._hashing = threading.Lock()  # the whole-blob hash, advanced in order
        self._hash = hashlib.sha256()
        self._hashed = 0  # chunks 0 .. _hashed-1 are in the hash
        self._buffer: memoryview | None = None  # chunks read back to be hashed

    def __enter__(self) -> PartialBlob:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def complete(self) -> bool:
        return len(self._have) == len(self.manifest.chunks)

    def missing(self) -> list[int]:
        return [i for i in range(len(self.manifest.chunks)) if i not in self._have]

    def put(self, index: int, data: bytes | memoryview) -> None:
        """Verify chunk ``index``, make it durable, record it, and advance the whole hash.

        Raises InvalidMessage (the chunk does not match; nothing recorded), OSError.
        """
        self.manifest.verify_chunk(index, data)
        if index in self._have:
            return
        os.pwrite(self._fd, data, self.manifest.span(index)[0])
        os.fsync(self._fd)
        with self._record:
            self._have_file.write(f"{index}\n")
            self._have_file.flush()
            self._have.add(index)
        self._advance_hash(index, data)

    def _advance_hash(self, index: int, data: bytes | memoryview) -> None:
        """Hash every contiguous recorded chunk not hashed yet (``data`` is chunk
        ``index``'s, in hand). A thread that finds another hashing leaves it to that one,
        which looks again before it stops."""
        while self._hashed in self._have:
            if not self._hashing.acquire(blocking=False):
                return
            try:
                while (next_ := self._hashed) in self._have:
                    self._hash.update(data if next_ == index else self._read_back(next_))
                    self._hashed = next_ + 1
            finally:
                self._hashing.release()

    def _read_back(self, index: int) -> memoryview:
        """Chunk ``index`` as written, read into the hasher's buffer (under ``_hashing``)."""
        offset, length = self.manifest.span(index)
        if self._buffer is None:
            self._buffer = aligned_buffer(self.manifest.chunk_size)
        view = self._buffer[:length]
        if os.preadv(self._fd, [view], offset) != length:
            raise OSError(f"partial file of {self.manifest.blob} is shorter than its chunks")
        return view

    def seal(self) -> str:
        """The whole blob's digest, once every chunk is recorded: the partial file is cut
        to size and closed, its ``.have`` list removed (the caller commits or discards it).

        Raises ValueError if chunks are missing, OSError.
        """
        if not self.complete:
            raise ValueError(f"{len(self.missing())} chunks of {self.manifest.blob} missing")
        with self._hashing:
            for index in range(self._hashed, len(self.manifest.chunks)):
                self._hash.update(self._read_back(index))
            self._hashed = len(self.manifest.chunks)
        os.ftruncate(self._fd, self.manifest.size)
        self.close()
        self._have_path.unlink(missing_ok=True)
        return "sha256:" + self._hash.hexdigest()

    def close(self) -> None:
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            self._have_file.close()
        os.close(self._fd)
        self._fd = -1
