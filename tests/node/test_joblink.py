"""A job's messages share one /cx/job/1 stream (node/market/joblink.py), a buyer that
answers one frame per stream still gets every message, and streams are kept for the next
job until they have been idle too long."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from node.market.joblink import IDLE_S, JobLink, JobLinks
from node.net.memnet import MemoryHub, serve_memory_network
from node.net.transport import FramedStream, Network, NetworkError, PeerId, Stream
from node.net.wire import JOB

MESSAGES = (b"transferring", b"running", b"receipt")
BUYER = PeerId("buyer")


@asynccontextmanager
async def provider_of(buyer_side: Callable[[Stream], Awaitable[None]]) -> AsyncIterator[Network]:
    """A provider's network, connected to a buyer that serves /cx/job/1 with ``buyer_side``."""
    hub = MemoryHub()
    async with trio.open_nursery() as nursery:
        provider = await nursery.start(serve_memory_network, hub, PeerId("provider"))
        buyer = await nursery.start(serve_memory_network, hub, BUYER)
        buyer.serve(JOB, buyer_side)
        await provider.connect(buyer.listen_addrs[0])
        yield provider
        nursery.cancel_scope.cancel()


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

    async with provider_of(buyer_side) as provider:
        link = JobLink(provider, BUYER)
        with trio.fail_after(10):
            answers = [await link.ask(message) for message in MESSAGES]
            await link.aclose()
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

    async with provider_of(buyer_side) as provider, trio.open_nursery() as nursery:
        links = JobLinks(provider)
        for message in MESSAGES:  # one job after another: one stream
            async with links.borrow(BUYER) as link:
                assert await link.ask(message) == b"ok " + message
        assert (opened, closed) == (1, 0)
        async with links.borrow(BUYER) as first, links.borrow(BUYER) as second:  # one more
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

    async with provider_of(one_answer) as provider:
        link = JobLink(provider, BUYER)
        with trio.fail_after(10):
            assert await link.ask(b"proposal") == b"ok proposal"
            with pytest.raises(NetworkError):
                await link.ask(b"agreement", retry=False)
            assert not link.open
            assert await link.ask(b"next proposal") == b"ok next proposal"
