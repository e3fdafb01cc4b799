"""Moving blobs between peers over ``/cx/blob/1`` (spec/content.md, rules 4-9).

Rules:
- Wire: a stream carries any number of requests, one after another. Every frame is
  length-prefixed (node/net/framing.py). A request is one canonical-msgpack map:
  ``{"op": "manifest", "blob": d}`` or ``{"op": "chunks", "blob": d, "indices": [i, ...]}``.
  The reply opens with a status map, ``{"ok": true}`` or ``{"error": reason, "message":
  text}``; after ``ok`` come raw frames: the chunk manifest, or each requested chunk in the
  order asked. Bulk bytes are not wrapped in msgpack: the receiver checks them by hash.
- Serving: only complete blobs are served, every chunk checked as it is read
  (BlobStore.read_chunk, or read_chunk_into the channel's own buffer over a direct
  channel); a bad request ends the stream after its error reply.
- Fetching: the manifest comes from the first peer that has the blob and must name it.
  The missing chunks (PartialBlob.missing, so a transfer resumes) are then pulled from
  every peer at once, over several streams per peer, each asking for a few chunks at a
  time: one yamux stream alone stays far below the link (PLATFORM.md). The first batches
  are dealt round-robin over the peers; then idle streams take what is left. Each chunk is
  verified, written and fsynced in a worker thread as it arrives, beside the other
  streams' chunks, and the whole blob is hashed as contiguous chunks land
  (node/storage/partial.py): the digest check at the end (rule 8) has little left to do.
- Direct channels (spec/content.md, "Direct channel"; node/storage/transfer_direct.py
  serves them): each stream for chunks first asks its peer for one and, if it opens,
  fetches over it instead, the negotiating stream held open beside it. A peer that
  cannot give one (relayed, refused, unreachable, a server that predates them), or
  whose channel breaks, keeps to libp2p streams for the rest of the transfer. Chunks are
  verified the same either way. BlobStore.direct_channels counts what happened.
- A peer that is unreachable, breaks the wire rules, stalls, or sends a chunk that fails
  verification is dropped for this transfer and its unfinished chunks go to the others.
  Those that misbehaved (not those that merely failed) are reported to ``on_bad_peer``.
- A false manifest (every chunk verified, the whole digest did not, rule 8) fails the
  transfer once every chunk is in: the store discards its chunks and the peer that sent
  the manifest is reported.
- Images: the OCI manifest is fetched first, then its config and layers, each checked
  against its descriptor's size (rule 11), and the image is pinned as ``import`` pins it
  (``image/<hex>``), so image_config and RootfsCache work on it.

Errors::

    TransferError        ``reason`` (TransferReason), ``peer`` when one peer is to blame
      NOT_FOUND          no reachable peer has the blob
      ALL_PEERS_FAILED   peers had it, but every one failed or misbehaved before the end
      FALSE_MANIFEST     the manifest lied about the blob; its chunks were discarded
      BAD_IMAGE          the image manifest is malformed or does not match its blobs
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import secrets
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, cast

import trio

from node.net.direct import SealedFramedStream, SealedStream, connect_channel
from node.net.transport import (
    FramedStream,
    NetReason,
    Network,
    NetworkError,
    PeerId,
    ProtocolId,
    Stream,
    StreamClosed,
)
from node.storage.partial import PartialBlob
from node.storage.store import BlobStore, CorruptBlob, StoreError
from node.storage.transfer_direct import DirectServer
from protocol.content import CHUNK_SIZE, ChunkManifest, decode_manifest
from protocol.direct import (
    NONCE_SIZE,
    decode_offer,
    derive_keys,
    direct_request,
    parse_direct_request,
)
from protocol.encoding import Value, decode, encode
from protocol.errors import ProtocolError
from protocol.messages import check_digest

__all__ = [
    "BLOB_PROTOCOL",
    "DIRECT_CHANNEL_OUTCOMES",
    "TransferError",
    "TransferReason",
    "fetch_blob",
    "fetch_image",
    "serve_blobs",
]

logger = logging.getLogger(__name__)

BLOB_PROTOCOL = ProtocolId("/cx/blob/1")
MAX_FRAME = CHUNK_SIZE  # the largest body; a 4096-chunk manifest is about 140 KiB
# What BlobStore.direct_channels counts, by (role, outcome); /metrics shows each.
DIRECT_CHANNEL_OUTCOMES = (
    ("requester", "opened"),
    ("requester", "fell-back"),  # refused, unreachable, no TCP path, or broke mid-transfer
    ("server", "opened"),
    ("server", "refused"),
)
STREAMS_PER_PEER = 2  # one receives while the other waits for a reply or its chunk is stored
BATCH = 4  # chunks per request: few round trips, and little to redo when a peer fails
CHUNK_TIMEOUT = 30.0  # seconds for one frame; a peer slower than ~140 KB/s is dropped
# A peer serving a blob for the first time hashes all of it (up to 16 GiB) to make the
# manifest, so the first reply may take far longer than a chunk.
MANIFEST_TIMEOUT = 300.0
_MAX_IMAGE_MANIFEST = 4 * 1024 * 1024  # as node/storage/image.py reads JSON

Progress = Callable[[int, int], None]
"""``progress(bytes_done, bytes_total)``, called as chunks are stored."""
BadPeer = Callable[[PeerId, str], None]
"""``on_bad_peer(peer, why)``: the peer broke the rules; scoring may penalise it."""


class TransferReason(enum.StrEnum):
    NOT_FOUND = "not-found"
    ALL_PEERS_FAILED = "all-peers-failed"
    FALSE_MANIFEST = "false-manifest"
    BAD_IMAGE = "bad-image"


class TransferError(Exception):
    """A blob or image could not be fetched; ``reason`` says why, ``peer`` who, if one."""

    def __init__(self, reason: TransferReason, message: str, *, peer: PeerId | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.peer = peer


class _Refused(Exception):
    """The peer answered with an error status (it does not have the blob, most often)."""


class _PeerFault(Exception):
    """The peer broke the wire rules; drop it and report it."""


# Failures that drop one peer for the rest of a transfer. ProtocolError covers a reply that
# does not decode and a chunk or manifest that fails verification (the peer's fault).
_PEER_FAILURES = (NetworkError, ProtocolError, _PeerFault, _Refused, trio.TooSlowError)


def _misbehaved(exc: BaseException) -> bool:
    return isinstance(exc, ProtocolError | _PeerFault)


# -- serving ---------------------------------------------------------------------------------


def serve_blobs(net: Network, store: BlobStore, *, direct: bool = True) -> DirectServer | None:
    """Answer ``/cx/blob/1`` requests from ``store``, offering direct channels unless
    ``direct`` is false (then requesters keep to libp2p streams). Returns what serves the
    direct channels, if offered.

    Raises LocalNetworkError(DUPLICATE_HANDLER) if the protocol is already served.
    """

    async def serve_channel(framed: FramedStream) -> None:
        await _serve_stream(store, framed)

    channels = (
        DirectServer(net.peer_id, serve_channel, max_frame=MAX_FRAME, counts=store.direct_channels)
        if direct
        else None
    )

    async def handler(stream: Stream) -> None:
        try:
            await _serve_stream(store, FramedStream(stream, max_frame=MAX_FRAME), channels)
        except NetworkError as exc:  # the requester went away or broke the framing
            logger.debug("blob stream from %s ended: %s", stream.remote_peer, exc)
        except StoreError as exc:  # the blob went, or was found corrupt, mid-request
            logger.warning("stopped serving %s: %s", stream.remote_peer, exc)

    net.serve(BLOB_PROTOCOL, handler)
    return channels


async def _serve_stream(
    store: BlobStore, framed: FramedStream, direct: DirectServer | None = None
) -> None:
    while (frame := await framed.receive_frame()) is not None:
        try:
            request = _decode_request(frame)
            if direct is not None and request.get("op") == "direct":
                await direct.serve(framed, parse_direct_request(request))
                return  # the stream's job ends with the channel
            op, blob, indices = _parse_request(request)
        except (ProtocolError, ValueError) as exc:
            await _send_status(framed, error="bad-request", message=str(exc))
            return
        try:
            manifest = await trio.to_thread.run_sync(store.manifest, blob)
        except StoreError as exc:
            await _send_status(framed, error="not-found", message=str(exc))
            continue
        if op == "manifest":
            await _send_status(framed)
            await framed.send_frame(manifest.encode())
            continue
        if any(not 0 <= i < len(manifest.chunks) for i in indices):
            await _send_status(framed, error="bad-request", message="chunk index out of range")
            return
        await _send_status(framed)
        for index in indices:
            # A StoreError here (blob deleted, or found corrupt and removed) ends the
            # stream; the requester moves these chunks to another peer.
            store.traffic["sent"] += await _send_chunk(store, manifest, index, framed)


async def _send_chunk(
    store: BlobStore, manifest: ChunkManifest, index: int, framed: FramedStream
) -> int:
    """Read chunk ``index``, verified, and send it; returns its length. Over a direct
    channel it is read into the channel's own buffer, sealed before the next read."""
    if isinstance(framed, SealedFramedStream):
        buffer = framed.chunk_buffer(CHUNK_SIZE)
        view = await trio.to_thread.run_sync(store.read_chunk_into, manifest, index, buffer)
        await framed.send_frame(view)
        return len(view)
    data = await trio.to_thread.run_sync(store.read_chunk, manifest, index)
    await framed.send_frame(data)
    return len(data)


def _decode_request(frame: bytes) -> dict[str, Value]:
    request = decode(frame)
    if not isinstance(request, dict):
        raise ValueError("a request is a map")
    return request


def _parse_request(request: dict[str, Value]) -> tuple[str, str, list[int]]:
    op, blob = request.get("op"), request.get("blob")
    if not isinstance(blob, str):
        raise ValueError("blob must be a digest")
    check_digest(blob, "blob")
    if op == "manifest" and request.keys() == {"op", "blob"}:
        return op, blob, []
    indices = request.get("indices")
    if op != "chunks" or request.keys() != {"op", "blob", "indices"}:
        raise ValueError(f"unknown request {sorted(request)} for op {op!r}")
    if not isinstance(indices, list) or any(type(i) is not int for i in indices):
        raise ValueError("indices must be a list of integers")
    return op, blob, cast(list[int], indices)


async def _send_status(framed: FramedStream, *, error: str = "", message: str = "") -> None:
    status: dict[str, Value] = {"error": error, "message": message} if error else {"ok": True}
    await framed.send_frame(encode(status))


# -- fetching: the requester's side of one stream --------------------------------------------


@contextlib.asynccontextmanager
async def _open(net: Network, peer: PeerId) -> AsyncIterator[FramedStream]:
    framed = FramedStream(await net.open_stream(peer, BLOB_PROTOCOL), max_frame=MAX_FRAME)
    try:
        yield framed
    finally:
        await framed.aclose()


async def _request(framed: FramedStream, request: dict[str, Value]) -> None:
    """Send ``request`` and read its status. Raises _Refused or a peer failure."""
    await framed.send_frame(encode(request))
    with trio.fail_after(MANIFEST_TIMEOUT if request["op"] == "manifest" else CHUNK_TIMEOUT):
        status = decode(await _body(framed))
    if status == {"ok": True}:
        return
    if isinstance(status, dict) and isinstance(error := status.get("error"), str):
        message = status.get("message")
        raise _Refused(f"{error}: {message}" if isinstance(message, str) else error)
    raise _PeerFault(f"malformed status {status!r}")


async def _body(framed: FramedStream) -> bytes:
    frame = await framed.receive_frame()
    if frame is None:  # it stopped or died: a failure, not a fault
        raise StreamClosed(NetReason.CLOSED, "the peer ended the stream before its reply")
    return frame


async def _chunk_body(framed: FramedStream) -> bytes | memoryview:
    """A chunk's frame; over a direct channel, a view valid until the next receive."""
    if isinstance(framed, SealedFramedStream):
        frame = await framed.receive_frame_view()
        if frame is None:
            raise StreamClosed(NetReason.CLOSED, "the peer ended the stream before its reply")
        return frame
    return await _body(framed)


async def _ask_manifest(net: Network, peer: PeerId, digest: str) -> ChunkManifest:
    async with _open(net, peer) as framed:
        await _request(framed, {"op": "manifest", "blob": digest})
        with trio.fail_after(CHUNK_TIMEOUT):
            manifest = decode_manifest(await _body(framed))
    if manifest.blob != digest:
        raise _PeerFault(f"sent the manifest of {manifest.blob} when asked for {digest}")
    return manifest


async def _find_manifest(
    net: Network, digest: str, peers: Sequence[PeerId], on_bad_peer: BadPeer | None
) -> tuple[ChunkManifest, PeerId]:
    """The manifest from the first peer that has the blob. Raises TransferError."""
    failures: list[str] = []
    answered = False
    for peer in peers:
        try:
            return await _ask_manifest(net, peer, digest), peer
        except _PEER_FAILURES as exc:
            answered = answered or isinstance(exc, _Refused)
            failures.append(f"{peer}: {exc}")
            if _misbehaved(exc) and on_bad_peer is not None:
                on_bad_peer(peer, str(exc))
    if answered:
        raise TransferError(
            TransferReason.NOT_FOUND,
            f"no peer has blob {digest} ({'; '.join(failures)}); ask other peers",
        )
    raise TransferError(
        TransferReason.ALL_PEERS_FAILED,
        f"could not ask any peer for blob {digest} ({'; '.join(failures) or 'no peers'})",
    )


# -- fetching: one transfer over many streams ------------------------------------------------


class _Transfer:
    """The shared state of one blob's transfer: a queue of chunk indices and its workers."""

    def __init__(
        self,
        net: Network,
        store: BlobStore,
        partial: PartialBlob,
        missing: list[int],
        progress: Progress | None,
        on_bad_peer: BadPeer | None,
        *,
        direct: bool,
    ) -> None:
        self.net, self.store, self.partial = net, store, partial
        self.manifest = manifest = partial.manifest
        self.progress, self.on_bad_peer = progress, on_bad_peer
        # Peers whose direct channel could not be opened keep to libp2p streams.
        self.direct, self.no_direct = direct, set[PeerId]()
        self.queue = deque(missing)
        self.in_flight = 0
        self.done_bytes = manifest.size - sum(manifest.span(i)[1] for i in missing)
        self.dropped: dict[PeerId, str] = {}
        # What ends the whole transfer: our own disk failing.
        self.fatal: OSError | None = None
        self._changed = trio.Event()

    async def run(self, peers: Sequence[PeerId]) -> None:
        per_peer = min(STREAMS_PER_PEER, -(-len(self.queue) // BATCH))
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            # Deal the first batches round-robin, so every peer starts with work.
            for _ in range(per_peer):
                for peer in peers:
                    nursery.start_soon(self._worker, peer, self._take())

    def _take(self) -> list[int]:
        batch = [self.queue.popleft() for _ in range(min(BATCH, len(self.queue)))]
        self.in_flight += len(batch)
        return batch

    def _touch(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _claim(self, peer: PeerId) -> list[int]:
        """The next batch for ``peer``; empty when there is nothing left it could do."""
        while peer not in self.dropped:
            if self.queue:
                return self._take()
            if not self.in_flight:
                break
            await self._changed.wait()  # a failing peer may hand its chunks back
        return []

    def _release(self, batch: list[int]) -> None:
        self.in_flight -= len(batch)
        self.queue.extend(batch)
        batch.clear()
        self._touch()

    async def _worker(self, peer: PeerId, batch: list[int]) -> None:
        try:
            while batch or (batch := await self._claim(peer)):
                # Held only while there is work at once: a worker waiting for chunks a
                # failing peer may hand back holds no channel the server would idle out.
                async with self._open_for_chunks(peer) as framed:
                    try:
                        while batch:
                            await self._fetch(framed, batch)
                            batch = self._take() if self.queue and peer not in self.dropped else []
                    except NetworkError as exc:
                        if not isinstance(framed.stream, SealedStream):
                            raise
                        # The channel broke, not necessarily the peer: what is left of the
                        # batch goes over libp2p streams (chunks stored stay stored).
                        self._fall_back(peer)
                        logger.info("direct channel to %s broke, using libp2p: %s", peer, exc)
        except _PEER_FAILURES as exc:
            self._drop(peer, exc)
        finally:
            self._release(batch)

    @contextlib.asynccontextmanager
    async def _open_for_chunks(self, peer: PeerId) -> AsyncIterator[FramedStream]:
        """A direct channel to ``peer`` when one opens, else a libp2p stream."""
        async with _open(self.net, peer) as stream:
            host = stream.stream.remote_host
            if host is None and self.direct:
                self._fall_back(peer)  # relayed or in memory: no TCP path to take
            if not self.direct or peer in self.no_direct or host is None:
                yield stream
                return
            channel = await self._open_direct(stream, peer, host)
            if channel is not None:
                try:
                    yield channel  # the stream stays open while the channel lives (rule 21)
                finally:
                    await channel.aclose()
                return
        async with _open(self.net, peer) as stream:  # the server ended the refused one
            yield stream

    async def _open_direct(
        self, stream: FramedStream, peer: PeerId, host: str
    ) -> FramedStream | None:
        """Negotiate a direct channel on ``stream`` (spec/content.md, "Direct channel");
        None if it is refused or cannot be reached, and then ``peer`` keeps to libp2p
        streams for this transfer (not reported: a middlebox may be at fault)."""
        try:
            nonce = secrets.token_bytes(NONCE_SIZE)
            await _request(stream, direct_request(nonce))
            with trio.fail_after(CHUNK_TIMEOUT):
                offer = decode_offer(await _body(stream))
            keys = derive_keys(nonce, offer.nonce, self.net.peer_id, peer, we_request=True)
            channel = await connect_channel(host, offer.port, keys, peer)
        except _PEER_FAILURES as exc:
            self._fall_back(peer)
            logger.info("no direct channel to %s, using libp2p streams: %s", peer, exc)
            return None
        self.store.direct_channels["requester", "opened"] += 1
        return SealedFramedStream(channel, max_frame=MAX_FRAME)

    def _fall_back(self, peer: PeerId) -> None:
        """``peer`` keeps to libp2p streams for the rest of this transfer (counted once)."""
        if peer not in self.no_direct:
            self.no_direct.add(peer)
            self.store.direct_channels["requester", "fell-back"] += 1

    async def _fetch(self, framed: FramedStream, batch: list[int]) -> None:
        """Fetch and store ``batch``, removing each index from it once stored."""
        blob = self.manifest.blob
        await _request(framed, {"op": "chunks", "blob": blob, "indices": list(batch)})
        while batch:
            with trio.fail_after(CHUNK_TIMEOUT):
                data = await _chunk_body(framed)
            await self._store(batch[0], data)  # done with data before the next receive
            batch.pop(0)
            self.in_flight -= 1

    async def _store(self, index: int, data: bytes | memoryview) -> None:
        # Verified, written and fsynced in a worker thread, beside the other streams' chunks.
        try:
            await trio.to_thread.run_sync(self.partial.put, index, data)
        except OSError as exc:
            self.fatal = exc
            self.nursery.cancel_scope.cancel()
            return
        self.done_bytes += len(data)
        self.store.traffic["received"] += len(data)
        if self.progress is not None:
            self.progress(self.done_bytes, self.manifest.size)

    def _drop(self, peer: PeerId, exc: BaseException) -> None:
        why = f"{type(exc).__name__}: {exc}"
        self.dropped[peer] = why
        logger.info("dropped %s from the transfer of %s: %s", peer, self.manifest.blob, why)
        if _misbehaved(exc) and self.on_bad_peer is not None:
            self.on_bad_peer(peer, why)


# One transfer per (store, blob) at a time in this process: two jobs that need the same
# layer, or two receipts naming the same log, must not write one partial file together.
_FETCHING: dict[tuple[str, str], trio.Lock] = {}


async def fetch_blob(
    net: Network,
    store: BlobStore,
    digest: str,
    peers: Sequence[PeerId],
    *,
    progress: Progress | None = None,
    on_bad_peer: BadPeer | None = None,
    direct: bool = True,
) -> str:
    """Fetch blob ``digest`` from ``peers`` into ``store`` (a no-op if it is there already).

    Chunks travel over direct channels where the peers offer them, else (or with
    ``direct`` false) over libp2p streams.
    Only chunks the store lacks are fetched, so an interrupted transfer resumes. A second
    fetch of the same blob into the same store waits for the first. Returns ``digest``.
    Raises TransferError (NOT_FOUND, ALL_PEERS_FAILED, FALSE_MANIFEST), OSError if the
    store cannot be written, ValueError if ``digest`` is not a digest.
    """
    check_digest(digest, "blob")
    key = (str(store.root), digest)
    lock = _FETCHING.setdefault(key, trio.Lock())
    try:
        async with lock:
            return await _fetch_blob(net, store, digest, peers, progress, on_bad_peer, direct)
    finally:
        if not lock.locked() and not lock.statistics().tasks_waiting:
            _FETCHING.pop(key, None)


async def _fetch_blob(
    net: Network,
    store: BlobStore,
    digest: str,
    peers: Sequence[PeerId],
    progress: Progress | None,
    on_bad_peer: BadPeer | None,
    direct: bool,
) -> str:
    if store.has(digest):
        return digest
    peers = list(dict.fromkeys(peers))
    manifest, source = await _find_manifest(net, digest, peers, on_bad_peer)
    if not manifest.chunks:
        await trio.to_thread.run_sync(store.put_bytes, b"")
        return digest
    with await trio.to_thread.run_sync(store.open_partial, manifest) as partial:
        # Resumed where an earlier transfer stopped (a crash may even have come between
        # its last chunk and the commit: then nothing is missing).
        transfer = _Transfer(
            net, store, partial, partial.missing(), progress, on_bad_peer, direct=direct
        )
        await transfer.run(peers)
        if transfer.fatal is not None:
            raise transfer.fatal
        if not partial.complete:
            failures = "; ".join(f"{p}: {why}" for p, why in transfer.dropped.items())
            raise TransferError(
                TransferReason.ALL_PEERS_FAILED,
                f"every peer failed before blob {digest} was complete ({failures}); "
                "what arrived is kept, retry with more peers",
            )
        try:
            return await trio.to_thread.run_sync(store.finish_partial, partial)
        except CorruptBlob as exc:
            if on_bad_peer is not None:
                on_bad_peer(source, "false manifest")
            raise TransferError(
                TransferReason.FALSE_MANIFEST,
                f"{source} sent a false manifest for {digest}; chunks discarded, "
                "fetch again from other peers",
                peer=source,
            ) from exc


# -- images ----------------------------------------------------------------------------------


async def fetch_image(
    net: Network,
    store: BlobStore,
    manifest_digest: str,
    peers: Sequence[PeerId],
    *,
    progress: Progress | None = None,
    on_bad_peer: BadPeer | None = None,
    direct: bool = True,
) -> None:
    """Fetch the OCI image named by ``manifest_digest`` (its manifest, config and layers)
    and pin it under ``image/<hex>`` as ``import`` does.

    ``progress`` counts the bytes of the config and layers. Raises TransferError
    (BAD_IMAGE when the manifest is malformed or a blob's size is not its descriptor's).
    """
    await fetch_blob(net, store, manifest_digest, peers, on_bad_peer=on_bad_peer, direct=direct)
    blobs = await trio.to_thread.run_sync(_image_blobs, store, manifest_digest)
    total, done = sum(blobs.values()), 0

    def report(got: int, _: int) -> None:
        if progress is not None:
            progress(done + got, total)

    for digest, size in blobs.items():
        await fetch_blob(
            net, store, digest, peers, progress=report, on_bad_peer=on_bad_peer, direct=direct
        )
        if (actual := store.size(digest)) != size:
            raise TransferError(
                TransferReason.BAD_IMAGE,
                f"image {manifest_digest}: blob {digest} is {actual} bytes, "
                f"its descriptor says {size}",
            )
        done += size
    store.pin(f"image/{manifest_digest[len('sha256:') :]}", [manifest_digest, *blobs])


def _image_blobs(store: BlobStore, manifest_digest: str) -> dict[str, int]:
    """The config and layer digests of an image manifest, with their sizes, in order."""

    def bad(why: str) -> TransferError:
        return TransferError(TransferReason.BAD_IMAGE, f"image {manifest_digest}: {why}")

    if store.size(manifest_digest) > _MAX_IMAGE_MANIFEST:
        raise bad("the manifest is too large to be an image manifest")
    try:
        manifest: Any = json.loads(store.read_bytes(manifest_digest))
        descriptors = [manifest["config"], *manifest["layers"]]
        blobs = {d["digest"]: d["size"] for d in descriptors}
        for digest, size in blobs.items():
            check_digest(digest, "descriptor")
            if type(size) is not int or size < 0:
                raise bad(f"descriptor of {digest} has size {size!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise bad(f"not an OCI image manifest ({exc}); is it an index?") from exc
    return blobs
