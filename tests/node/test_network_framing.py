"""Frames and bundles (node/framing.py): round trips, caps, and only FramingError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.framing import (
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


def test_oversized_frame_is_refused_from_its_header() -> None:
    decoder = FrameDecoder(max_size=10)
    decoder.feed(encode_frame(b"x" * 11, max_size=100)[:4])  # header only
    with pytest.raises(FramingError):
        decoder.next_frame()
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
