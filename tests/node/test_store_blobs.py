"""The content-addressed store: atomic verified blobs, GC by reference, chunked transfer."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from node.storage.store import BlobNotFound, BlobStore, CorruptBlob
from protocol.content import CHUNK_SIZE, ChunkManifest, digest_of
from protocol.errors import InvalidMessage


@pytest.fixture
def store(tmp_path):
    return BlobStore(tmp_path / "store")


def test_put_and_read_back(store):
    d = store.put_bytes(b"hello")
    assert d == "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    assert store.read_bytes(d) == b"hello"
    assert store.has(d)
    assert store.size(d) == 5
    assert store.path(d).stat().st_mode & 0o777 == 0o444
    assert store.put_bytes(b"hello") == d  # idempotent
    assert list(store.digests()) == [d]
    assert not list((store.root / "tmp").iterdir())  # no temp files left behind


def test_expected_digest_mismatch_stores_nothing(store):
    wrong = "sha256:" + "0" * 64
    with pytest.raises(CorruptBlob):
        store.put_stream([b"data"], expect=wrong)
    assert list(store.digests()) == []
    assert not list((store.root / "tmp").iterdir())


def test_corrupt_blob_is_detected_and_removed(store):
    d = store.put_bytes(b"precious")
    p = store.path(d)
    p.chmod(0o644)
    p.write_bytes(b"tampered")
    with pytest.raises(CorruptBlob):
        store.read_bytes(d)
    assert not store.has(d)
    with pytest.raises(BlobNotFound):
        store.read_bytes(d)


def test_verify_notices_change_after_a_cached_verification(store):
    d = store.put_bytes(b"abc")
    store.verify(d)
    p = store.path(d)
    p.chmod(0o644)
    with open(p, "r+b") as f:
        f.write(b"x")
    os.utime(p, ns=(1, 1))
    with pytest.raises(CorruptBlob):
        store.verify(d)


def test_gc_keeps_referenced_blobs_only(store):
    keep = store.put_bytes(b"keep")
    drop = store.put_bytes(b"drop")
    store.pin("image/x", [keep])
    assert store.gc(grace_s=3600) == []  # too young to collect
    assert store.gc(grace_s=-1) == [drop]
    assert store.has(keep)
    assert not store.has(drop)
    store.unpin("image/x")
    assert store.gc(grace_s=-1) == [keep]


def test_pin_refuses_unsafe_names(store):
    with pytest.raises(ValueError, match="path-safe"):
        store.pin("../escape", [])
    with pytest.raises(ValueError, match="digest"):
        store.pin("job/1", ["md5:abc"])


def _blob(n: int) -> bytes:
    return bytes((i * 7) % 256 for i in range(n))


def test_chunked_transfer_resumes_after_restart(tmp_path, store):
    data = _blob(2 * CHUNK_SIZE + 123)
    d = store.put_bytes(data)
    m = store.manifest(d)
    assert m == ChunkManifest.of(data)
    assert store.manifest(d) == m  # cached
    receiver = BlobStore(tmp_path / "other")
    assert receiver.missing_chunks(m) == [0, 1, 2]
    assert receiver.put_chunk(m, 2, store.read_chunk(m, 2)) is None
    # a restart: a fresh store object over the same directory remembers chunk 2
    receiver = BlobStore(tmp_path / "other")
    assert receiver.missing_chunks(m) == [0, 1]
    assert receiver.put_chunk(m, 0, store.read_chunk(m, 0)) is None
    assert receiver.put_chunk(m, 1, store.read_chunk(m, 1)) == d
    assert receiver.read_bytes(d) == data
    assert receiver.missing_chunks(m) == []
    assert not list((receiver.root / "partial").iterdir())


def _put_all_at_once(partial, data: bytes, order: list[int]) -> None:
    """Every chunk of ``data`` put from its own thread, released together, in ``order``."""
    m = partial.manifest
    start = threading.Barrier(len(order))

    def put(i: int) -> None:
        offset, length = m.span(i)
        start.wait()
        partial.put(i, data[offset : offset + length])

    with ThreadPoolExecutor(len(order)) as pool:
        for done in [pool.submit(put, i) for i in order]:
            done.result()


def test_chunks_stored_from_many_threads_in_any_order_make_the_blob(tmp_path):
    data = _blob(5 * CHUNK_SIZE + 77)
    m = ChunkManifest.of(data)
    receiver = BlobStore(tmp_path / "other")
    with receiver.open_partial(m) as partial:
        _put_all_at_once(partial, data, [4, 1, 5, 0, 3])
        assert partial.missing() == [2]
        assert not partial.complete
    # Resumed by a new store object, as after a restart: only chunk 2 is missing.
    receiver = BlobStore(tmp_path / "other")
    assert receiver.missing_chunks(m) == [2]
    with receiver.open_partial(m) as partial:
        offset, length = m.span(2)
        partial.put(2, data[offset : offset + length])
        assert partial.complete
        assert receiver.finish_partial(partial) == m.blob
    assert receiver.read_bytes(m.blob) == data
    assert not list((receiver.root / "partial").iterdir())


def test_a_false_manifest_is_caught_whatever_order_its_chunks_come_in(tmp_path):
    data = _blob(3 * CHUNK_SIZE + 1)
    honest = ChunkManifest.of(data)
    lie = ChunkManifest(blob=digest_of(b"other"), size=honest.size, chunks=honest.chunks)
    receiver = BlobStore(tmp_path / "other")
    with receiver.open_partial(lie) as partial:
        _put_all_at_once(partial, data, [3, 2, 1, 0])
        with pytest.raises(CorruptBlob):
            receiver.finish_partial(partial)
    assert not receiver.has(lie.blob)
    assert not list((receiver.root / "partial").iterdir())  # the chunks are discarded
    assert receiver.missing_chunks(lie) == [0, 1, 2, 3]


def test_finishing_with_chunks_missing_is_refused(tmp_path):
    data = _blob(CHUNK_SIZE + 1)
    m = ChunkManifest.of(data)
    with BlobStore(tmp_path / "other").open_partial(m) as partial:
        partial.put(1, data[CHUNK_SIZE:])
        with pytest.raises(ValueError, match="1 chunks"):
            partial.seal()


def test_read_chunk_into_reads_and_verifies_into_the_callers_buffer(tmp_path, store):
    data = _blob(CHUNK_SIZE + 9)
    d = store.put_bytes(data)
    m = store.manifest(d)
    buffer = memoryview(bytearray(CHUNK_SIZE))
    assert store.read_chunk_into(m, 1, buffer) == data[CHUNK_SIZE:]
    assert store.read_chunk_into(m, 0, buffer) == data[:CHUNK_SIZE]
    os.chmod(store.path(d), 0o644)
    with open(store.path(d), "r+b") as f:  # bit rot in the second chunk
        f.seek(CHUNK_SIZE + 3)
        f.write(b"X")
    with pytest.raises(CorruptBlob):
        store.read_chunk_into(m, 1, buffer)
    assert not store.has(d)  # removed, as read_chunk does


def test_bad_chunk_is_refused_and_not_recorded(tmp_path, store):
    data = _blob(CHUNK_SIZE + 5)
    m = ChunkManifest.of(data)
    receiver = BlobStore(tmp_path / "other")
    with pytest.raises(InvalidMessage):
        receiver.put_chunk(m, 1, b"12345")
    assert receiver.missing_chunks(m) == [0, 1]


def test_lying_manifest_is_caught_at_the_end(tmp_path):
    # Chunks that match a manifest whose blob digest names other content.
    data = _blob(CHUNK_SIZE + 5)
    honest = ChunkManifest.of(data)
    lie = ChunkManifest(
        blob=ChunkManifest.of(b"other" * 2_000_000).blob, size=honest.size, chunks=honest.chunks
    )
    receiver = BlobStore(tmp_path / "other")
    receiver.put_chunk(lie, 0, data[:CHUNK_SIZE])
    with pytest.raises(CorruptBlob):
        receiver.put_chunk(lie, 1, data[CHUNK_SIZE:])
    assert not receiver.has(lie.blob)
    assert receiver.missing_chunks(lie) == [0, 1]


def test_empty_blob_round_trip(tmp_path, store):
    d = store.put_bytes(b"")
    m = store.manifest(d)
    assert m.chunks == ()
    assert store.read_bytes(d) == b""
