"""A running job's output as it is written (spec/peer.md rule 14): the buyer asks on
``/cx/logs/1`` for its stdout and stderr from byte offsets; the provider answers with what
the job has written since, up to :data:`CHUNK` bytes of each. Once the job has ended, its
receipt names the whole logs and the buyer reads them from its own store.
"""

from __future__ import annotations

from collections.abc import Callable

from node.market.stopping import not_running
from node.net.transport import FramedStream, Network, PeerId, Stream
from node.net.wire import LOGS, control, read_control, request

__all__ = ["CHUNK", "LOG_NAMES", "answer_logs", "ask_logs"]

CHUNK = 64 * 1024  # bytes of each log per answer
LOG_NAMES = ("stdout", "stderr")
Reader = Callable[[bytes, PeerId, str, int], bytes | None]


async def ask_logs(
    net: Network, provider: PeerId, agreement_id: bytes, offsets: tuple[int, int]
) -> tuple[bytes, bytes]:
    """What the job of ``agreement_id`` wrote to stdout and stderr from ``offsets``.

    Raises:
        PeerRefused: ``not-running`` (it has ended, or is not ours).
        NetworkError: the provider could not be reached.
    """
    asked = control(agreement=agreement_id, stdout=offsets[0], stderr=offsets[1])
    answer = read_control(await request(net, provider, LOGS, asked))
    return bytes(answer.get("stdout", b"")), bytes(answer.get("stderr", b""))


async def answer_logs(raw: Stream, read: Reader) -> None:
    """Serve one ``/cx/logs/1`` stream: ``read(agreement_id, asking_peer, name, offset)``
    gives a log's bytes from ``offset`` if the job is the asking buyer's and runs."""
    stream = FramedStream(raw)
    asked = read_control(await stream.receive_frame())
    agreement_id, found = asked.get("agreement"), {}
    for name in LOG_NAMES:
        offset = asked.get(name, 0)
        data = None
        if isinstance(agreement_id, bytes) and isinstance(offset, int) and offset >= 0:
            data = read(agreement_id, raw.remote_peer, name, offset)
        if data is None:
            await stream.send_frame(not_running())
            return
        found[name] = data
    await stream.send_frame(control(**found))
