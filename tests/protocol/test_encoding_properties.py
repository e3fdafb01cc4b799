from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from protocol.encoding import decode, encode
from protocol.errors import DecodeError

scalars = (
    st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.text(max_size=40)
    | st.binary(max_size=40)
    | st.booleans()
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=30,
)


@given(values)
def test_round_trip_is_identity_and_canonical(value):
    data = encode(value)
    assert decode(data) == value
    assert encode(decode(data)) == data


@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_decode_error(data):
    try:
        value = decode(data)
    except DecodeError:
        return
    assert encode(value) == data  # whatever decodes is canonical


@given(values, st.data())
def test_any_single_byte_change_is_rejected_or_canonical(value, data):
    encoded = bytearray(encode(value))
    index = data.draw(st.integers(0, len(encoded) - 1))
    encoded[index] ^= data.draw(st.integers(1, 255))
    try:
        decoded = decode(bytes(encoded))
    except DecodeError:
        return
    assert encode(decoded) == bytes(encoded)
