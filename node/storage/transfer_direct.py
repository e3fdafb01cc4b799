"""The server's half of ``/cx/blob/1`` direct channels (spec/content.md, "Direct channel").

Rules:
- A requester asks on an authenticated ``/cx/blob/1`` stream (``{"op": "direct", ...}``,
  protocol/direct.py). The server answers ``ok`` and its offer, listens on an ephemeral
  port for :data:`ACCEPT_TIMEOUT`, and serves the ``/cx/blob/1`` request loop over the
  first connection that proves the negotiated key (node/net/direct.py); then the stream
  ends. The listener is closed as soon as that connection is in, or the time is up.
- Bounded: at most :data:`MAX_CHANNELS` channels (offered or open) at once, and
  :data:`MAX_PER_PEER` per peer; a channel with no request or reply moving for
  :data:`IDLE_TIMEOUT` is dropped. Past a bound, or when the stream has no direct TCP path
  (relayed, in memory), the answer is the error ``no-direct`` and the requester keeps to
  libp2p streams, as it does with a server that predates direct channels (``bad-request``).
"""

from __future__ import annotations

import logging
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable

import trio

from node.net.direct import (
    SealedFramedStream,
    SealedStream,
    accept_channel,
    listener_port,
    open_listener,
)
from node.net.transport import FramedStream, PeerId
from protocol.direct import NONCE_SIZE, DirectOffer, derive_keys
from protocol.encoding import encode

__all__ = [
    "ACCEPT_TIMEOUT",
    "IDLE_TIMEOUT",
    "MAX_CHANNELS",
    "MAX_PER_PEER",
    "DirectServer",
]

logger = logging.getLogger(__name__)

MAX_CHANNELS = 32
MAX_PER_PEER = 8  # several fetches by one peer at once (transfer.STREAMS_PER_PEER each)
ACCEPT_TIMEOUT = 10.0  # seconds for the requester to connect and prove the key
IDLE_TIMEOUT = 60.0  # seconds a channel may wait for a request or a send may block

ServeLoop = Callable[[FramedStream], Awaitable[None]]
"""Serves ``/cx/blob/1`` requests on a framed stream until it ends."""


class DirectServer:
    """One node's direct channels: their bounds, and the serving of each."""

    def __init__(
        self,
        local: PeerId,
        serve: ServeLoop,
        *,
        max_frame: int,
        counts: Counter[tuple[str, str]],
    ) -> None:
        self.local, self._serve, self._max_frame = local, serve, max_frame
        self._open: Counter[PeerId] = Counter()
        # ("server", "opened" or "refused") since the start, opened once the requester
        # proved the key: /metrics shows them (BlobStore.direct_channels)
        self.counts = counts

    def _admit(self, peer: PeerId) -> bool:
        if self._open.total() >= MAX_CHANNELS or self._open[peer] >= MAX_PER_PEER:
            return False
        self._open[peer] += 1
        return True

    def _release(self, peer: PeerId) -> None:
        self._open[peer] -= 1
        if not self._open[peer]:
            del self._open[peer]

    async def serve(self, framed: FramedStream, requester_nonce: bytes) -> None:
        """Answer one direct request on ``framed`` and serve the channel, if one opens.

        Raises NetworkError if the stream fails while answering.
        """
        peer, host = framed.stream.remote_peer, framed.stream.remote_host
        if host is None or not self._admit(peer):
            why = "no direct TCP path" if host is None else "too many direct channels"
            self.counts["server", "refused"] += 1
            await _refuse(framed, why)
            return
        try:
            await self._offer_and_serve(framed, requester_nonce, peer, host)
        finally:
            self._release(peer)

    async def _offer_and_serve(
        self, framed: FramedStream, requester_nonce: bytes, peer: PeerId, host: str
    ) -> None:
        nonce = secrets.token_bytes(NONCE_SIZE)
        keys = derive_keys(requester_nonce, nonce, peer, self.local, we_request=False)
        try:
            listener = await open_listener(host)
        except (OSError, ValueError) as exc:  # no port left, too many files, an odd address
            logger.warning("cannot listen for a direct channel to %s at %s: %s", peer, host, exc)
            self.counts["server", "refused"] += 1
            await _refuse(framed, "cannot listen")
            return
        channel: SealedStream | None = None
        try:
            offer = DirectOffer(nonce=nonce, port=listener_port(listener))
            await framed.send_frame(encode({"ok": True}))
            await framed.send_frame(offer.encode())
            with trio.move_on_after(ACCEPT_TIMEOUT):
                channel = await accept_channel(listener, keys, peer, idle_timeout=IDLE_TIMEOUT)
        except OSError as exc:  # accept failed (out of file descriptors): no channel
            logger.warning("direct channel to %s not accepted: %s", peer, exc)
        finally:
            await listener.aclose()
        if channel is None:
            logger.info("%s did not open the direct channel it asked for", peer)
            return
        self.counts["server", "opened"] += 1
        try:
            await self._serve(SealedFramedStream(channel, max_frame=self._max_frame))
        finally:
            await channel.aclose()


async def _refuse(framed: FramedStream, why: str) -> None:
    await framed.send_frame(encode({"error": "no-direct", "message": why}))
