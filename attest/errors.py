"""Errors of the attestation package.

Tree::

    AttestError                     base of everything this package raises
    +-- AttestUsageError            we misused it: bad argument, bad configuration
    +-- EvidenceError               evidence was refused (the peer or its machine is at fault)
    |   +-- MalformedEvidence       bytes that do not parse as the structure they claim to be
    |   +-- InvalidEvidence         parses, but a signature, chain, binding or field is wrong
    |   +-- PolicyViolation         genuine evidence of a machine the requirement does not accept
    +-- ProducerError               this node cannot produce evidence (no device, device error)

Every error carries a machine-readable ``reason`` (a :class:`Reason`); peer scoring, the CLI
and the vectors under ``spec/vectors/attestation/`` use it. The message is for people and
says, in one line, what happened and what to do.
"""

from __future__ import annotations

import enum

__all__ = [
    "AttestError",
    "AttestUsageError",
    "EvidenceError",
    "InvalidEvidence",
    "MalformedEvidence",
    "PolicyViolation",
    "ProducerError",
    "Reason",
]


class Reason(enum.StrEnum):
    """Why evidence was refused; the values appear in spec/attestation.md and its vectors."""

    # usage
    BAD_ARGUMENT = "bad-argument"
    # structure
    MALFORMED = "malformed"
    UNSUPPORTED = "unsupported"
    WRONG_TYPE = "wrong-type"
    NONZERO_RESERVED = "nonzero-reserved"
    # cryptography
    WEAK_ALGORITHM = "weak-algorithm"
    BAD_SIGNATURE = "bad-signature"
    KEY_ATTRIBUTES = "key-attributes"
    UNTRUSTED_KEY = "untrusted-key"
    UNTRUSTED_CHAIN = "untrusted-chain"
    UNTRUSTED_ROOT = "untrusted-root"
    CERTIFICATE_MISMATCH = "certificate-mismatch"
    ACTIVATION_FAILED = "activation-failed"
    # binding and freshness
    NONCE_MISMATCH = "nonce-mismatch"
    # TPM quote contents
    PCR_SELECTION_MISMATCH = "pcr-selection-mismatch"
    PCR_DIGEST_MISMATCH = "pcr-digest-mismatch"
    # policy
    TRUST_LEVEL = "trust-level"
    PCR_MISMATCH = "pcr-mismatch"
    DEBUG_ENABLED = "debug-enabled"
    MIGRATION_AGENT = "migration-agent"
    VMPL = "vmpl"
    TCB_TOO_LOW = "tcb-too-low"
    MEASUREMENT_MISMATCH = "measurement-mismatch"
    # producers
    CANNOT_PRODUCE = "cannot-produce"
    DEVICE_ERROR = "device-error"


class AttestError(Exception):
    """Base class; ``reason`` says why in a machine-readable way."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason


class AttestUsageError(AttestError):
    """The caller broke a rule: a bad argument or configuration, not the peer's fault."""


class EvidenceError(AttestError):
    """Evidence was refused; the peer (or the machine it describes) is at fault."""


class MalformedEvidence(EvidenceError):
    """Bytes that do not parse as the structure they claim to be."""


class InvalidEvidence(EvidenceError):
    """Well-formed evidence whose signature, chain, binding or contents are wrong."""


class PolicyViolation(EvidenceError):
    """Genuine evidence of a machine that the requirement does not accept."""


class ProducerError(AttestError):
    """This node cannot produce the evidence asked for."""
