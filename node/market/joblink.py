"""One ``/cx/job/1`` stream for a job's statuses and receipt (spec/peer.md rule 9).

Opening a libp2p stream costs a multistream-select exchange on top of the message's own
round trip, and under load it is most of the time a status or receipt takes to arrive: a
job's messages therefore share one stream, opened for the first and kept while the job
runs. A buyer that answers one frame per stream and closes (or a stream that broke) costs
one retry on a fresh stream: the buyer takes repeats of a status or receipt it has already
answered as such, so resending is safe.
"""

from __future__ import annotations

import contextlib

import trio

from node.net.transport import (
    FramedStream,
    NetReason,
    Network,
    NetworkError,
    PeerId,
    RemoteNetworkError,
)
from node.net.wire import JOB

__all__ = ["JobLink"]

CLOSE_S = 1.0  # the most a close may take: a stream to a vanished peer never confirms


class JobLink:
    """Ask ``peer`` on one stream, opened at the first question and again when it failed."""

    __slots__ = ("_net", "_stream", "peer")

    def __init__(self, net: Network, peer: PeerId) -> None:
        self._net = net
        self.peer = peer
        self._stream: FramedStream | None = None

    async def ask(self, frame: bytes) -> bytes:
        """Send one frame, return the frame that answers it. Raises NetworkError (bound it
        with ``trio.fail_after``)."""
        if self._stream is not None:
            try:
                return await self._exchange(frame)
            except NetworkError:
                pass  # closed after its answer by the buyer, or broken: try a fresh one
        self._stream = FramedStream(await self._net.open_stream(self.peer, JOB))
        return await self._exchange(frame)

    async def _exchange(self, frame: bytes) -> bytes:
        assert self._stream is not None
        try:
            await self._stream.send_frame(frame)
            answer = await self._stream.receive_frame()
            if answer is None:
                raise RemoteNetworkError(NetReason.CLOSED, f"{self.peer} closed {JOB}")
        except BaseException:
            await self.aclose()
            raise
        return answer

    async def aclose(self) -> None:
        """Close the stream, if open; also when cancelled (bounded: the peer may be gone)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            with trio.move_on_after(CLOSE_S) as bounded, contextlib.suppress(NetworkError):
                bounded.shield = True
                await stream.aclose()
