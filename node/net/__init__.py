"""Networking: the one seam between the node and the peer-to-peer network.

- ``transport``: the :class:`Network` protocol every other subsystem talks to, its error
  tree and :class:`FramedStream`; ``framing``: length-prefixed frames.
- ``wire``: topic names, stream protocol ids and control frames (spec/peer.md).
- ``memnet``: an in-memory :class:`Network` for tests and in-process markets.
- ``p2p``: the libp2p implementation, the only module that imports libp2p. It is not
  re-exported here: importing libp2p costs about 0.7 s, so only the code that starts a
  libp2p host imports ``node.net.p2p``.
"""

from node.net.memnet import MemoryHub, MemoryNetwork, serve_memory_network
from node.net.transport import (
    DialError,
    FramedStream,
    LocalNetworkError,
    NetReason,
    Network,
    NetworkError,
    PeerId,
    ProtocolId,
    RemoteNetworkError,
    Stream,
    StreamClosed,
    Verdict,
)
from node.net.wire import PeerRefused, control, read_control, request

__all__ = [
    "DialError",
    "FramedStream",
    "LocalNetworkError",
    "MemoryHub",
    "MemoryNetwork",
    "NetReason",
    "Network",
    "NetworkError",
    "PeerId",
    "PeerRefused",
    "ProtocolId",
    "RemoteNetworkError",
    "Stream",
    "StreamClosed",
    "Verdict",
    "control",
    "read_control",
    "request",
    "serve_memory_network",
]
