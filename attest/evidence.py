"""Evidence containers: what travels in ``protocol.messages.Evidence`` (spec/attestation.md).

Kinds and their ``parts``:

- ``tpm-quote/v1``: ``ak_public`` (TPM2B_PUBLIC or TPMT_PUBLIC), ``quote`` (TPMS_ATTEST),
  ``signature`` (TPMT_SIGNATURE), ``pcrs`` (records of hash alg id u16, PCR index u8, value;
  strictly ascending by (alg, index)).
- ``sev-snp-report/v1``: ``report`` (1184 raw bytes), ``vcek`` (DER), ``chain`` (PEM, ASK
  then ARK).

Rules:
- Parts are exactly the listed keys; a missing or extra key is ``malformed``.
- :func:`verify_evidence` checks the kind against the requirement first, then the evidence
  and its binding to (provider key, nonce, terms hash), then the requirement; it returns the
  facts the agreement records (:func:`to_record` gives their JSON-able form).
- Pure: time comes in as an argument.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from collections.abc import Collection, Mapping
from datetime import datetime

from attest.binding import snp_report_data, tpm_qualifying_data
from attest.errors import InvalidEvidence, MalformedEvidence, PolicyViolation, Reason
from attest.policy import check_requirement
from attest.snp import SnpFacts, SnpPolicy, verify_report
from attest.snp_certs import PINNED_ARKS, Product, load_vcek_chain
from attest.tpm import QuoteFacts, load_attestation_key, verify_quote
from attest.tpm_structs import Alg, hash_name, hash_size
from protocol.messages import Evidence, TrustLevel, TrustRequirement

__all__ = [
    "SNP_KIND",
    "TPM_KIND",
    "decode_pcrs",
    "encode_pcrs",
    "snp_evidence",
    "to_record",
    "tpm_evidence",
    "verify_evidence",
]

TPM_KIND = "tpm-quote/v1"
SNP_KIND = "sev-snp-report/v1"
_TPM_PARTS = frozenset({"ak_public", "quote", "signature", "pcrs"})
_SNP_PARTS = frozenset({"report", "vcek", "chain"})
_BANKS = {hash_name(a): a for a in (Alg.SHA1, Alg.SHA256, Alg.SHA384, Alg.SHA512)}


def encode_pcrs(pcrs: Mapping[str, Mapping[int, bytes]]) -> bytes:
    """Encode ``{"sha256": {7: value}}`` as the ``pcrs`` part."""
    records = sorted(
        (_BANKS[bank], index, value) for bank, v in pcrs.items() for index, value in v.items()
    )
    return b"".join(struct.pack(">HB", alg, index) + value for alg, index, value in records)


def decode_pcrs(data: bytes) -> dict[str, dict[int, bytes]]:
    """Decode the ``pcrs`` part; raises MalformedEvidence(MALFORMED)."""
    out: dict[str, dict[int, bytes]] = {}
    pos = 0
    last = (-1, -1)
    while pos < len(data):
        if pos + 3 > len(data):
            raise MalformedEvidence(Reason.MALFORMED, "pcrs part is truncated")
        alg_id, index = struct.unpack_from(">HB", data, pos)
        try:
            alg = Alg(alg_id)
            size = hash_size(alg)
        except (ValueError, MalformedEvidence):
            raise MalformedEvidence(
                Reason.MALFORMED, f"pcrs part names hash 0x{alg_id:04x}"
            ) from None
        if (alg_id, index) <= last or index > 23 or pos + 3 + size > len(data):
            raise MalformedEvidence(Reason.MALFORMED, "pcrs part is out of order or truncated")
        last = (alg_id, index)
        out.setdefault(hash_name(alg), {})[index] = data[pos + 3 : pos + 3 + size]
        pos += 3 + size
    return out


def tpm_evidence(
    *, ak_public: bytes, quote: bytes, signature: bytes, pcrs: Mapping[str, Mapping[int, bytes]]
) -> Evidence:
    return Evidence(
        kind=TPM_KIND,
        parts={
            "ak_public": ak_public,
            "quote": quote,
            "signature": signature,
            "pcrs": encode_pcrs(pcrs),
        },
    )


def snp_evidence(*, report: bytes, vcek: bytes, chain: bytes) -> Evidence:
    return Evidence(kind=SNP_KIND, parts={"report": report, "vcek": vcek, "chain": chain})


def _parts(evidence: Evidence, expected: frozenset[str]) -> Mapping[str, bytes]:
    if set(evidence.parts) != expected:
        raise MalformedEvidence(
            Reason.MALFORMED,
            f"{evidence.kind} evidence needs exactly the parts {', '.join(sorted(expected))}",
        )
    return evidence.parts


def verify_evidence(
    evidence: Evidence | None,
    requirement: TrustRequirement,
    *,
    provider_key: bytes,
    nonce: bytes,
    terms_hash: bytes,
    at: datetime,
    trusted_aks: Collection[bytes] = (),
    allow_sha1: bool = False,
    snp_policy: SnpPolicy | None = None,
    pinned_arks: Mapping[bytes, Product] = PINNED_ARKS,
) -> QuoteFacts | SnpFacts | None:
    """Verify ``evidence`` for this provider and negotiation and check ``requirement``.

    ``trusted_aks`` holds the Names of AKs that passed credential activation. Returns the
    verified facts (``None`` when the requirement is ``none`` and no evidence came).
    Raises the EvidenceError subclasses of the verifiers; UNTRUSTED_KEY for an AK that was
    never activated, TRUST_LEVEL when the evidence is of the wrong kind or missing.
    """
    level = requirement.level
    if evidence is None:
        if level != TrustLevel.NONE:
            raise PolicyViolation(Reason.TRUST_LEVEL, f"the bid requires {level.value} evidence")
        return None
    facts: QuoteFacts | SnpFacts
    if evidence.kind == TPM_KIND and level in (TrustLevel.NONE, TrustLevel.TPM):
        parts = _parts(evidence, _TPM_PARTS)
        ak = load_attestation_key(parts["ak_public"])
        if ak.name not in trusted_aks:
            raise InvalidEvidence(
                Reason.UNTRUSTED_KEY, "the quote's AK has not passed credential activation"
            )
        facts = verify_quote(
            ak,
            parts["quote"],
            parts["signature"],
            decode_pcrs(parts["pcrs"]),
            nonce=tpm_qualifying_data(provider_key, nonce, terms_hash),
            allow_sha1=allow_sha1,
        )
    elif evidence.kind == SNP_KIND and level in (TrustLevel.NONE, TrustLevel.SEV_SNP):
        parts = _parts(evidence, _SNP_PARTS)
        vcek = load_vcek_chain(parts["vcek"], parts["chain"], at=at, pinned=pinned_arks)
        facts = verify_report(
            parts["report"],
            vcek,
            report_data=snp_report_data(provider_key, nonce, terms_hash),
            policy=snp_policy,
        )
    elif evidence.kind in (TPM_KIND, SNP_KIND):
        raise PolicyViolation(
            Reason.TRUST_LEVEL, f"{evidence.kind} evidence cannot meet a {level.value} bid"
        )
    else:
        raise MalformedEvidence(Reason.UNSUPPORTED, f"evidence kind {evidence.kind!r} is unknown")
    return check_requirement(requirement, facts, snp_base=snp_policy)


def to_record(facts: QuoteFacts | SnpFacts) -> dict[str, object]:
    """JSON-able facts: bytes as lowercase hex, nested dataclasses as objects."""
    return {k: _plain(v) for k, v in dataclasses.asdict(facts).items()}


def _plain(value: object) -> object:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
