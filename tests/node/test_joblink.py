"""A job's messages share one /cx/job/1 stream (node/market/joblink.py), and a buyer that
answers one frame per stream still gets every message."""

from __future__ import annotations

import pytest
import trio

from node.market.joblink import IDLE_S, JobLink, JobLinks
from node.net.memnet import MemoryHub, serve_memory_network
from node.net.transport import FramedStream, NetworkError, PeerId, Stream
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


async def test_the_next_job_reuses_an_idle_stream_and_idle_streams_are_closed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    opened = closed = 0

    async def buyer_side(raw: Stream) -> None:
        nonlocal opened, closed
        opened += 1
        stream = FramedStream(raw)
        while frame := await stream.receive_frame():
            await stream.send_frame(b"ok " + frame)
        closed += 1

    hub = MemoryHub()
    async with trio.open_nursery() as nursery:
        provider = await nursery.start(serve_memory_network, hub, PeerId("provider"))
        buyer = await nursery.start(serve_memory_network, hub, PeerId("buyer"))
        buyer.serve(JOB, buyer_side)
        await provider.connect(buyer.listen_addrs[0])
        links = JobLinks(provider)
        for message in MESSAGES:  # one job after another: one stream
            async with links.borrow(PeerId("buyer")) as link:
                assert await link.ask(message) == b"ok " + message
        assert (opened, closed) == (1, 0)
        async with (  # two at once: one more
            links.borrow(PeerId("buyer")) as first,
            links.borrow(PeerId("buyer")) as second,
        ):
            assert await first.ask(b"a") == b"ok a"
            assert await second.ask(b"b") == b"ok b"
        assert (opened, closed) == (2, 0)
        nursery.start_soon(links.run)
        await trio.sleep(IDLE_S * 2)  # unused since: both are closed
        assert (opened, closed) == (2, 2)
        nursery.cancel_scope.cancel()


async def test_a_frame_that_continues_an_exchange_is_not_sent_again_on_a_fresh_stream() -> None:
    async def one_answer(raw: Stream) -> None:  # answers one frame, then closes
        stream = FramedStream(raw)
        if frame := await stream.receive_frame():
            await stream.send_frame(b"ok " + frame)

    hub = MemoryHub()
    async with trio.open_nursery() as nursery:
        provider = await nursery.start(serve_memory_network, hub, PeerId("provider"))
        buyer = await nursery.start(serve_memory_network, hub, PeerId("buyer"))
        buyer.serve(JOB, one_answer)
        await provider.connect(buyer.listen_addrs[0])
        link = JobLink(provider, PeerId("buyer"))
        with trio.fail_after(10):
            assert await link.ask(b"proposal") == b"ok proposal"
            with pytest.raises(NetworkError):
                await link.ask(b"agreement", retry=False)
            assert not link.open
            assert await link.ask(b"next proposal") == b"ok next proposal"
        nursery.cancel_scope.cancel()
