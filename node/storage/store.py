"""The node's content-addressed blob store (spec/content.md).

Rules:
- A blob lives at ``blobs/sha256/<hex>``, where ``<hex>`` is the sha256 of its content.
  Files there are complete and read-only (mode 0444): every write goes to ``tmp/`` first,
  is hashed while written, fsynced and renamed into place, so a crash leaves either the
  whole blob or nothing.
- Reads through this API are verified: a blob whose content no longer matches its name is
  removed and :class:`CorruptBlob` raised. ``path()`` hands out the file itself (for
  read-only bind mounts); callers that need the guarantee call ``verify()`` first.
- Garbage collection is by reference: ``refs/<name>`` files list digests (one per line) that
  must be kept; everything else older than a grace period goes.
- A cache with a byte budget (``budget_bytes``): when the blobs exceed it, the least
  recently used blobs that nothing needs are deleted until they fit again. Needed are the
  blobs some ref names, except ``image/*`` refs (an image is a cache entry, pulled or
  fetched again when wanted; pinning an image keeps it from ``gc``, not from eviction) and
  whatever the caller names as live (a running job's image and inputs). An image losing a
  blob loses its ref. Use is recorded as the file's access time when a blob is read, mounted
  or found by a fetch; :meth:`lookup` counts a fetch's hits and misses in ``stats.json``
  (``cx store`` reads it from another process). Counts add up in memory until
  :meth:`save_counts` (a node calls it every second) or until the store is dropped or the
  process exits: the write (a rename) costs half a millisecond, and a lookup sits on every
  job's path.
- Large blobs move between nodes in 4 MiB chunks (protocol.content). A transfer in progress
  lives in ``partial/<hex>`` with a ``.have`` file of received chunk indices, so it resumes
  after a restart; it becomes a blob only when the whole digest checks out. Chunks are
  stored concurrently and the whole digest computed as they arrive (node/storage/partial.py).

Errors::

    StoreError
    +-- BlobNotFound      no blob with that digest
    +-- CorruptBlob       content does not match its digest (removed)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import time
import weakref
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

from node.storage.partial import PartialBlob
from protocol.content import CHUNK_SIZE, ChunkManifest, decode_manifest
from protocol.errors import InvalidMessage
from protocol.messages import check_digest

__all__ = ["BlobNotFound", "BlobStore", "BlobWriter", "CorruptBlob", "StoreError", "StoreStats"]

log = logging.getLogger(__name__)

_COPY = 1024 * 1024
_Chunk = TypeVar("_Chunk", bytes, memoryview)
_REF_NAME = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*\Z")


class StoreError(Exception):
    """Base of the store's errors."""


class BlobNotFound(StoreError):
    def __init__(self, digest: str) -> None:
        super().__init__(f"blob {digest} is not in the store; import or fetch it first")
        self.digest = digest


class CorruptBlob(StoreError):
    def __init__(self, digest: str, actual: str) -> None:
        super().__init__(f"blob {digest} holds content {actual}; removed, fetch it again")
        self.digest = digest
        self.actual = actual


def _hex(digest: str) -> str:
    check_digest(digest, "blob")
    return digest[len("sha256:") :]


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreStats:
    """What ``cx store`` shows."""

    blobs: int
    bytes: int
    budget_bytes: int | None
    pinned_bytes: int  # named by a ref other than an image's: never evicted
    images: int
    hits: int
    misses: int
    evicted_blobs: int
    evicted_bytes: int


class BlobStore:
    """A directory of sha256-named blobs. Safe for concurrent writers on one filesystem."""

    def __init__(self, root: Path | str, *, budget_bytes: int | None = None) -> None:
        self.root = Path(root)
        self.budget_bytes = budget_bytes
        self._live: Counter[str] = Counter()  # blobs running jobs use; never evicted
        self._usage: int | None = None  # bytes, counted at the first write
        self._blobs = self.root / "blobs" / "sha256"
        self._tmp = self.root / "tmp"
        self._refs = self.root / "refs"
        self._partial = self.root / "partial"
        self._manifests = self.root / "chunks"
        for d in (self._blobs, self._tmp, self._refs, self._partial, self._manifests):
            d.mkdir(parents=True, exist_ok=True)
        # Containers run as a mapped uid and read inputs through bind mounts.
        for d in (self.root, self.root / "blobs", self._blobs):
            d.chmod(0o755)
        self._verified: dict[str, tuple[int, int, int]] = {}
        self._unsaved: Counter[str] = Counter()  # counts stats.json does not hold yet
        weakref.finalize(self, _save_counts, self.root, self._tmp, self._unsaved)
        # Chunk bytes served to and fetched from peers since start (node/storage/transfer.py
        # counts them, in the event loop); /metrics shows them.
        self.traffic = {"sent": 0, "received": 0}
        # Direct channels (spec/content.md) by (role, outcome): ("server", "opened" or
        # "refused"), ("requester", "opened" or "fell-back" to libp2p streams); counted by
        # node/storage/transfer.py and transfer_direct.py, shown by /metrics.
        self.direct_channels: Counter[tuple[str, str]] = Counter()

    # -- writing ---------------------------------------------------------------------------

    def put_bytes(self, data: bytes) -> str:
        return self.put_stream([data])

    def put_file(self, path: Path | str, expect: str | None = None) -> str:
        with open(path, "rb") as f:
            return self.put_reader(f, expect)

    def put_reader(self, reader: IO[bytes], expect: str | None = None) -> str:
        return self.put_stream(iter(lambda: reader.read(_COPY), b""), expect)

    def put_stream(self, parts: Iterable[bytes], expect: str | None = None) -> str:
        """Store the concatenation of ``parts``; return its digest.

        Raises:
            CorruptBlob: ``expect`` was given and the content hashes to something else.
        """
        with self.writer(expect) as w:
            for part in parts:
                w.write(part)
            return w.commit()

    @contextlib.contextmanager
    def writer(self, expect: str | None = None) -> Iterator[BlobWriter]:
        """A blob written piece by piece (e.g. as it arrives over HTTP); ``commit()`` it
        inside the block. Leaving the block without a commit discards what was written."""
        fd, tmp = _mkstemp(self._tmp)
        try:
            with os.fdopen(fd, "wb") as f:
                yield BlobWriter(self, f, tmp, expect)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _commit(self, tmp: str, digest: str) -> None:
        os.chmod(tmp, 0o444)
        size = os.stat(tmp).st_size
        # rename is atomic; if another writer got there first the content is identical.
        os.rename(tmp, self._blobs / _hex(digest))
        if self.budget_bytes is not None:
            self._usage = (self._usage if self._usage is not None else self._scan()) + size
            if self._usage > self.budget_bytes:
                self.evict(keep={digest})

    # -- reading ---------------------------------------------------------------------------

    def has(self, digest: str) -> bool:
        return (self._blobs / _hex(digest)).is_file()

    def path(self, digest: str) -> Path:
        """The blob's file (read-only), marked as used. Raises BlobNotFound."""
        p = self._blobs / _hex(digest)
        try:
            os.utime(p, ns=(time.time_ns(), p.stat().st_mtime_ns))  # the LRU clock
        except FileNotFoundError:
            raise BlobNotFound(digest) from None
        except PermissionError:
            pass  # another user's store, read only: the use goes unrecorded
        return p

    def lookup(self, digest: str) -> bool:
        """Is the blob here, for a fetch about to get it? Counts a cache hit or miss."""
        found = self.has(digest)
        if found:
            self.path(digest)  # a hit is a use
        self._count("hits" if found else "misses")
        return found

    def size(self, digest: str) -> int:
        try:
            return (self._blobs / _hex(digest)).stat().st_size
        except FileNotFoundError:
            raise BlobNotFound(digest) from None

    def read_bytes(self, digest: str) -> bytes:
        """The whole blob, verified. Raises BlobNotFound, CorruptBlob."""
        data = self.path(digest).read_bytes()
        actual = "sha256:" + hashlib.sha256(data).hexdigest()
        if actual != digest:
            self._quarantine(digest, actual)
        return data

    def verify(self, digest: str) -> None:
        """Hash the blob unless it was verified unchanged since; raises like read_bytes."""
        p = self.path(digest)
        st = p.stat()
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._verified.get(digest) == key:
            return
        h = hashlib.sha256()
        with open(p, "rb") as f:
            while block := f.read(_COPY):
                h.update(block)
        actual = "sha256:" + h.hexdigest()
        if actual != digest:
            self._quarantine(digest, actual)
        self._verified[digest] = key

    def _quarantine(self, digest: str, actual: str) -> None:
        log.error("blob %s is corrupt (content hashes to %s); removing it", digest, actual)
        self._verified.pop(digest, None)
        with contextlib.suppress(FileNotFoundError):
            (self._blobs / _hex(digest)).unlink()
        raise CorruptBlob(digest, actual)

    def digests(self) -> Iterator[str]:
        for p in self._blobs.iterdir():
            yield "sha256:" + p.name

    def recently_used(self, *, min_bytes: int = 0) -> list[str]:
        """Blobs of at least ``min_bytes``, most recently used first (the LRU clock)."""
        found = [(-st.st_atime_ns, name) for name, st in self._stats() if st.st_size >= min_bytes]
        return ["sha256:" + name for _, name in sorted(found)]

    def delete(self, digest: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self._blobs / _hex(digest)).unlink()
        self._verified.pop(digest, None)

    # -- the cache budget --------------------------------------------------------------------

    def _stats(self) -> Iterator[tuple[str, os.stat_result]]:
        """Each blob file's name and stat (one deleted meanwhile is left out): the size
        and the LRU clock of the budget and of an offer's held blobs."""
        for p in self._blobs.iterdir():
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            yield p.name, st

    def _scan(self) -> int:
        return sum(st.st_size for _, st in self._stats())

    def needed(self) -> set[str]:
        """Blobs eviction must keep: named by a ref other than an image's, or live."""
        refs = self.refs()
        pinned = {d for name, ds in refs.items() if not name.startswith("image/") for d in ds}
        return pinned | {d for d, n in self._live.items() if n > 0}

    @contextlib.contextmanager
    def holding(self, digests: Iterable[str]) -> Iterator[None]:
        """Keep ``digests`` from eviction inside the block (a running job's image and
        inputs); holds nest and overlap."""
        held = list(set(digests))
        self._live.update(held)
        try:
            yield
        finally:
            self._live.subtract(held)
            self._live += Counter()  # drop the zeros

    def evict(self, *, keep: Iterable[str] = ()) -> list[str]:
        """Delete least recently used blobs nothing needs until the store fits its budget;
        return them. Images that lose a blob lose their ref."""
        if self.budget_bytes is None:
            return []
        spare = self.needed() | set(keep)
        blobs = []
        total = 0
        for name, st in self._stats():
            total += st.st_size
            if "sha256:" + name not in spare:
                blobs.append((st.st_atime, name, st.st_size))
        removed, freed = [], 0
        for _, name, size in sorted(blobs):
            if total - freed <= self.budget_bytes:
                break
            self.delete("sha256:" + name)
            (self._manifests / name).unlink(missing_ok=True)
            removed.append("sha256:" + name)
            freed += size
        self._usage = total - freed
        if removed:
            self._drop_broken_images(set(removed))
            self._count("evicted_blobs", len(removed))
            self._count("evicted_bytes", freed)
            log.info(
                "evicted %d blobs (%d bytes) to fit %d bytes",
                len(removed),
                freed,
                self.budget_bytes,
            )
        return removed

    def _drop_broken_images(self, removed: set[str]) -> None:
        for name, digests in self.refs().items():
            if name.startswith("image/") and removed & set(digests):
                self.unpin(name)
                (self.root / "images" / f"{name.removeprefix('image/')}.json").unlink(
                    missing_ok=True
                )

    def _count(self, name: str, n: int = 1) -> None:
        self._unsaved[name] += n

    def save_counts(self) -> None:
        """Add the counts kept in memory to ``stats.json``; nothing to write costs nothing."""
        _save_counts(self.root, self._tmp, self._unsaved)

    def _counts(self) -> dict[str, int]:
        counts = Counter(_saved_counts(self.root))
        counts.update(self._unsaved)
        return counts

    def stats(self) -> StoreStats:
        sizes = {}
        for p in self._blobs.iterdir():
            with contextlib.suppress(FileNotFoundError):
                sizes["sha256:" + p.name] = p.stat().st_size
        needed = self.needed()
        counts = self._counts()
        return StoreStats(
            blobs=len(sizes),
            bytes=sum(sizes.values()),
            budget_bytes=self.budget_bytes,
            pinned_bytes=sum(n for d, n in sizes.items() if d in needed),
            images=sum(1 for name in self.refs() if name.startswith("image/")),
            hits=counts.get("hits", 0),
            misses=counts.get("misses", 0),
            evicted_blobs=counts.get("evicted_blobs", 0),
            evicted_bytes=counts.get("evicted_bytes", 0),
        )

    # -- references and garbage collection -------------------------------------------------

    def pin(self, name: str, digests: Iterable[str]) -> None:
        """Keep ``digests`` alive under ``name`` (e.g. ``image/<hex>``, ``job/<id>``)."""
        if not _REF_NAME.match(name) or ".." in name:
            raise ValueError(f"ref name {name!r} must be path-safe")
        lines = sorted(set(digests))
        for d in lines:
            check_digest(d, "pinned blob")
        target = self._refs / name
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _mkstemp(self._tmp)
        with os.fdopen(fd, "w") as f:
            f.write("".join(line + "\n" for line in lines))
        os.rename(tmp, target)

    def unpin(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self._refs / name).unlink()

    def refs(self) -> dict[str, list[str]]:
        return {
            str(p.relative_to(self._refs)): p.read_text().split()
            for p in sorted(self._refs.rglob("*"))
            if p.is_file()
        }

    def gc(self, *, grace_s: float = 3600.0) -> list[str]:
        """Delete blobs no ref names and older than ``grace_s`` (so that an import that has
        written blobs but not yet pinned them is safe). Returns the deleted digests."""
        keep = {d for ds in self.refs().values() for d in ds}
        cutoff = time.time() - grace_s
        removed = []
        for p in list(self._blobs.iterdir()):
            digest = "sha256:" + p.name
            if digest in keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                if p.stat().st_mtime <= cutoff:
                    p.unlink()
                    (self._manifests / p.name).unlink(missing_ok=True)
                    removed.append(digest)
        for p in list(self._tmp.iterdir()):
            with contextlib.suppress(FileNotFoundError):
                if p.stat().st_mtime <= cutoff:
                    p.unlink()
        log.info("gc removed %d blobs, kept %d referenced", len(removed), len(keep))
        return removed

    # -- chunked transfer (sending side) ---------------------------------------------------

    def manifest(self, digest: str) -> ChunkManifest:
        """The blob's chunk manifest, computed once and cached."""
        cached = self._manifests / _hex(digest)
        if cached.is_file():
            with contextlib.suppress(InvalidMessage, ValueError):
                m = decode_manifest(cached.read_bytes())
                if m.blob == digest:
                    return m
        chunks = []
        size = 0
        whole = hashlib.sha256()
        with open(self.path(digest), "rb") as f:
            while block := f.read(CHUNK_SIZE):
                size += len(block)
                whole.update(block)
                chunks.append(hashlib.sha256(block).digest())
        actual = "sha256:" + whole.hexdigest()
        if actual != digest:
            self._quarantine(digest, actual)
        m = ChunkManifest(blob=digest, size=size, chunks=tuple(chunks))
        fd, tmp = _mkstemp(self._tmp)
        with os.fdopen(fd, "wb") as out:
            out.write(m.encode())
        os.rename(tmp, cached)
        return m

    def read_chunk(self, manifest: ChunkManifest, index: int) -> bytes:
        """Chunk ``index`` of a stored blob, checked against the manifest."""
        offset, length = manifest.span(index)
        with open(self.path(manifest.blob), "rb") as f:
            f.seek(offset)
            return self._checked(manifest, index, f.read(length))

    def read_chunk_into(self, manifest: ChunkManifest, index: int, out: memoryview) -> memoryview:
        """As :meth:`read_chunk`, read into ``out`` (reused by the caller: no allocation
        per chunk; page-aligned, node/net/buffers.py); returns the chunk's view of it."""
        offset, length = manifest.span(index)
        fd = os.open(self.path(manifest.blob), os.O_RDONLY)
        try:
            view = out[: os.preadv(fd, [out[:length]], offset)]
        finally:
            os.close(fd)
        return self._checked(manifest, index, view)

    def _checked(self, manifest: ChunkManifest, index: int, data: _Chunk) -> _Chunk:
        """``data``, read as chunk ``index`` of a stored blob, if it matches the manifest;
        else the blob is removed (CorruptBlob): the disk does not hold what it should."""
        try:
            manifest.verify_chunk(index, data)
        except InvalidMessage:
            self._quarantine(manifest.blob, "a chunk that does not match its manifest")
        return data

    # -- chunked transfer (receiving side) -------------------------------------------------

    def missing_chunks(self, manifest: ChunkManifest) -> list[int]:
        """Indices still to fetch; all of them for a new transfer, none if the blob is here."""
        if self.has(manifest.blob):
            return []
        have = self._have(manifest)
        return [i for i in range(len(manifest.chunks)) if i not in have]

    def open_partial(self, manifest: ChunkManifest) -> PartialBlob:
        """The partial transfer of ``manifest``'s blob, resumed where it stopped; chunks
        may be put into it from several threads at once (node/storage/partial.py)."""
        data_path, have_path = self._partial_paths(manifest)
        return PartialBlob(manifest, data_path, have_path, self._have(manifest))

    def finish_partial(self, partial: PartialBlob) -> str:
        """Commit a partial transfer whose chunks are all recorded; return the digest.

        Raises:
            CorruptBlob: every chunk matched but the whole digest did not: the manifest was
                a lie; the partial transfer is discarded.
        """
        actual = partial.seal()
        if actual != partial.manifest.blob:
            partial.data_path.unlink(missing_ok=True)
            raise CorruptBlob(partial.manifest.blob, actual)
        self._commit(str(partial.data_path), actual)
        return actual

    def put_chunk(self, manifest: ChunkManifest, index: int, data: bytes) -> str | None:
        """Verify and record one chunk. Returns the blob digest once the blob is complete.

        Raises:
            InvalidMessage: the chunk does not match the manifest (the sender misbehaved).
            CorruptBlob: as :meth:`finish_partial`.
        """
        if self.has(manifest.blob):
            manifest.verify_chunk(index, data)
            return manifest.blob
        with self.open_partial(manifest) as partial:
            partial.put(index, data)
            return self.finish_partial(partial) if partial.complete else None

    def _partial_paths(self, manifest: ChunkManifest) -> tuple[Path, Path]:
        # Keyed by the manifest digest, so two different claims about one blob never mix.
        key = manifest.digest()[len("sha256:") :]
        return self._partial / key, self._partial / (key + ".have")

    def _have(self, manifest: ChunkManifest) -> set[int]:
        _, have_path = self._partial_paths(manifest)
        try:
            text = have_path.read_text()
        except FileNotFoundError:
            return set()
        n = len(manifest.chunks)
        # A torn last line (crash mid-append) is ignored and that chunk fetched again.
        return {int(t) for t in text.split("\n")[:-1] if t.isdigit() and int(t) < n}


class BlobWriter:
    """The open temporary file of :meth:`BlobStore.writer`, hashed as it is written."""

    def __init__(self, store: BlobStore, file: IO[bytes], tmp: str, expect: str | None) -> None:
        self._store = store
        self._file = file
        self._tmp = tmp
        self._expect = expect
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self._hash.update(data)
        self._file.write(data)
        self.size += len(data)

    def commit(self) -> str:
        """Make the blob durable and visible under its digest; return the digest.

        Raises:
            CorruptBlob: the writer expected another digest (nothing is kept).
        """
        self._file.flush()
        os.fsync(self._file.fileno())
        digest = "sha256:" + self._hash.hexdigest()
        if self._expect is not None and self._expect != digest:
            raise CorruptBlob(self._expect, digest)
        self._store._commit(self._tmp, digest)
        return digest


def _saved_counts(root: Path) -> dict[str, int]:
    try:
        counts = json.loads((root / "stats.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}
    if not isinstance(counts, dict):
        return {}
    return {k: v for k, v in counts.items() if isinstance(v, int)}


def _save_counts(root: Path, tmp: Path, unsaved: Counter[str]) -> None:
    """Add ``unsaved`` to ``root/stats.json``, and empty it. Also a finalizer, so it does
    not hold the store."""
    if not unsaved:
        return
    counts = Counter(_saved_counts(root))
    counts.update(unsaved)
    unsaved.clear()
    try:
        fd, name = _mkstemp(tmp)
        with os.fdopen(fd, "w") as f:
            json.dump(counts, f)
        os.rename(name, root / "stats.json")
    except OSError as exc:  # a store removed under us, or another user's: counts are advisory
        log.debug("store counts not saved in %s: %s", root, exc)


def _mkstemp(directory: Path) -> tuple[int, str]:
    name = str(directory / f".{os.getpid()}-{os.urandom(8).hex()}")
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), name
