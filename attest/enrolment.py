"""TPM enrolment as an exchange of signed messages (spec/attestation.md §3.1).

The pure steps of credential activation between a buyer (verifier) and a provider;
``node/tpm/attestor.py`` carries their bytes over a stream and talks to the TPM::

    provider                                 buyer
    Enrolment (EK cert, EK, AK)      ---->   open_enrolment, challenge_enrolment
                                     <----   ActivationChallenge (secret for that AK)
    open_challenge; the TPM activates
    ActivationAnswer (secret)        ---->   check_answer -> the AK Name, now trusted

Rules:
- Each message is signed by its sender's node key under its own domain
  (``protocol.envelope``) and admitted (time, lifetime, replay) at the receiver's ``now_ms``.
- The buyer takes an Enrolment only from the provider it asked, and an answer only from that
  provider and to its own challenge; the provider answers only the peer it is talking to,
  and only a challenge for the Enrolment it sent that peer.
- Activation proves that the AK and the certified EK sit in one TPM, not that the TPM is
  the peer's: a provider could relay another provider's TPM. The quote binding (§2) closes
  that gap: a quote verifies only when bound to the provider's own key, so a provider MUST
  NOT quote qualifying data it did not compute itself.
- Pure: time, randomness (``secret``, ``entropy``) and nonces come in as arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from attest.credential import Challenge, check_activation, make_challenge
from protocol.admission import AdmissionPolicy, ReplayGuard, admit
from protocol.envelope import Signed, open_signed, seal
from protocol.errors import InvalidMessage, Reason
from protocol.identity import PrivateKey, PublicKey
from protocol.messages import ActivationAnswer, ActivationChallenge, Enrolment

__all__ = [
    "DEFAULT_POLICY",
    "ENROLMENT_TTL_MS",
    "SECRET_SIZE",
    "PendingActivation",
    "answer_challenge",
    "challenge_enrolment",
    "check_answer",
    "open_challenge",
    "open_enrolment",
]

ENROLMENT_TTL_MS = 60_000  # each message lives one minute: the exchange is live
SECRET_SIZE = 16  # fits every EK name algorithm (MakeCredential allows up to its digest size)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
DEFAULT_POLICY = AdmissionPolicy()


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingActivation:
    """What the buyer keeps between sending its challenge and the answer."""

    provider: PublicKey
    message: Signed[ActivationChallenge]
    challenge: Challenge  # holds the secret and the AK Name


def _from(msg: Signed[Any], expected: PublicKey, what: str) -> None:
    if msg.signer != expected:
        raise InvalidMessage(
            Reason.WRONG_PARTY, f"{what} is signed by {msg.signer.peer_id}, not {expected.peer_id}"
        )


def open_enrolment(
    wire: bytes,
    *,
    provider: PublicKey,
    now_ms: int,
    guard: ReplayGuard,
    policy: AdmissionPolicy = DEFAULT_POLICY,
) -> Signed[Enrolment]:
    """Buyer: open the provider's Enrolment.

    Raises DecodeError, InvalidMessage (WRONG_PARTY when ``provider`` did not sign it, or an
    admission reason).
    """
    enrolment: Signed[Enrolment] = open_signed(wire, Enrolment)
    _from(enrolment, provider, "the enrolment")
    admit(enrolment, now_ms, guard, policy)
    return enrolment


def challenge_enrolment(
    enrolment: Signed[Enrolment],
    *,
    key: PrivateKey,
    roots: Sequence[bytes],
    intermediates: Sequence[bytes] = (),
    now_ms: int,
    secret: bytes,
    entropy: bytes,
    nonce: bytes,
) -> PendingActivation:
    """Buyer: check the EK certificate and the AK, and sign a challenge for them.

    ``secret`` (:data:`SECRET_SIZE` fresh random bytes), ``entropy`` (64) and ``nonce`` (16)
    come from the caller; the certificate chain is checked at ``now_ms``. Raises
    MalformedEvidence, InvalidEvidence (UNTRUSTED_CHAIN, CERTIFICATE_MISMATCH,
    KEY_ATTRIBUTES): see :func:`attest.credential.make_challenge`.
    """
    payload = enrolment.payload
    challenge = make_challenge(
        ek_certificate=payload.ek_certificate,
        ek_public=payload.ek_public,
        ak_public=payload.ak_public,
        roots=roots,
        intermediates=[*intermediates, *payload.ek_intermediates],
        at=_EPOCH + timedelta(milliseconds=now_ms),
        secret=secret,
        entropy=entropy,
    )
    message = seal(
        key,
        ActivationChallenge(
            enrolment_id=enrolment.id,
            credential_blob=challenge.credential_blob,
            encrypted_secret=challenge.encrypted_secret,
        ),
        nonce=nonce,
        issued_ms=now_ms,
        expires_ms=now_ms + ENROLMENT_TTL_MS,
    )
    return PendingActivation(provider=enrolment.signer, message=message, challenge=challenge)


def open_challenge(
    wire: bytes,
    *,
    enrolment: Signed[Enrolment],
    buyer: PublicKey,
    now_ms: int,
    guard: ReplayGuard,
    policy: AdmissionPolicy = DEFAULT_POLICY,
) -> Signed[ActivationChallenge]:
    """Provider: open the buyer's challenge to the Enrolment it sent ``buyer``.

    Raises DecodeError, InvalidMessage (WRONG_PARTY when ``buyer`` did not sign it,
    TERMS_MISMATCH when it names another enrolment, or an admission reason).
    """
    challenge: Signed[ActivationChallenge] = open_signed(wire, ActivationChallenge)
    _from(challenge, buyer, "the activation challenge")
    if challenge.payload.enrolment_id != enrolment.id:
        raise InvalidMessage(
            Reason.TERMS_MISMATCH, "the activation challenge names another enrolment"
        )
    admit(challenge, now_ms, guard, policy)
    return challenge


def answer_challenge(
    key: PrivateKey,
    challenge: Signed[ActivationChallenge],
    secret: bytes,
    *,
    nonce: bytes,
    now_ms: int,
) -> Signed[ActivationAnswer]:
    """Provider: sign the secret the TPM recovered from ``challenge``."""
    return seal(
        key,
        ActivationAnswer(challenge_id=challenge.id, secret=secret),
        nonce=nonce,
        issued_ms=now_ms,
        expires_ms=now_ms + ENROLMENT_TTL_MS,
    )


def check_answer(
    pending: PendingActivation,
    wire: bytes,
    *,
    now_ms: int,
    guard: ReplayGuard,
    policy: AdmissionPolicy = DEFAULT_POLICY,
) -> bytes:
    """Buyer: return the Name of the AK that is now trusted for ``pending.provider``.

    Raises DecodeError, InvalidMessage (WRONG_PARTY, TERMS_MISMATCH when it answers another
    challenge, or an admission reason), InvalidEvidence(ACTIVATION_FAILED) for a wrong
    secret: the AK is not in the TPM the EK certificate names.
    """
    answer: Signed[ActivationAnswer] = open_signed(wire, ActivationAnswer)
    _from(answer, pending.provider, "the activation answer")
    if answer.payload.challenge_id != pending.message.id:
        raise InvalidMessage(Reason.TERMS_MISMATCH, "the activation answer is to another challenge")
    admit(answer, now_ms, guard, policy)
    return check_activation(pending.challenge, answer.payload.secret)
