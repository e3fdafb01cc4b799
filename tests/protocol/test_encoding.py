from __future__ import annotations

import pytest

from protocol.encoding import decode, encode
from protocol.errors import DecodeError, Reason


def test_round_trip_sorts_keys():
    data = encode({"b": 1, "a": [b"x", "y", True]})
    assert decode(data) == {"a": [b"x", "y", True], "b": 1}
    assert data == bytes.fromhex("82a161 93c40178a179c3 a16201".replace(" ", ""))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", Reason.TRUNCATED),
        (b"\x01\x02", Reason.TRAILING_BYTES),
        (b"\xcc\x01", Reason.NON_CANONICAL),
        (b"\x82\xa1b\x01\xa1a\x01", Reason.NON_CANONICAL),
        (b"\x82\xa1a\x01\xa1a\x02", Reason.DUPLICATE_KEY),
        (b"\xca\x00\x00\x00\x00", Reason.FORBIDDEN_TYPE),
        (b"\xc0", Reason.FORBIDDEN_TYPE),
        (b"\xd6\xff\x00\x00\x00\x01", Reason.FORBIDDEN_TYPE),
        (b"\x81\x01\x02", Reason.NON_STRING_KEY),
        (b"\xa2\xff\xfe", Reason.INVALID_UTF8),
        (b"\xc1", Reason.MALFORMED),
        (b"\x91" * 40 + b"\x01", Reason.TOO_DEEP),
    ],
)
def test_rejects_with_reason(data, reason):
    with pytest.raises(DecodeError) as info:
        decode(data)
    assert info.value.reason is reason
