"""A job's messages share one /cx/job/1 stream (node/market/joblink.py), and a buyer that
answers one frame per stream still gets every message."""

from __future__ import annotations

import pytest
import trio

from node.market.joblink import JobLink
from node.net.memnet import MemoryHub, serve_memory_network
from node.net.transport import FramedStream, PeerId, Stream
from node.net.wire import JOB

MESSAGES = (b"transferring", b"running", b"receipt")


@pytest.mark.parametrize(
    ("frames_per_stream", "streams_opened"),
    [(None, 1), (1, 3)],  # a buyer that answers each in turn; one that closes after each
)
async def test_a_jobs_messages_are_each_answered_on_as_few_streams_as_the_buyer_keeps(
    frames_per_stream: int | None, streams_opened: int
) -> None:
    streams = 0

    async def buyer_side(raw: Stream) -> None:
        nonlocal streams
        streams += 1
        stream = FramedStream(raw)
        answered = 0
        while answered != frames_per_stream and (frame := await stream.receive_frame()):
            await stream.send_frame(b"ok " + frame)
            answered += 1

    hub = MemoryHub()
    async with trio.open_nursery() as nursery:
        provider = await nursery.start(serve_memory_network, hub, PeerId("provider"))
        buyer = await nursery.start(serve_memory_network, hub, PeerId("buyer"))
        buyer.serve(JOB, buyer_side)
        await provider.connect(buyer.listen_addrs[0])
        link = JobLink(provider, PeerId("buyer"))
        with trio.fail_after(10):
            answers = [await link.ask(message) for message in MESSAGES]
            await link.aclose()
        nursery.cancel_scope.cancel()
    assert answers == [b"ok " + message for message in MESSAGES]
    assert streams == streams_opened
