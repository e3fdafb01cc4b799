"""Stopping a job that has been agreed (spec/peer.md rule 13): the buyer asks on
``/cx/stop/1``, the provider stops the container (SIGTERM, or the job's declared checkpoint
signal and grace, then SIGKILL) and its receipt has exit reason ``stopped``: the buyer pays
for the time used (spec/settlement.md), and does not bid for the job again.

The two halves: :func:`ask_stop` (the buyer's) and :func:`answer_stop` (the provider's, over
whatever it holds of its running jobs).
"""

from __future__ import annotations

from collections.abc import Callable

from node.net.transport import FramedStream, Network, PeerId, Stream
from node.net.wire import STOP, control, read_control, request

__all__ = ["NOT_RUNNING", "answer_stop", "ask_stop", "not_running"]

NOT_RUNNING = "not-running"  # the refusal: no such job of yours is agreed or running here


def not_running() -> bytes:
    """The refusal frame of /cx/stop/1 and /cx/logs/1."""
    return control(error=NOT_RUNNING, detail="no job of yours under that agreement runs here")


async def ask_stop(net: Network, provider: PeerId, agreement_id: bytes) -> None:
    """Ask ``provider`` to stop the job of ``agreement_id``.

    Raises:
        PeerRefused: it refused (``not-running``: it has ended, or was never ours).
        NetworkError: the provider could not be reached.
    """
    read_control(await request(net, provider, STOP, control(agreement=agreement_id)))


async def answer_stop(raw: Stream, stop: Callable[[bytes, PeerId], bool]) -> None:
    """Serve one ``/cx/stop/1`` stream: ``stop(agreement_id, asking_peer)`` stops the job if
    it is the asking buyer's and not over, and says whether it did."""
    stream = FramedStream(raw)
    asked = read_control(await stream.receive_frame())
    agreement_id = asked.get("agreement")
    if isinstance(agreement_id, bytes) and stop(agreement_id, raw.remote_peer):
        await stream.send_frame(control(ok=True))
    else:
        await stream.send_frame(not_running())
