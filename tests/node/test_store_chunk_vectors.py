"""Every vector in spec/vectors/content/ (format: spec/content.md, "Vectors")."""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.content import CHUNK_SIZE, ChunkManifest, decode_manifest
from protocol.errors import DecodeError, InvalidMessage, ProtocolError

VECTORS = json.loads(
    (Path(__file__).parents[2] / "spec/vectors/content/manifests.json").read_text()
)


def pattern(n: int) -> bytes:
    return bytes(i % 251 for i in range(n))


@pytest.mark.parametrize("case", VECTORS["valid"], ids=lambda c: c["name"])
def test_valid_manifest(case):
    data = pattern(case["size"])
    m = ChunkManifest.of(data)
    assert m.blob == case["blob"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert [c.hex() for c in m.chunks] == case["chunks"]
    assert m.encode().hex() == case["manifest"]
    assert m.digest() == case["manifest_digest"]
    decoded = decode_manifest(bytes.fromhex(case["manifest"]))
    assert decoded == m
    for i in range(len(m.chunks)):
        offset, length = m.span(i)
        m.verify_chunk(i, data[offset : offset + length])


@pytest.mark.parametrize("case", VECTORS["invalid"], ids=lambda c: c["name"])
def test_invalid_manifest(case):
    with pytest.raises(ProtocolError) as info:
        decode_manifest(bytes.fromhex(case["manifest"]))
    assert info.value.reason.value == case["reason"]


def test_chunk_that_does_not_match_is_refused():
    data = pattern(CHUNK_SIZE + 10)
    m = ChunkManifest.of(data)
    with pytest.raises(InvalidMessage):
        m.verify_chunk(1, b"x" * 10)
    with pytest.raises(InvalidMessage):
        m.verify_chunk(1, data[CHUNK_SIZE:] + b"!")
    with pytest.raises(IndexError):
        m.span(2)


@given(st.binary(max_size=2000))
def test_arbitrary_bytes_raise_only_protocol_errors(data):
    with contextlib.suppress(DecodeError, InvalidMessage):
        decode_manifest(data)


@given(st.binary(max_size=5000))
def test_round_trip(data):
    m = ChunkManifest.of(data)
    assert decode_manifest(m.encode()) == m
