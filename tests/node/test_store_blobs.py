"""The content-addressed store: atomic verified blobs, GC by reference, chunked transfer."""

from __future__ import annotations

import os

import pytest

from node.storage.store import BlobNotFound, BlobStore, CorruptBlob
from protocol.content import CHUNK_SIZE, ChunkManifest
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
