"""Attestation: pure verifiers for TPM 2.0 quotes and AMD SEV-SNP reports, and producers.

The verifiers, binding, policy and enrolment steps are re-exported here; the producers
(``attest.producers.tpm``, ``attest.producers.snp``) touch devices and are imported by name.
"""

from attest.binding import snp_report_data, tpm_qualifying_data
from attest.credential import Challenge, check_activation, make_challenge
from attest.enrolment import (
    PendingActivation,
    answer_challenge,
    challenge_enrolment,
    check_answer,
    open_challenge,
    open_enrolment,
)
from attest.errors import (
    AttestError,
    AttestUsageError,
    EvidenceError,
    InvalidEvidence,
    MalformedEvidence,
    PolicyViolation,
    ProducerError,
    Reason,
)
from attest.evidence import (
    SNP_KIND,
    TPM_KIND,
    snp_evidence,
    to_record,
    tpm_evidence,
    verify_evidence,
)
from attest.policy import can_satisfy, check_requirement
from attest.snp import SnpFacts, SnpPolicy, verify_report
from attest.snp_certs import PINNED_ARKS, Product, Vcek, load_vcek_chain
from attest.tpm import AttestationKey, QuoteFacts, load_attestation_key, verify_quote

__all__ = [
    "PINNED_ARKS",
    "SNP_KIND",
    "TPM_KIND",
    "AttestError",
    "AttestUsageError",
    "AttestationKey",
    "Challenge",
    "EvidenceError",
    "InvalidEvidence",
    "MalformedEvidence",
    "PendingActivation",
    "PolicyViolation",
    "ProducerError",
    "Product",
    "QuoteFacts",
    "Reason",
    "SnpFacts",
    "SnpPolicy",
    "Vcek",
    "answer_challenge",
    "can_satisfy",
    "challenge_enrolment",
    "check_activation",
    "check_answer",
    "check_requirement",
    "load_attestation_key",
    "load_vcek_chain",
    "make_challenge",
    "open_challenge",
    "open_enrolment",
    "snp_evidence",
    "snp_report_data",
    "to_record",
    "tpm_evidence",
    "tpm_qualifying_data",
    "verify_evidence",
    "verify_quote",
    "verify_report",
]
