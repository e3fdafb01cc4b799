"""What peers say to each other beyond gossip: topic names, stream protocols, control frames.

spec/peer.md is the reference. Every stream carries length-prefixed frames
(:class:`~node.net.transport.FramedStream`); a frame is either the exact bytes of a signed
message (protocol.envelope) or a *control frame*: the canonical encoding of a small map,
such as ``{"ok": true}`` or ``{"error": "<reason>", "detail": "..."}``.
"""

from __future__ import annotations

from typing import Any

from node.net.transport import (
    FramedStream,
    NetReason,
    Network,
    PeerId,
    ProtocolId,
    RemoteNetworkError,
)
from protocol.encoding import decode, encode
from protocol.errors import DecodeError

__all__ = [
    "BIDS_TOPIC",
    "BOOK",
    "HELLO",
    "INVITE",
    "JOB",
    "LOGS",
    "NEGOTIATE",
    "OFFERS_TOPIC",
    "PING",
    "STOP",
    "SUMMARIES",
    "SUMMARIES_TOPIC",
    "SUMMARY",
    "TAPE",
    "TAPE_TOPIC",
    "PeerRefused",
    "control",
    "read_control",
    "request",
]

OFFERS_TOPIC = "cx/offers/1"
BIDS_TOPIC = "cx/bids/1"
TAPE_TOPIC = "cx/tape/1"  # trade prints signed by both parties (protocol/tape.py)
SUMMARIES_TOPIC = "cx/summaries/1"  # receipt summaries, signed by both parties

HELLO = ProtocolId("/cx/hello/1")  # addresses: mine and the peers I know
BOOK = ProtocolId("/cx/book/1")  # the live orders of your book, one frame each
NEGOTIATE = ProtocolId("/cx/negotiate/1")  # proposal, accept/reject, agreement, ack
JOB = ProtocolId("/cx/job/1")  # provider to buyer: a status or a receipt, and its answer
PING = ProtocolId("/cx/ping/1")  # buyer to provider: is my job alive?
INVITE = ProtocolId("/cx/invite/1")  # provider to buyer: an invitation, and its answer
TAPE = ProtocolId("/cx/tape/1")  # the recent trade prints you kept, one frame each
SUMMARY = ProtocolId("/cx/summary/1")  # provider to buyer: sign this receipt's summary too
SUMMARIES = ProtocolId("/cx/summaries/1")  # the receipt summaries you hold, one frame each
STOP = ProtocolId("/cx/stop/1")  # buyer to provider: stop my job (spec/peer.md rule 13)
LOGS = ProtocolId("/cx/logs/1")  # buyer to provider: my job's output so far (rule 14)


class PeerRefused(Exception):
    """The peer answered with an error control frame."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def control(**fields: Any) -> bytes:  # noqa: ANN401 - encodable values
    return encode(fields)


def read_control(frame: bytes | None) -> dict[str, Any]:
    """Decode a control frame; an error frame raises :class:`PeerRefused`.

    Raises RemoteNetworkError if the frame is missing or not a map.
    """
    if frame is None:
        raise RemoteNetworkError(NetReason.CLOSED, "the peer closed the stream without answering")
    try:
        value = decode(frame)
    except DecodeError as exc:
        raise RemoteNetworkError(NetReason.BAD_FRAME, f"bad control frame: {exc}") from exc
    if not isinstance(value, dict):
        raise RemoteNetworkError(NetReason.BAD_FRAME, "a control frame is a map")
    if "error" in value:
        raise PeerRefused(str(value["error"]), str(value.get("detail", "")))
    return value


async def request(net: Network, peer: PeerId, protocol: ProtocolId, frame: bytes) -> bytes:
    """Open a stream, send one frame and return the one frame that answers it.

    Raises NetworkError, also when the peer closes without answering. Bound it with
    ``trio.fail_after``.
    """
    stream = FramedStream(await net.open_stream(peer, protocol))
    try:
        await stream.send_frame(frame)
        answer = await stream.receive_frame()
    finally:
        await stream.aclose()
    if answer is None:
        raise RemoteNetworkError(NetReason.CLOSED, f"{peer} closed {protocol} without answering")
    return answer
