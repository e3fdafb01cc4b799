"""Frames and bundles (node/net/framing.py): round trips, caps, and only FramingError."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.net.framing import (
    FrameDecoder,
    FramingError,
    bundle_size,
    decode_bundle,
    encode_bundle,
    encode_frame,
)

payloads = st.lists(st.binary(max_size=300), max_size=20)


@given(payloads, st.integers(min_value=1, max_value=50))
def test_frames_survive_any_chunking(items: list[bytes], chunk: int) -> None:
    wire = b"".join(encode_frame(p) for p in items)
    decoder = FrameDecoder()
    out: list[bytes] = []
    for start in range(0, len(wire), chunk):
        decoder.feed(wire[start : start + chunk])
        while (frame := decoder.next_frame()) is not None:
            out.append(frame)
    assert out == items
    assert decoder.buffered == 0


@given(payloads, st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=10))
def test_frames_survive_uneven_pieces(items: list[bytes], sizes: list[int]) -> None:
    """Pieces of varying sizes: frames and headers start and end anywhere in them."""
    wire = b"".join(encode_frame(p) for p in items)
    decoder = FrameDecoder()
    out: list[bytes] = []
    start = 0
    for size in itertools.cycle(sizes):
        if start >= len(wire):
            break
        decoder.feed(wire[start : start + size])
        start = min(start + size, len(wire))
        while (frame := decoder.next_frame()) is not None:
            out.append(frame)
        assert decoder.buffered == start - sum(4 + len(p) for p in out)
    assert out == items


def test_large_frame_fed_in_many_small_pieces() -> None:
    """A 4 MiB frame (a blob chunk) in 65,507-byte pieces, as yamux delivers it, then
    1-byte pieces across a header: nothing comes out early, the bytes come out whole."""
    big = bytes(range(256)) * (4 << 12)
    wire = encode_frame(big, max_size=len(big)) + encode_frame(b"next", max_size=len(big))
    decoder = FrameDecoder(max_size=len(big))
    piece = 65507
    cut = 4 + len(big) + 2  # two bytes into the second frame's header
    for start in range(0, cut, piece):
        assert decoder.next_frame() is None
        decoder.feed(wire[start : min(start + piece, cut)])
    assert decoder.buffered == cut
    assert decoder.next_frame() == big
    assert decoder.buffered == 2
    for start in range(cut, len(wire)):
        assert decoder.next_frame() is None
        decoder.feed(wire[start : start + 1])
    assert decoder.next_frame() == b"next"
    assert decoder.next_frame() is None
    assert decoder.buffered == 0


def test_many_frames_in_one_piece() -> None:
    items = [b"%d" % n * (n % 7) for n in range(10_000)]  # empty frames among them
    wire = b"".join(encode_frame(item) for item in items)
    decoder = FrameDecoder()
    decoder.feed(wire + encode_frame(b"partial")[:-1])
    out = []
    while (frame := decoder.next_frame()) is not None:
        out.append(frame)
    assert out == items
    assert decoder.buffered == len(encode_frame(b"partial")) - 1
    decoder.feed(b"l")
    assert decoder.next_frame() == b"partial"
    assert decoder.buffered == 0


def test_mutable_pieces_are_copied() -> None:
    """The decoder keeps what it is fed; a caller may reuse its buffer."""
    piece = bytearray(encode_frame(b"abc"))
    decoder = FrameDecoder()
    decoder.feed(piece[:5])
    decoder.feed(memoryview(piece)[5:])
    piece[4:] = b"xyz"
    assert decoder.next_frame() == b"abc"


def test_oversized_frame_is_refused_from_its_header() -> None:
    decoder = FrameDecoder(max_size=10)
    decoder.feed(encode_frame(b"x" * 11, max_size=100)[:4])  # header only
    with pytest.raises(FramingError):
        decoder.next_frame()
    with pytest.raises(FramingError):
        decoder.next_frame()  # and again: the bad frame is not skipped
    with pytest.raises(FramingError):
        encode_frame(b"x" * 11, max_size=10)


@given(st.lists(st.binary(max_size=200), min_size=1, max_size=30))
def test_bundle_round_trip_and_size(items: list[bytes]) -> None:
    data = encode_bundle(items)
    assert len(data) == bundle_size(len(i) for i in items)
    assert decode_bundle(data) == items


@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_framing_error(data: bytes) -> None:
    try:
        items = decode_bundle(data)
    except FramingError:
        return
    assert encode_bundle(items) == data


def test_empty_bundle_is_invalid() -> None:
    with pytest.raises(FramingError):
        encode_bundle([])
    with pytest.raises(FramingError):
        decode_bundle(b"\x01")
