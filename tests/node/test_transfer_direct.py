"""Direct channels for blob transfer (node/storage/transfer_direct.py, node/net/direct.py).

Real libp2p nodes and real TCP on loopback. A hostile connection is a real socket that
does not know the key; no mocks, no sleeps.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import pytest
import trio

from node.net.direct import (
    SealedFramedStream,
    SealedStream,
    accept_channel,
    connect_channel,
    listener_port,
    open_listener,
)
from node.net.p2p import P2PNetwork, serve_network
from node.net.transport import DialError, FramedStream, RemoteNetworkError
from node.storage.store import BlobNotFound, BlobStore
from node.storage.transfer import (
    BLOB_PROTOCOL,
    TransferError,
    TransferReason,
    fetch_blob,
    serve_blobs,
)
from node.storage.transfer_direct import MAX_PER_PEER
from protocol.content import CHUNK_SIZE, ChunkManifest
from protocol.direct import MAX_RECORD, TAG_SIZE, derive_keys, direct_request
from protocol.encoding import decode, encode
from protocol.identity import PrivateKey

pytestmark = pytest.mark.integration

BOUND = 60  # seconds; a bound on a hang, never a timing assertion
A, B = PrivateKey.from_seed(b"\x71" * 32), PrivateKey.from_seed(b"\x72" * 32)


def content(size: int, seed: int) -> bytes:
    return (bytes((i * 13 + seed) % 256 for i in range(253)) * (size // 253 + 1))[:size]


@contextlib.asynccontextmanager
async def two_nodes() -> AsyncIterator[tuple[P2PNetwork, P2PNetwork]]:
    async with trio.open_nursery() as nursery:
        a = await nursery.start(serve_network, A)
        b = await nursery.start(serve_network, B)
        with trio.fail_after(BOUND):
            await b.connect(a.listen_addrs[0])
            yield a, b
        nursery.cancel_scope.cancel()


async def test_blob_travels_over_a_direct_channel(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="node")
    data = content(3 * CHUNK_SIZE + 5, seed=1)
    sender, receiver = BlobStore(tmp_path / "a"), BlobStore(tmp_path / "b")
    digest = sender.put_bytes(data)
    async with two_nodes() as (a, b):
        channels = serve_blobs(a, sender)
        await fetch_blob(b, receiver, digest, [a.peer_id])
    assert receiver.read_bytes(digest) == data
    assert channels is not None
    opened = sender.direct_channels["server", "opened"]
    assert opened >= 1
    assert "no direct channel" not in caplog.text
    # What /metrics shows (node/api/scrape.py): each side counted the channels it opened.
    assert receiver.direct_channels["requester", "opened"] == opened
    assert receiver.direct_channels["requester", "fell-back"] == 0


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "libp2p-fallback"])
async def test_blobs_move_both_ways_at_once(tmp_path, direct):
    """Each node fetches the other's blob at the same time, on one libp2p connection:
    over direct channels, and with them refused, over yamux streams both ways (which
    deadlocked in libp2p 0.8.1 before node/net/p2p.py deferred the read loop's writes)."""
    store_a, store_b = BlobStore(tmp_path / "a"), BlobStore(tmp_path / "b")
    data_a, data_b = content(6 * CHUNK_SIZE + 1, seed=2), content(6 * CHUNK_SIZE + 3, seed=3)
    digest_a, digest_b = store_a.put_bytes(data_a), store_b.put_bytes(data_b)
    async with two_nodes() as (a, b):
        channels = [serve_blobs(a, store_a, direct=direct), serve_blobs(b, store_b, direct=direct)]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(fetch_blob, a, store_a, digest_b, [b.peer_id], direct=direct)
            )
            nursery.start_soon(
                partial(fetch_blob, b, store_b, digest_a, [a.peer_id], direct=direct)
            )
    assert store_a.read_bytes(digest_b) == data_b
    assert store_b.read_bytes(digest_a) == data_a
    if direct:
        assert None not in channels
        assert all(s.direct_channels["server", "opened"] >= 1 for s in (store_a, store_b))
    else:
        assert channels == [None, None]


class OnceFailingStore(BlobStore):
    """Fails to read chunk 1 once (the blob vanished, say), ending the channel serving it."""

    failed = False

    def _fail_once(self, manifest: ChunkManifest, index: int) -> None:
        if index == 1 and not self.failed:
            self.failed = True
            raise BlobNotFound(manifest.blob)

    def read_chunk(self, manifest: ChunkManifest, index: int) -> bytes:
        self._fail_once(manifest, index)
        return super().read_chunk(manifest, index)

    def read_chunk_into(self, manifest: ChunkManifest, index: int, out: memoryview) -> memoryview:
        self._fail_once(manifest, index)  # a direct channel's server reads this way
        return super().read_chunk_into(manifest, index, out)


async def test_a_channel_that_breaks_mid_transfer_gives_way_to_libp2p(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="node")
    data = content(3 * CHUNK_SIZE, seed=6)
    sender, receiver = OnceFailingStore(tmp_path / "a"), BlobStore(tmp_path / "b")
    digest = sender.put_bytes(data)
    async with two_nodes() as (a, b):
        serve_blobs(a, sender)
        await fetch_blob(b, receiver, digest, [a.peer_id])
    assert receiver.read_bytes(digest) == data
    assert sender.failed
    assert "direct channel to" in caplog.text
    assert "broke, using libp2p" in caplog.text


async def test_requester_keeps_to_libp2p_when_the_server_offers_no_channel(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="node")
    data = content(2 * CHUNK_SIZE, seed=4)
    sender, receiver = BlobStore(tmp_path / "a"), BlobStore(tmp_path / "b")
    digest = sender.put_bytes(data)
    async with two_nodes() as (a, b):
        assert serve_blobs(a, sender, direct=False) is None
        await fetch_blob(b, receiver, digest, [a.peer_id])
    assert receiver.read_bytes(digest) == data
    assert "no direct channel" in caplog.text
    assert receiver.direct_channels["requester", "fell-back"] == 1  # once per peer
    assert receiver.direct_channels["requester", "opened"] == 0


async def _connected_pair(
    intruder: Callable[[int], Awaitable[None]] | None = None,
) -> tuple[SealedStream, SealedStream]:
    """A requester's and a server's channel over real TCP, keys negotiated as transfer does;
    ``intruder(port)`` connects to the server's port first, and is refused."""
    nonce_c, nonce_s = secrets.token_bytes(32), secrets.token_bytes(32)
    server_keys = derive_keys(nonce_c, nonce_s, B.peer_id, A.peer_id, we_request=False)
    client_keys = derive_keys(nonce_c, nonce_s, B.peer_id, A.peer_id, we_request=True)
    accepted: list[SealedStream] = []
    listener = await open_listener("127.0.0.1")
    port = listener_port(listener)

    async def serve() -> None:
        accepted.append(await accept_channel(listener, server_keys, B.peer_id, idle_timeout=5))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        if intruder is not None:
            await intruder(port)
        channel = await connect_channel("127.0.0.1", port, client_keys, A.peer_id)
    await listener.aclose()
    return channel, accepted[0]


async def _wrong_key(port: int) -> None:
    wrong = derive_keys(b"\x00" * 32, b"\x01" * 32, B.peer_id, A.peer_id, we_request=True)
    with pytest.raises(DialError):
        await connect_channel("127.0.0.1", port, wrong, A.peer_id)


async def _oversized_hello(port: int) -> None:
    """Announce a full-size record as the hello: dropped before the server buffers it."""
    raw = await trio.open_tcp_stream("127.0.0.1", port)
    await raw.send_all(MAX_RECORD.to_bytes(4, "big"))
    assert await raw.receive_some() == b""  # the server closed it
    await raw.aclose()


@pytest.mark.parametrize(
    ("intruder", "why"),
    [(_wrong_key, "did not open"), (_oversized_hello, f"direct record of {MAX_RECORD} bytes")],
)
async def test_a_connection_without_the_key_is_dropped_and_the_requester_gets_in(
    intruder, why, caplog
):
    caplog.set_level(logging.INFO, logger="node.net.direct")
    with trio.fail_after(BOUND):
        requester, server = await _connected_pair(intruder)
        # Dropped for what it sent, not for running out of time.
        assert why in caplog.text
        await requester.send_all(b"ping")
        assert await server.receive_some() == b"ping"
        await requester.aclose()
        assert await server.receive_some() == b""
        await server.aclose()


async def test_an_oversized_record_is_refused_before_it_is_read():
    with trio.fail_after(BOUND):
        requester, server = await _connected_pair()
        # A header announcing a record over the cap; no body follows it.
        oversized = (MAX_RECORD + TAG_SIZE + 1).to_bytes(4, "big")
        await requester._socket.send_all(oversized)
        with pytest.raises(RemoteNetworkError, match="direct record of"):
            await server.receive_some()
        await requester.aclose()


async def test_a_tampered_record_drops_the_channel():
    with trio.fail_after(BOUND):
        requester, server = await _connected_pair()
        record = bytearray(requester._sealer.seal(b"chunk bytes"))
        record[-1] ^= 1
        await requester._socket.send_all(bytes(record))
        with pytest.raises(RemoteNetworkError, match="did not open"):
            await server.receive_some()
        await requester.aclose()


async def test_a_peer_cannot_hold_more_than_its_share_of_channels(tmp_path):
    """Offers the requester never takes up count against it until they lapse: past
    MAX_PER_PEER outstanding ones, the server answers no-direct at once."""
    store = BlobStore(tmp_path / "a")
    async with two_nodes() as (a, b):
        serve_blobs(a, store)
        streams = []
        for _ in range(MAX_PER_PEER):
            framed = FramedStream(await b.open_stream(a.peer_id, BLOB_PROTOCOL))
            await framed.send_frame(encode(direct_request(secrets.token_bytes(32))))
            assert decode(await framed.receive_frame() or b"") == {"ok": True}
            streams.append(framed)
        framed = FramedStream(await b.open_stream(a.peer_id, BLOB_PROTOCOL))
        await framed.send_frame(encode(direct_request(secrets.token_bytes(32))))
        refusal = decode(await framed.receive_frame() or b"")
        assert isinstance(refusal, dict)
        assert refusal["error"] == "no-direct"
        assert await framed.receive_frame() is None  # and the stream ends
    assert store.direct_channels["server", "refused"] == 1


class LyingStore(BlobStore):
    """Serves chunk 0 with its first byte flipped, over a direct channel."""

    def read_chunk_into(self, manifest: ChunkManifest, index: int, out: memoryview) -> memoryview:
        view = super().read_chunk_into(manifest, index, out)
        if index == 0:
            view[0] ^= 0xFF
        return view


async def test_a_peer_lying_over_a_direct_channel_is_dropped_and_reported(tmp_path):
    data = content(2 * CHUNK_SIZE + 1, seed=7)
    liar, receiver = LyingStore(tmp_path / "a"), BlobStore(tmp_path / "b")
    digest = liar.put_bytes(data)
    bad: list[str] = []
    async with two_nodes() as (a, b):
        serve_blobs(a, liar)
        with pytest.raises(TransferError) as caught:
            await fetch_blob(
                b, receiver, digest, [a.peer_id], on_bad_peer=lambda p, _: bad.append(p)
            )
    assert caught.value.reason is TransferReason.ALL_PEERS_FAILED
    assert bad == [a.peer_id]
    assert receiver.direct_channels["requester", "opened"] >= 1
    assert 0 in receiver.missing_chunks(liar.manifest(digest))  # the bad chunk: not recorded


async def _sealed_pair() -> tuple[SealedFramedStream, SealedFramedStream]:
    requester, server = await _connected_pair()
    return (
        SealedFramedStream(requester, max_frame=CHUNK_SIZE),
        SealedFramedStream(server, max_frame=CHUNK_SIZE),
    )


async def test_a_frame_travels_as_one_record_and_arrives_as_a_view():
    with trio.fail_after(BOUND):
        requester, server = await _sealed_pair()
        chunk = content(CHUNK_SIZE, seed=8)
        async with trio.open_nursery() as nursery:  # 4 MiB: more than the sockets buffer
            nursery.start_soon(requester.send_frame, memoryview(chunk))
            # One record: the frame's header and body, sealed together.
            assert await server.sealed.receive_record() == len(chunk).to_bytes(4, "big") + chunk
        async with trio.open_nursery() as nursery:
            nursery.start_soon(requester.send_frame, chunk)
            frame = await server.receive_frame_view()
        assert isinstance(frame, memoryview)
        assert frame == chunk
        await requester.aclose()
        assert await server.receive_frame_view() is None
        await server.aclose()


async def test_frames_split_across_records_or_sharing_one_still_arrive_whole():
    """Record boundaries carry no meaning (rule 21): a peer may cut its frames anyhow."""
    with trio.fail_after(BOUND):
        requester, server = await _sealed_pair()
        body = content(100_000, seed=9)
        frame = len(body).to_bytes(4, "big") + body
        for cut in (1, 3, 50_000):  # the header split, then the body
            await requester.sealed.send_all(frame[:cut])
            await requester.sealed.send_all(frame[cut:])
            assert await server.receive_frame_view() == body
        await requester.sealed.send_all(b"\0\0\0\2hi\0\0\0\3you")  # two in one record
        assert await server.receive_frame_view() == b"hi"
        assert await server.receive_frame_view() == b"you"
        await requester.sealed.send_all((CHUNK_SIZE + 1).to_bytes(4, "big"))
        with pytest.raises(RemoteNetworkError, match="cap"):
            await server.receive_frame_view()  # over the frame cap: refused, as ever
        await requester.aclose()
        await server.aclose()
