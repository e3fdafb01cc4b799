"""The direct channel's sockets: sealed records over one TCP connection, as a Stream.

Rules (the records and the hellos: protocol/direct.py, spec/content.md "Direct channel"):
- The server listens for one channel on an ephemeral port (:func:`open_listener`):
  on loopback when the requester came over loopback, else on every address of its family.
  It accepts connections until one opens the requester's hello (:func:`accept_channel`),
  each given :data:`HELLO_TIMEOUT`, all within the caller's deadline; the others are
  dropped. Only then does it send its own hello.
- The requester dials (:func:`connect_channel`), sends its hello and must open the
  server's: a server that cannot prove the negotiated key is dropped.
- :class:`SealedFramedStream` seals each frame as one record where it fits and hands a
  frame that arrived as one record to its reader without copying it.
- A :class:`SealedStream` refuses a record longer than ``MAX_RECORD`` before reading it,
  drops the connection on any record that does not open, and, when given ``idle_timeout``,
  ends a receive or a send that waits longer (a peer that stops reading or writing holds
  a channel no longer than that).
- Errors are the network seam's: StreamClosed (the connection ended, or idled out),
  RemoteNetworkError(BAD_FRAME) (a record too large or not opening), DialError (no channel).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import math
from collections.abc import Iterator

import trio

from node.net.buffers import aligned_buffer
from node.net.framing import DEFAULT_MAX_FRAME, HEADER_SIZE, frame_header
from node.net.transport import (
    DialError,
    FramedStream,
    NetReason,
    NetworkError,
    PeerId,
    RemoteNetworkError,
    StreamClosed,
)
from protocol.direct import (
    MAX_RECORD,
    RECORD_HEADER,
    REQUESTER_HELLO,
    SERVER_HELLO,
    DirectKeys,
    Opener,
    Sealer,
)
from protocol.errors import InvalidMessage

__all__ = [
    "HELLO_TIMEOUT",
    "SealedFramedStream",
    "SealedStream",
    "accept_channel",
    "connect_channel",
    "listener_port",
    "open_listener",
]

logger = logging.getLogger(__name__)

HELLO_TIMEOUT = 5.0  # seconds for one connection to open the requester's hello
_SOCKET_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)
_HELLO_LIMIT = max(len(REQUESTER_HELLO), len(SERVER_HELLO))


class SealedStream:
    """A :class:`~node.net.transport.Stream` whose bytes travel as sealed records."""

    __slots__ = (
        "_busy",
        "_idle",
        "_inbox",
        "_opener",
        "_pending",
        "_plain",
        "_remote",
        "_sealer",
        "_socket",
    )

    def __init__(
        self,
        socket: trio.SocketStream,
        keys: DirectKeys,
        remote: PeerId,
        *,
        idle_timeout: float = math.inf,
    ) -> None:
        self._socket = socket
        self._sealer, self._opener = Sealer(keys.send), Opener(keys.receive)
        self._remote = remote
        self._idle = idle_timeout
        self._pending = memoryview(b"")
        # Reused for every record received: its ciphertext (page-aligned, as the kernel
        # copies into it fastest: node/net/buffers.py), then its plaintext.
        self._inbox, self._plain = aligned_buffer(RECORD_HEADER), bytearray()
        # The sealer and the buffers are reused: one send and one receive at a time.
        self._busy: set[str] = set()

    @property
    def remote_peer(self) -> PeerId:
        return self._remote

    @property
    def remote_host(self) -> str | None:
        return None  # already direct: nothing to negotiate over it

    async def send_all(self, data: bytes) -> None:
        view = memoryview(data)
        with self._bounded("send"):
            for start in range(0, len(view), MAX_RECORD):
                await self._socket.send_all(self._sealer.seal(view[start : start + MAX_RECORD]))

    async def send_record(self, *parts: bytes | memoryview) -> None:
        """Send ``parts`` joined as one record (at most MAX_RECORD bytes in all)."""
        with self._bounded("send"):
            await self._socket.send_all(self._sealer.seal(*parts))

    @property
    def pending(self) -> int:
        """Bytes of the last record received that receive_some has not yet returned."""
        return len(self._pending)

    async def receive_some(self, max_bytes: int = 65536) -> bytes:
        if not self._pending:
            self._pending = await self.receive_view()
        part, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return bytes(part)

    async def receive_record(self, *, limit: int = MAX_RECORD) -> bytes:
        """The next record's plaintext, whole; ``b""`` at a clean end of the connection.
        A record announcing more than ``limit`` bytes is refused before it is read."""
        return bytes(await self.receive_view(limit=limit))

    async def receive_view(self, *, limit: int = MAX_RECORD) -> memoryview:
        """As :meth:`receive_record`, but a view of the plaintext in a buffer the next
        receive reuses: the caller is done with it by then (no copy of a 4 MiB chunk)."""
        if self._pending:  # receive_some's leftovers: they come first
            raise trio.BusyResourceError("bytes of the last record are still unread")
        with self._bounded("receive"):
            if not await self._read_into_inbox(RECORD_HEADER, eof_ok=True):
                return memoryview(b"")
            try:
                size = Opener.record_size(self._inbox[:RECORD_HEADER], limit=limit)
                await self._read_into_inbox(size, eof_ok=False)
                if len(self._plain) < size:
                    self._plain = bytearray(size)  # grows to the largest record seen, once
                return self._opener.open_into(self._inbox[:size], self._plain)
            except InvalidMessage as exc:
                await self.aclose()
                raise RemoteNetworkError(
                    NetReason.BAD_FRAME, f"direct channel from {self._remote}: {exc}"
                ) from exc

    async def _read_into_inbox(self, size: int, *, eof_ok: bool) -> bool:
        """Fill the inbox's first ``size`` bytes; False at a clean end (``eof_ok``)."""
        if len(self._inbox) < size:
            self._inbox = aligned_buffer(size)  # grows to the largest record seen, once
        view, got = self._inbox, 0
        while got < size:
            n = await self._socket.socket.recv_into(view[got:size])
            if n == 0:
                if got == 0 and eof_ok:
                    return False
                raise StreamClosed(NetReason.CLOSED, "the direct channel ended inside a record")
            got += n
        return True

    @contextlib.contextmanager
    def _bounded(self, what: str) -> Iterator[None]:
        """Socket errors and the idle timeout of one send or receive become StreamClosed."""
        where = f"direct channel {what} with {self._remote}"
        if what in self._busy:  # a second task would overwrite the buffer of the first
            raise trio.BusyResourceError(f"another task is already in a {where}")
        self._busy.add(what)
        try:
            with trio.fail_after(self._idle):
                yield
        except trio.TooSlowError as exc:
            raise StreamClosed(NetReason.CLOSED, f"{where}: idle for {self._idle} s") from exc
        except _SOCKET_ERRORS as exc:
            raise StreamClosed(NetReason.CLOSED, f"{where}: {exc}") from exc
        finally:
            self._busy.discard(what)

    async def aclose(self) -> None:
        with contextlib.suppress(*_SOCKET_ERRORS):
            await self._socket.aclose()


class SealedFramedStream(FramedStream):
    """Frames over a :class:`SealedStream`, one record per frame where it fits (rule 21:
    record boundaries carry no meaning, so this is the sender's choice alone). A frame
    goes out as one record, its header and body sealed together, and
    :meth:`receive_frame_view` hands out a frame that arrived as one record as a view of
    the channel's buffer: one cipher pass, no copy and no allocation per 4 MiB chunk."""

    __slots__ = ("_chunks", "sealed")

    def __init__(self, stream: SealedStream, *, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        super().__init__(stream, max_frame=max_frame)
        self.sealed = stream
        self._chunks: memoryview | None = None

    def chunk_buffer(self, size: int) -> memoryview:
        """A page-aligned buffer of at least ``size`` bytes for the payloads this stream
        sends, the same one each time: fill it, send it, then fill it again."""
        if self._chunks is None or len(self._chunks) < size:
            self._chunks = aligned_buffer(size)
        return self._chunks

    async def send_frame(self, payload: bytes | memoryview) -> None:
        if len(payload) > self.max_frame or HEADER_SIZE + len(payload) > MAX_RECORD:
            await super().send_frame(bytes(payload))  # the size error, or several records
            return
        await self.sealed.send_record(frame_header(len(payload)), payload)

    async def receive_frame_view(self) -> bytes | memoryview | None:
        """As :meth:`receive_frame`, but the frame may be a view that the next receive on
        this stream overwrites: the caller is done with it by then."""
        if self._decoder.buffered or self.sealed.pending:
            return await self.receive_frame()
        record = await self.sealed.receive_view()
        if not record:
            return None
        if len(record) >= HEADER_SIZE:
            length = int.from_bytes(record[:HEADER_SIZE], "big")
            if length == len(record) - HEADER_SIZE and length <= self.max_frame:
                return record[HEADER_SIZE:]
        self._decoder.feed(record)  # copied: not one whole frame (the decoder checks it)
        return await self.receive_frame()


async def open_listener(requester_host: str) -> trio.SocketListener:
    """An ephemeral-port listener the requester at ``requester_host`` can reach."""
    ip = ipaddress.ip_address(requester_host)
    # Over the network: every address of the family (the hello guards the port).
    wildcard = "::" if ip.version == 6 else "0.0.0.0"  # noqa: S104
    host = requester_host if ip.is_loopback else wildcard
    listeners = await trio.open_tcp_listeners(0, host=host, backlog=8)
    for extra in listeners[1:]:
        await extra.aclose()
    return listeners[0]


def listener_port(listener: trio.SocketListener) -> int:
    port: int = listener.socket.getsockname()[1]
    return port


async def accept_channel(
    listener: trio.SocketListener, keys: DirectKeys, remote: PeerId, *, idle_timeout: float
) -> SealedStream:
    """The first connection to ``listener`` that opens the requester's hello, once ours is
    sent; the others are dropped. Bound it with the caller's deadline: it waits for ever."""
    while True:
        channel = SealedStream(await listener.accept(), keys, remote, idle_timeout=idle_timeout)
        proven = False
        try:
            with trio.fail_after(HELLO_TIMEOUT):
                # The hello's size: an unproven connection makes us buffer no more.
                if await channel.receive_record(limit=_HELLO_LIMIT) != REQUESTER_HELLO:
                    raise RemoteNetworkError(NetReason.BAD_FRAME, "not the requester's hello")
                await channel.send_all(SERVER_HELLO)
            proven = True
            return channel
        except (NetworkError, trio.TooSlowError) as exc:
            logger.info("dropped a direct connection claiming to be %s: %s", remote, exc)
        finally:
            if not proven:
                with trio.CancelScope(shield=True):
                    await channel.aclose()


async def connect_channel(host: str, port: int, keys: DirectKeys, remote: PeerId) -> SealedStream:
    """Dial the channel ``remote`` offered and check its hello, within HELLO_TIMEOUT.

    Raises DialError.
    """
    try:
        with trio.fail_after(HELLO_TIMEOUT):
            channel = SealedStream(await trio.open_tcp_stream(host, port), keys, remote)
            proven = False
            try:
                await channel.send_all(REQUESTER_HELLO)
                if await channel.receive_record(limit=_HELLO_LIMIT) != SERVER_HELLO:
                    raise RemoteNetworkError(NetReason.BAD_FRAME, "not the server's hello")
                proven = True
            finally:
                if not proven:
                    with trio.CancelScope(shield=True):
                        await channel.aclose()
    except (OSError, NetworkError, trio.TooSlowError) as exc:
        raise DialError(
            NetReason.UNREACHABLE, f"no direct channel to {remote} at {host}:{port}: {exc}"
        ) from exc
    return channel
