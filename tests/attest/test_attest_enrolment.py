"""The pure steps of TPM enrolment (attest/enrolment.py), with no TPM and no event loop:
who may sign each message, what it must answer, and admission. The cryptography of the
challenge runs against a real swtpm in tests/node/test_attestor.py."""

from __future__ import annotations

import pytest
from factories import T0, Nonces, key

from attest.credential import Challenge
from attest.enrolment import (
    ENROLMENT_TTL_MS,
    PendingActivation,
    answer_challenge,
    challenge_enrolment,
    check_answer,
    open_challenge,
    open_enrolment,
)
from attest.errors import InvalidEvidence, MalformedEvidence
from attest.errors import Reason as AttestReason
from protocol.admission import ReplayGuard
from protocol.envelope import Signed, seal
from protocol.errors import InvalidMessage, Reason
from protocol.messages import ActivationAnswer, ActivationChallenge, Enrolment

PROVIDER, BUYER, OTHER = key("provider"), key("buyer"), key("other")
SECRET = bytes(range(16))


@pytest.fixture
def nonce():
    return Nonces("enrol")


def _seal(signer, payload, nonce, at=T0):
    return seal(signer, payload, nonce=nonce(), issued_ms=at, expires_ms=at + ENROLMENT_TTL_MS)


@pytest.fixture
def enrolment(nonce) -> Signed[Enrolment]:
    payload = Enrolment(ek_certificate=b"cert", ek_public=b"ek", ak_public=b"ak")
    return _seal(PROVIDER, payload, nonce)


def _challenge(enrolment, nonce, signer=BUYER) -> Signed[ActivationChallenge]:
    payload = ActivationChallenge(
        enrolment_id=enrolment.id, credential_blob=b"blob", encrypted_secret=b"seed"
    )
    return _seal(signer, payload, nonce)


@pytest.fixture
def pending(enrolment, nonce) -> PendingActivation:
    credential = Challenge(
        credential_blob=b"blob", encrypted_secret=b"seed", ak_name=b"ak name", secret=SECRET
    )
    return PendingActivation(
        provider=PROVIDER.public_key, message=_challenge(enrolment, nonce), challenge=credential
    )


def _refused(fn, *args, **kwargs):
    with pytest.raises((InvalidMessage, InvalidEvidence, MalformedEvidence)) as info:
        fn(*args, **kwargs)
    return info.value.reason


# -- buyer: the enrolment ------------------------------------------------------------------


def test_buyer_opens_the_enrolment_of_the_provider_it_asked(enrolment):
    opened = open_enrolment(
        enrolment.wire, provider=PROVIDER.public_key, now_ms=T0, guard=ReplayGuard()
    )
    assert opened.payload == enrolment.payload
    assert opened.id == enrolment.id


@pytest.mark.parametrize(
    ("provider", "now_ms", "reason"),
    [
        (OTHER, T0, Reason.WRONG_PARTY),
        (PROVIDER, T0 + ENROLMENT_TTL_MS, Reason.EXPIRED),
        (PROVIDER, T0 - 60_000, Reason.NOT_YET_VALID),
    ],
)
def test_buyer_refuses_an_enrolment(enrolment, provider, now_ms, reason):
    args = {"provider": provider.public_key, "now_ms": now_ms, "guard": ReplayGuard()}
    assert _refused(open_enrolment, enrolment.wire, **args) == reason


def test_an_enrolment_is_not_another_message_type(enrolment, nonce):
    answer = _seal(PROVIDER, ActivationAnswer(challenge_id=enrolment.id, secret=SECRET), nonce)
    args = {"provider": PROVIDER.public_key, "now_ms": T0, "guard": ReplayGuard()}
    assert _refused(open_enrolment, answer.wire, **args) == Reason.WRONG_TYPE


def test_buyer_refuses_an_ek_certificate_that_does_not_parse(enrolment, nonce):
    reason = _refused(
        challenge_enrolment,
        enrolment,
        key=BUYER,
        roots=[],
        now_ms=T0,
        secret=SECRET,
        entropy=bytes(64),
        nonce=nonce(),
    )
    assert reason == AttestReason.MALFORMED


# -- provider: the challenge ---------------------------------------------------------------


def test_provider_opens_a_challenge_to_its_enrolment_from_its_peer(enrolment, nonce):
    challenge = _challenge(enrolment, nonce)
    opened = open_challenge(
        challenge.wire,
        enrolment=enrolment,
        buyer=BUYER.public_key,
        now_ms=T0,
        guard=ReplayGuard(),
    )
    assert opened.payload == challenge.payload


def test_provider_refuses_a_challenge_from_another_peer(enrolment, nonce):
    challenge = _challenge(enrolment, nonce, signer=OTHER)
    args = {"enrolment": enrolment, "buyer": BUYER.public_key, "now_ms": T0}
    reason = _refused(open_challenge, challenge.wire, guard=ReplayGuard(), **args)
    assert reason == Reason.WRONG_PARTY


def test_provider_refuses_a_challenge_to_another_enrolment(enrolment, nonce):
    other = _seal(PROVIDER, enrolment.payload, nonce)
    challenge = _challenge(other, nonce)
    args = {"enrolment": enrolment, "buyer": BUYER.public_key, "now_ms": T0}
    reason = _refused(open_challenge, challenge.wire, guard=ReplayGuard(), **args)
    assert reason == Reason.TERMS_MISMATCH


# -- buyer: the answer ---------------------------------------------------------------------


def _answer(pending, nonce, secret=SECRET, signer=PROVIDER):
    return answer_challenge(signer, pending.message, secret, nonce=nonce(), now_ms=T0)


def test_right_secret_trusts_the_challenged_ak(pending, nonce):
    wire = _answer(pending, nonce).wire
    assert check_answer(pending, wire, now_ms=T0, guard=ReplayGuard()) == b"ak name"


def test_answer_is_refused_when_wrong(pending, nonce):
    guard = ReplayGuard()
    wrong_secret = _answer(pending, nonce, secret=bytes(16)).wire
    by_other = _answer(pending, nonce, signer=OTHER).wire
    to_another = ActivationAnswer(challenge_id=bytes(32), secret=SECRET)
    other_challenge = _seal(PROVIDER, to_another, nonce).wire
    for wire, reason in (
        (wrong_secret, AttestReason.ACTIVATION_FAILED),
        (by_other, Reason.WRONG_PARTY),
        (other_challenge, Reason.TERMS_MISMATCH),
    ):
        assert _refused(check_answer, pending, wire, now_ms=T0, guard=guard) == reason


def test_an_answer_is_admitted_once(pending, nonce):
    guard = ReplayGuard()
    wire = _answer(pending, nonce).wire
    check_answer(pending, wire, now_ms=T0, guard=guard)
    assert _refused(check_answer, pending, wire, now_ms=T0, guard=guard) == Reason.REPLAYED
