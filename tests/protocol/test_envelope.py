from __future__ import annotations

import pytest
from factories import HOUR_MS, T0, Nonces, bid, key, offer

from protocol.admission import ReplayGuard, admit
from protocol.envelope import open_signed, seal
from protocol.errors import DecodeError, InvalidMessage, Reason
from protocol.identity import PrivateKey, PublicKey
from protocol.messages import Bid, Offer


@pytest.fixture
def signed_offer():
    return seal(key("p"), offer(), nonce=Nonces()(), issued_ms=T0, expires_ms=T0 + HOUR_MS)


def test_peer_id_is_libp2p_form_and_round_trips():
    k = key("p")
    assert k.peer_id.startswith("12D3KooW")
    assert PublicKey.from_peer_id(k.peer_id) == k.public_key
    assert PrivateKey.from_libp2p_bytes(k.to_libp2p_bytes()).peer_id == k.peer_id


def test_open_returns_the_payload_and_keeps_the_bytes(signed_offer):
    opened = open_signed(signed_offer.wire, Offer)
    assert opened.payload == offer()
    assert opened.wire == signed_offer.wire
    assert opened.id == signed_offer.id


def test_every_flipped_bit_of_the_signature_or_body_is_refused(signed_offer):
    wire = signed_offer.wire
    for index in range(0, len(wire), 7):
        tampered = bytearray(wire)
        tampered[index] ^= 0x01
        with pytest.raises((DecodeError, InvalidMessage)):
            open_signed(bytes(tampered))


def test_wrong_type_is_refused(signed_offer):
    with pytest.raises(InvalidMessage) as info:
        open_signed(signed_offer.wire, Bid)
    assert info.value.reason is Reason.WRONG_TYPE


def test_signature_from_another_type_domain_does_not_verify():
    k = key("p")
    as_offer = seal(k, offer(), nonce=bytes(16), issued_ms=T0, expires_ms=T0 + 1)
    as_bid = seal(k, bid(), nonce=bytes(16), issued_ms=T0, expires_ms=T0 + 1)
    spliced = as_offer.wire[:64] + as_bid.wire[64:]
    with pytest.raises(InvalidMessage) as info:
        open_signed(spliced)
    assert info.value.reason is Reason.BAD_SIGNATURE


@pytest.mark.parametrize(
    ("now", "reason"),
    [
        (T0 + HOUR_MS, Reason.EXPIRED),
        (T0 - 60_000, Reason.NOT_YET_VALID),
    ],
)
def test_admission_checks_time(signed_offer, now, reason):
    with pytest.raises(InvalidMessage) as info:
        admit(signed_offer, now, ReplayGuard())
    assert info.value.reason is reason


def test_admission_refuses_replays_until_expiry(signed_offer):
    guard = ReplayGuard()
    admit(signed_offer, T0, guard)
    with pytest.raises(InvalidMessage) as info:
        admit(signed_offer, T0 + 1, guard)
    assert info.value.reason is Reason.REPLAYED
    guard.forget_expired(T0 + HOUR_MS)
    assert len(guard) == 0


def test_admission_refuses_overlong_lifetimes():
    msg = seal(key("p"), offer(), nonce=bytes(16), issued_ms=T0, expires_ms=T0 + 48 * HOUR_MS)
    with pytest.raises(InvalidMessage) as info:
        admit(msg, T0, ReplayGuard())
    assert info.value.reason is Reason.TTL_TOO_LONG
