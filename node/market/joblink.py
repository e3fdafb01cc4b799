"""``/cx/job/1`` and ``/cx/negotiate/1`` streams kept open and reused (spec/peer.md
rules 8 and 9).

Opening a libp2p stream costs a multistream-select exchange on top of the message's own
round trip, and its Noise and yamux frames cost both nodes CPU (about 5 ms a stream in
py-libp2p, bench/latency.py). A job's messages therefore share one stream, and
:class:`JobLinks` keeps the streams to each peer open after a job ends, for the next
job's messages, the receipt summary the provider asks for after settling
(spec/reputation.md rule 6) and, on the buyer's side, the next proposal, instead of
opening three streams per job. A stream idle for ``IDLE_S`` is closed. A peer that
answers one frame per stream and closes (or a stream that broke) costs one retry of the
first question on a fresh stream: each side takes repeats of a status, receipt, summary
or proposal it has already answered as such, so resending is safe.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import trio

from node.net.transport import (
    FramedStream,
    NetReason,
    Network,
    NetworkError,
    PeerId,
    ProtocolId,
    RemoteNetworkError,
)
from node.net.wire import JOB

__all__ = ["JobLink", "JobLinks"]

CLOSE_S = 1.0  # the most a close may take: a stream to a vanished peer never confirms
IDLE_S = 10.0  # an unused stream is closed after this long
MAX_IDLE = 8  # unused streams kept per peer (one per job that ran at the same time)


class JobLink:
    """Ask ``peer`` on one stream, opened at the first question and again when it failed."""

    __slots__ = ("_net", "_protocol", "_stream", "peer")

    def __init__(self, net: Network, peer: PeerId, protocol: ProtocolId = JOB) -> None:
        self._net = net
        self.peer = peer
        self._protocol = protocol
        self._stream: FramedStream | None = None

    @property
    def stream(self) -> FramedStream | None:
        """The stream the last ask went on, for exchanges of more than one answer."""
        return self._stream

    @property
    def open(self) -> bool:
        """Whether a stream is open (the last ask neither failed nor found it closed)."""
        return self._stream is not None

    async def ask(self, frame: bytes, *, retry: bool = True) -> bytes:
        """Send one frame, return the frame that answers it; on a stream that turns out
        closed, again on a fresh one unless ``retry`` is False (a frame that continues an
        exchange begun on this stream). Raises NetworkError (bound it with
        ``trio.fail_after``)."""
        if self._stream is not None:
            try:
                return await self._exchange(frame)
            except NetworkError:
                if not retry:
                    raise
                # closed after its answer by the peer, or broken: try a fresh one
        self._stream = FramedStream(await self._net.open_stream(self.peer, self._protocol))
        return await self._exchange(frame)

    async def _exchange(self, frame: bytes) -> bytes:
        assert self._stream is not None
        try:
            await self._stream.send_frame(frame)
            answer = await self._stream.receive_frame()
            if answer is None:
                raise RemoteNetworkError(NetReason.CLOSED, f"{self.peer} closed {self._protocol}")
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


class JobLinks:
    """This node's open streams of one protocol, lent one job (or one ask) at a time."""

    __slots__ = ("_idle", "_net", "_protocol")

    def __init__(self, net: Network, protocol: ProtocolId = JOB) -> None:
        self._net = net
        self._protocol = protocol
        self._idle: dict[PeerId, list[tuple[float, JobLink]]] = {}  # (idle since, link)

    @contextlib.asynccontextmanager
    async def borrow(self, peer: PeerId) -> AsyncIterator[JobLink]:
        """A link to ``peer``, its stream open already when one is idle; kept for the next
        borrower afterwards while its stream is open."""
        idle = self._idle.get(peer)
        link = idle.pop()[1] if idle else JobLink(self._net, peer, self._protocol)
        try:
            yield link
        except BaseException:
            await link.aclose()
            raise
        if not link.open:
            return
        idle = self._idle.setdefault(peer, [])
        idle.append((trio.current_time(), link))
        if len(idle) > MAX_IDLE:
            await idle.pop(0)[1].aclose()

    async def run(self) -> None:
        """Close the streams left unused for ``IDLE_S``; until cancelled."""
        try:
            while True:
                await trio.sleep(IDLE_S / 2)
                stale = trio.current_time() - IDLE_S
                for peer, idle in list(self._idle.items()):
                    keep = [(since, link) for since, link in idle if since > stale]
                    self._idle[peer] = keep
                    if not keep:
                        del self._idle[peer]
                    for since, link in idle:
                        if since <= stale:
                            await link.aclose()
        finally:
            # Taken out first: a job that ends while these close puts its link back.
            left = [link for idle in self._idle.values() for _, link in idle]
            self._idle.clear()
            with trio.CancelScope(shield=True):
                for link in left:
                    await link.aclose()
