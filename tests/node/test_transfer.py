"""Blob and image transfer (node/storage/transfer.py) between peers.

Over the in-memory network, plus one transfer over real libp2p on loopback. Serving stores
are BlobStore subclasses that count (or falsify) what they serve: real counters, no mocks.
No sleeps: a peer dies from inside its own store, synchronously, at a chosen chunk.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
import trio

from node.net.memnet import MemoryHub, serve_memory_network
from node.net.p2p import serve_network
from node.net.transport import Network, PeerId
from node.storage.image import build_rootfs, image_config, import_image
from node.storage.store import BlobStore
from node.storage.transfer import (
    TransferError,
    TransferReason,
    fetch_blob,
    fetch_image,
    serve_blobs,
)
from protocol.content import CHUNK_SIZE, ChunkManifest, digest_of
from protocol.identity import PrivateKey

BOUND = 30  # seconds; a bound on a hang, never a timing assertion


def content(size: int, seed: int = 0) -> bytes:
    return (bytes((i * 7 + seed) % 256 for i in range(251)) * (size // 251 + 1))[:size]


def peer(i: int) -> PeerId:
    return PrivateKey.from_seed(bytes([0x70 + i]) * 32).peer_id


class CountingStore(BlobStore):
    """Records the index of every chunk it serves (read_chunk runs in worker threads)."""

    def __init__(self, root: object) -> None:
        super().__init__(root)  # type: ignore[arg-type]
        self.served: list[int] = []

    def read_chunk(self, manifest: ChunkManifest, index: int) -> bytes:
        self.served.append(index)
        return super().read_chunk(manifest, index)

    def read_chunk_into(self, manifest: ChunkManifest, index: int, out: memoryview) -> memoryview:
        self.served.append(index)  # how a direct channel's server reads (real libp2p only)
        return super().read_chunk_into(manifest, index, out)


class LyingStore(CountingStore):
    """Serves every chunk with its first byte flipped."""

    def read_chunk(self, manifest: ChunkManifest, index: int) -> bytes:
        data = super().read_chunk(manifest, index)
        return bytes([data[0] ^ 0xFF]) + data[1:]


class DyingStore(CountingStore):
    """Kills its own node while reading its second chunk, before that chunk is sent."""

    kill: Callable[[], None]

    def read_chunk(self, manifest: ChunkManifest, index: int) -> bytes:
        if len(self.served) == 1:
            trio.from_thread.run_sync(self.kill)
        return super().read_chunk(manifest, index)


class FalseManifestStore(CountingStore):
    """Claims to hold ``claimed`` with a manifest whose chunks are really ``real``'s."""

    def __init__(self, root: object, real: str, claimed: str) -> None:
        super().__init__(root)
        self.real = real
        self.claimed = claimed

    def manifest(self, digest: str) -> ChunkManifest:
        m = super().manifest(self.real)
        return ChunkManifest(blob=self.claimed, size=m.size, chunks=m.chunks)

    def read_chunk(self, manifest: ChunkManifest, index: int) -> bytes:
        return super().read_chunk(super().manifest(self.real), index)


async def _node(
    hub: MemoryHub,
    peer_id: PeerId,
    *,
    task_status: trio.TaskStatus[tuple[Network, trio.CancelScope]],
) -> None:
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            net = await nursery.start(serve_memory_network, hub, peer_id)
            task_status.started((net, scope))


@contextlib.asynccontextmanager
async def serving(*stores: BlobStore) -> AsyncIterator[tuple[Network, list[trio.CancelScope]]]:
    """A receiving node, and one node serving each store (peer(1), peer(2), ...)."""
    hub = MemoryHub()
    async with trio.open_nursery() as nursery:
        client, _ = await nursery.start(_node, hub, peer(0))
        scopes = []
        for i, store in enumerate(stores, start=1):
            net, scope = await nursery.start(_node, hub, peer(i))
            serve_blobs(net, store)
            scopes.append(scope)
        with trio.fail_after(BOUND):
            yield client, scopes
        nursery.cancel_scope.cancel()


@pytest.fixture
def receiver(tmp_path):
    return BlobStore(tmp_path / "receiver")


def source(tmp_path, data: bytes, cls: type[CountingStore] = CountingStore) -> CountingStore:
    store = cls(tmp_path / f"source-{cls.__name__}")
    store.put_bytes(data)
    return store


async def test_small_blob(tmp_path, receiver):
    sender = source(tmp_path, b"hello")
    seen: list[tuple[int, int]] = []
    async with serving(sender) as (client, _):
        got = await fetch_blob(
            client, receiver, digest_of(b"hello"), [peer(1)], progress=_add(seen)
        )
    assert got == digest_of(b"hello")
    assert receiver.read_bytes(got) == b"hello"
    assert seen == [(5, 5)]


async def test_empty_blob(tmp_path, receiver):
    sender = source(tmp_path, b"")
    async with serving(sender) as (client, _):
        assert await fetch_blob(client, receiver, digest_of(b""), [peer(1)]) == digest_of(b"")
    assert receiver.read_bytes(digest_of(b"")) == b""
    assert sender.served == []


async def test_multi_chunk_blob_reports_progress(tmp_path, receiver):
    data = content(2 * CHUNK_SIZE + 1000)
    sender = source(tmp_path, data)
    seen: list[tuple[int, int]] = []
    async with serving(sender) as (client, _):
        await fetch_blob(client, receiver, digest_of(data), [peer(1)], progress=_add(seen))
    assert receiver.read_bytes(digest_of(data)) == data
    assert sorted(sender.served) == [0, 1, 2]
    assert [total for _, total in seen] == [len(data)] * 3
    assert sorted(done for done, _ in seen)[-1] == len(data)
    async with serving(sender) as (client, _):  # present: nothing is asked for again
        await fetch_blob(client, receiver, digest_of(data), [peer(1)])
    assert sorted(sender.served) == [0, 1, 2]


async def test_concurrent_fetches_of_one_blob_share_the_transfer(tmp_path, receiver):
    data = content(CHUNK_SIZE + 3, seed=6)
    sender = source(tmp_path, data)
    async with serving(sender) as (client, _), trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(fetch_blob, client, receiver, digest_of(data), [peer(1)])
    assert receiver.read_bytes(digest_of(data)) == data
    assert sorted(sender.served) == [0, 1]


async def test_resume_fetches_only_missing_chunks(tmp_path, receiver):
    data = content(3 * CHUNK_SIZE + 100, seed=1)
    sender = source(tmp_path, data)
    manifest = sender.manifest(digest_of(data))
    for i in (0, 2):  # an earlier, interrupted transfer
        offset, length = manifest.span(i)
        assert receiver.put_chunk(manifest, i, data[offset : offset + length]) is None
    seen: list[tuple[int, int]] = []
    async with serving(sender) as (client, _):
        await fetch_blob(client, receiver, digest_of(data), [peer(1)], progress=_add(seen))
    assert sorted(sender.served) == [1, 3]
    assert receiver.read_bytes(digest_of(data)) == data
    assert min(done for done, _ in seen) > 2 * CHUNK_SIZE  # counted from what was there


async def test_a_transfer_cut_off_before_its_commit_finishes_without_fetching(tmp_path, receiver):
    """Every chunk recorded, then a crash before the blob was committed: the next fetch
    asks only for the manifest, hashes what is there and commits it."""
    data = content(2 * CHUNK_SIZE + 9, seed=5)
    sender = source(tmp_path, data)
    manifest = sender.manifest(digest_of(data))
    partial = receiver.open_partial(manifest)
    for i in range(len(manifest.chunks)):
        offset, length = manifest.span(i)
        partial.put(i, data[offset : offset + length])
    partial.close()  # no seal, no commit: as a kill -9 leaves it
    assert not receiver.has(digest_of(data))
    async with serving(sender) as (client, _):
        await fetch_blob(client, receiver, digest_of(data), [peer(1)])
    assert sender.served == []
    assert receiver.read_bytes(digest_of(data)) == data


async def test_peer_dying_mid_transfer_moves_its_chunks_to_the_other(tmp_path, receiver):
    data = content(3 * CHUNK_SIZE + 5, seed=2)
    dying = source(tmp_path, data, DyingStore)
    honest = source(tmp_path, data)
    bad: list[PeerId] = []
    async with serving(dying, honest) as (client, scopes):
        assert isinstance(dying, DyingStore)
        dying.kill = scopes[0].cancel
        peers = [peer(1), peer(2)]
        await fetch_blob(client, receiver, digest_of(data), peers, on_bad_peer=_bad(bad))
    assert receiver.read_bytes(digest_of(data)) == data
    # Chunks are dealt round-robin: the dying peer got [0, 1] and died reading 1.
    assert dying.served == [0, 1]
    assert sorted(honest.served) == [1, 2, 3]
    assert bad == []  # failing is not misbehaving


async def test_lying_peer_is_dropped_and_reported(tmp_path, receiver):
    data = content(2 * CHUNK_SIZE + 5, seed=3)
    liar = source(tmp_path, data, LyingStore)
    honest = source(tmp_path, data)
    bad: list[PeerId] = []
    async with serving(liar, honest) as (client, _):
        peers = [peer(1), peer(2)]
        await fetch_blob(client, receiver, digest_of(data), peers, on_bad_peer=_bad(bad))
    assert receiver.read_bytes(digest_of(data)) == data
    assert liar.served[0] == 0  # its first chunk failed verification
    assert sorted(honest.served) == [0, 1, 2]
    assert bad == [peer(1)]


async def test_false_manifest_discards_the_transfer(tmp_path, receiver):
    data = content(CHUNK_SIZE + 10, seed=4)
    claimed = digest_of(b"something else")
    liar = FalseManifestStore(tmp_path / "liar", real=digest_of(data), claimed=claimed)
    liar.put_bytes(data)
    bad: list[PeerId] = []
    async with serving(liar) as (client, _):
        with pytest.raises(TransferError) as caught:
            await fetch_blob(client, receiver, claimed, [peer(1)], on_bad_peer=_bad(bad))
    assert caught.value.reason is TransferReason.FALSE_MANIFEST
    assert caught.value.peer == peer(1)
    assert bad == [peer(1)]
    assert not receiver.has(claimed)
    assert list((receiver.root / "partial").iterdir()) == []


async def test_blob_no_peer_has_is_not_found(tmp_path, receiver):
    sender = source(tmp_path, b"other")
    async with serving(sender) as (client, _):
        with pytest.raises(TransferError) as caught:
            await fetch_blob(client, receiver, digest_of(b"missing"), [peer(1)])
    assert caught.value.reason is TransferReason.NOT_FOUND


async def test_unreachable_peers_fail_the_transfer(tmp_path, receiver):
    async with serving() as (client, _):
        with pytest.raises(TransferError) as caught:
            await fetch_blob(client, receiver, digest_of(b"x"), [peer(5), peer(6)])
    assert caught.value.reason is TransferReason.ALL_PEERS_FAILED


async def test_fetch_image_brings_manifest_config_and_layers(tmp_path, receiver):
    sender = BlobStore(tmp_path / "sender")
    digest = build_rootfs(tmp_path / "layout")
    image = import_image(sender, tmp_path / "layout")
    seen: list[tuple[int, int]] = []
    async with serving(sender) as (client, _):
        await fetch_image(client, receiver, digest, [peer(1)], progress=_add(seen))
    assert image_config(receiver, digest)["Cmd"] == ["/bin/sh"]
    for blob in (digest, image.config, *image.layers):
        receiver.verify(blob)
    assert receiver.refs() == {f"image/{digest[7:]}": sender.refs()[f"image/{digest[7:]}"]}
    total = image.size - receiver.size(digest)  # progress counts the config and layers
    assert seen[-1] == (total, total)


async def test_fetch_image_refuses_a_blob_that_is_not_an_image(tmp_path, receiver):
    sender = source(tmp_path, b'{"schemaVersion": 2, "manifests": []}')
    digest = digest_of(b'{"schemaVersion": 2, "manifests": []}')
    async with serving(sender) as (client, _):
        with pytest.raises(TransferError) as caught:
            await fetch_image(client, receiver, digest, [peer(1)])
    assert caught.value.reason is TransferReason.BAD_IMAGE


@pytest.mark.integration
async def test_multi_chunk_blob_over_libp2p(tmp_path, receiver):
    data = content(2 * CHUNK_SIZE + 77, seed=5)
    sender = source(tmp_path, data)
    async with trio.open_nursery() as nursery:
        a = await nursery.start(serve_network, PrivateKey.from_seed(b"\x61" * 32))
        b = await nursery.start(serve_network, PrivateKey.from_seed(b"\x62" * 32))
        serve_blobs(a, sender)
        with trio.fail_after(BOUND):
            await b.connect(a.listen_addrs[0])
            await fetch_blob(b, receiver, digest_of(data), [a.peer_id])
        nursery.cancel_scope.cancel()
    assert receiver.read_bytes(digest_of(data)) == data
    assert sorted(sender.served) == [0, 1, 2]


def _add(seen: list[tuple[int, int]]) -> Callable[[int, int], None]:
    return lambda done, total: seen.append((done, total))


def _bad(bad: list[PeerId]) -> Callable[[PeerId, str], None]:
    return lambda who, why: bad.append(who)
