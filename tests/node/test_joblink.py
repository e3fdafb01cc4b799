"""A job's messages share one /cx/job/1 stream (node/market/joblink.py), and a buyer that
answers one frame per stream still gets every message."""

from __future__ import annotations

import trio

from node.market.joblink import JobLink
from node.net.memnet import MemoryHub, serve_memory_network
from node.net.transport import FramedStream, PeerId, Stream, StreamHandler
from node.net.wire import JOB


async def _pair(nursery: trio.Nursery, handler: StreamHandler) -> JobLink:
    hub = MemoryHub()
    provider = await nursery.start(serve_memory_network, hub, PeerId("provider"))
    buyer = await nursery.start(serve_memory_network, hub, PeerId("buyer"))
    buyer.serve(JOB, handler)
    await provider.connect(buyer.listen_addrs[0])
    return JobLink(provider, PeerId("buyer"))


async def test_a_jobs_messages_go_on_one_stream_each_answered_in_turn() -> None:
    streams = 0

    async def answer_each(raw: Stream) -> None:
        nonlocal streams
        streams += 1
        stream = FramedStream(raw)
        while (frame := await stream.receive_frame()) is not None:
            await stream.send_frame(b"ok " + frame)

    async with trio.open_nursery() as nursery:
        link = await _pair(nursery, answer_each)
        with trio.fail_after(10):
            answers = [await link.ask(m) for m in (b"transferring", b"running", b"receipt")]
            await link.aclose()
        nursery.cancel_scope.cancel()
    assert answers == [b"ok transferring", b"ok running", b"ok receipt"]
    assert streams == 1


async def test_a_buyer_that_closes_after_each_answer_gets_each_message_on_a_new_stream() -> None:
    streams = 0

    async def answer_one(raw: Stream) -> None:  # one frame per stream, as before
        nonlocal streams
        streams += 1
        stream = FramedStream(raw)
        frame = await stream.receive_frame()
        assert frame is not None
        await stream.send_frame(b"ok " + frame)

    async with trio.open_nursery() as nursery:
        link = await _pair(nursery, answer_one)
        with trio.fail_after(10):
            answers = [await link.ask(m) for m in (b"transferring", b"running", b"receipt")]
            await link.aclose()
        nursery.cancel_scope.cancel()
    assert answers == [b"ok transferring", b"ok running", b"ok receipt"]
    assert streams == 3
