"""Negotiation: proposal -> accept/reject -> agreement (spec/lifecycle.md).

Rules:
- The buyer proposes terms derived from a match, with a fresh 32-byte attestation nonce.
- The provider re-checks the terms against its own offer and either rejects with a reason
  or accepts: the accept carries the provider's signature over the exact terms bytes
  (agreement domain) and, when the terms demand trust, evidence bound to the nonce.
- The buyer verifies the evidence (attest/) and only then signs the same terms bytes: the
  agreement is the terms bytes plus both signatures. Its id is ``sha256(terms bytes)``.
- Timeouts are input events; a machine that saw an illegal event is in ERROR for good.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from types import MappingProxyType

from protocol.book import Match
from protocol.encoding import decode, encode
from protocol.envelope import Signed
from protocol.errors import InvalidMessage, Reason
from protocol.identity import PrivateKey, PublicKey
from protocol.limits import check_limits
from protocol.machine import Machine
from protocol.messages import Offer, Terms
from protocol.schema import bytes_fields, from_value, to_value

__all__ = [
    "AGREEMENT_DOMAIN",
    "Agreement",
    "BuyerEvent",
    "NegotiationState",
    "ProviderEvent",
    "buyer_machine",
    "check_terms_against_offer",
    "provider_machine",
    "sign_terms",
    "terms_bytes",
    "terms_from_match",
    "terms_hash",
]

AGREEMENT_DOMAIN = b"cx/agreement/v1"
ATTESTATION_NONCE_SIZE = 32


class NegotiationState(enum.Enum):
    IDLE = "idle"
    PROPOSED = "proposed"
    ACCEPTED = "accepted"
    AGREED = "agreed"
    REJECTED = "rejected"
    FAILED = "failed"  # evidence did not verify, or the terms were not ours
    TIMED_OUT = "timed-out"
    ERROR = "error"


class BuyerEvent(enum.Enum):
    SEND_PROPOSAL = "send-proposal"
    RECEIVE_ACCEPT = "receive-accept"
    RECEIVE_REJECT = "receive-reject"
    EVIDENCE_VERIFIED = "evidence-verified"
    EVIDENCE_FAILED = "evidence-failed"
    TIMEOUT = "timeout"


class ProviderEvent(enum.Enum):
    RECEIVE_PROPOSAL = "receive-proposal"
    SEND_ACCEPT = "send-accept"
    SEND_REJECT = "send-reject"
    RECEIVE_AGREEMENT = "receive-agreement"
    TIMEOUT = "timeout"


_S = NegotiationState
BUYER_TABLE = MappingProxyType(
    {
        (_S.IDLE, BuyerEvent.SEND_PROPOSAL): _S.PROPOSED,
        (_S.PROPOSED, BuyerEvent.RECEIVE_ACCEPT): _S.ACCEPTED,
        (_S.PROPOSED, BuyerEvent.RECEIVE_REJECT): _S.REJECTED,
        (_S.PROPOSED, BuyerEvent.TIMEOUT): _S.TIMED_OUT,
        (_S.ACCEPTED, BuyerEvent.EVIDENCE_VERIFIED): _S.AGREED,
        (_S.ACCEPTED, BuyerEvent.EVIDENCE_FAILED): _S.FAILED,
        (_S.ACCEPTED, BuyerEvent.TIMEOUT): _S.TIMED_OUT,
    }
)
PROVIDER_TABLE = MappingProxyType(
    {
        (_S.IDLE, ProviderEvent.RECEIVE_PROPOSAL): _S.PROPOSED,
        (_S.PROPOSED, ProviderEvent.SEND_ACCEPT): _S.ACCEPTED,
        (_S.PROPOSED, ProviderEvent.SEND_REJECT): _S.REJECTED,
        (_S.PROPOSED, ProviderEvent.TIMEOUT): _S.TIMED_OUT,
        (_S.ACCEPTED, ProviderEvent.RECEIVE_AGREEMENT): _S.AGREED,
        (_S.ACCEPTED, ProviderEvent.TIMEOUT): _S.TIMED_OUT,
    }
)


def buyer_machine() -> Machine[NegotiationState, BuyerEvent]:
    return Machine(BUYER_TABLE, _S.IDLE, _S.ERROR)


def provider_machine() -> Machine[NegotiationState, ProviderEvent]:
    return Machine(PROVIDER_TABLE, _S.IDLE, _S.ERROR)


def terms_from_match(match: Match, *, attestation_nonce: bytes, created_ms: int) -> Terms:
    bid = match.bid.payload
    return Terms(
        bid_id=match.bid.id,
        offer_id=match.offer.id,
        buyer=match.buyer,
        provider=match.provider,
        job=bid.job,
        resources=match.resources,
        prices=match.prices,
        max_cost=match.max_cost,
        preemptible=bid.preemptible,
        checkpoint=bid.checkpoint,
        trust=bid.constraints.trust,
        attestation_nonce=attestation_nonce,
        created_ms=created_ms,
        elastic=bid.elastic,
    )


def terms_bytes(terms: Terms) -> bytes:
    return encode(to_value(terms))


def terms_hash(terms: Terms) -> bytes:
    """The 32-byte hash evidence binds to (spec/attestation.md)."""
    return hashlib.sha256(terms_bytes(terms)).digest()


def sign_terms(key: PrivateKey, terms: Terms) -> bytes:
    return key.sign(AGREEMENT_DOMAIN, terms_bytes(terms))


def check_terms_against_offer(terms: Terms, offer: Signed[Offer], provider: PublicKey) -> None:
    """What a provider checks before accepting: the terms are for its own live offer, at no
    less than its prices, within its limits, and every limit of the job is within the
    protocol's bounds (protocol.limits), so no bid can make a provider run what it cannot.

    Raises:
        InvalidMessage: WRONG_PARTY, TERMS_MISMATCH or BAD_FIELD.
    """
    if terms.provider != provider.raw or offer.signer != provider:
        raise InvalidMessage(Reason.WRONG_PARTY, "the terms name another provider")
    if terms.offer_id != offer.id:
        raise InvalidMessage(Reason.TERMS_MISMATCH, "the terms name another offer")
    mine = offer.payload
    if not mine.prices.all_at_most(terms.prices, terms.resources):
        raise InvalidMessage(Reason.TERMS_MISMATCH, "the terms pay less than the offer asks")
    if terms.job.wall_ms > mine.max_wall_ms or (terms.job.network and not mine.network):
        raise InvalidMessage(Reason.TERMS_MISMATCH, "the job exceeds the offer's limits")
    if len(terms.attestation_nonce) != ATTESTATION_NONCE_SIZE:
        raise InvalidMessage(Reason.BAD_FIELD, "the attestation nonce must be 32 bytes")
    check_limits(terms.job, terms.resources, terms.checkpoint)


@dataclass(frozen=True, slots=True, kw_only=True)
class Agreement:
    """Terms signed by both parties, over the same bytes."""

    terms: Terms
    terms_bytes: bytes
    buyer_signature: bytes
    provider_signature: bytes

    @property
    def id(self) -> bytes:
        return hashlib.sha256(self.terms_bytes).digest()

    def to_wire(self) -> bytes:
        return encode(
            {
                "terms": self.terms_bytes,
                "buyer_sig": self.buyer_signature,
                "provider_sig": self.provider_signature,
            }
        )

    @classmethod
    def from_wire(cls, data: bytes) -> Agreement:
        """Decode and verify both signatures.

        Raises:
            DecodeError, InvalidMessage (BAD_SIGNATURE, BAD_FIELD, schema reasons).
        """
        raw, buyer_sig, provider_sig = bytes_fields(
            decode(data), ("terms", "buyer_sig", "provider_sig"), "agreement"
        )
        return cls.assemble(from_value(Terms, decode(raw)), buyer_sig, provider_sig)

    @classmethod
    def assemble(cls, terms: Terms, buyer_signature: bytes, provider_signature: bytes) -> Agreement:
        """Build an agreement from its parts, verifying both signatures.

        Raises:
            InvalidMessage: BAD_SIGNATURE or BAD_KEY.
        """
        raw = terms_bytes(terms)
        PublicKey(terms.buyer).verify(AGREEMENT_DOMAIN, raw, buyer_signature)
        PublicKey(terms.provider).verify(AGREEMENT_DOMAIN, raw, provider_signature)
        return cls(
            terms=terms,
            terms_bytes=raw,
            buyer_signature=buyer_signature,
            provider_signature=provider_signature,
        )
