"""Binding evidence to one provider and one negotiation (spec/attestation.md §Binding).

The TPM quote's qualifying data and the SNP report's REPORT_DATA are::

    H(domain || 0x00 || provider_key || len(nonce) as 2 bytes big-endian || nonce || terms_hash)

with ``H`` = SHA-256 and domain ``cx/attest/tpm/v1`` for TPM (32 bytes: every TPM accepts
that much qualifying data), ``H`` = SHA-512 and domain ``cx/attest/sev-snp/v1`` for SNP (the
64 bytes of REPORT_DATA). ``provider_key`` is the provider's 32-byte Ed25519 peer key,
``nonce`` the buyer's attestation nonce (16 to 64 bytes), ``terms_hash`` the 32-byte SHA-256
of the canonical encoding of the agreement terms. Evidence made for another provider, nonce or
set of terms therefore fails the verifier's nonce check: it is stale or replayed.

Pure: only ``hashlib``.
"""

from __future__ import annotations

import hashlib

from attest.errors import AttestUsageError, Reason

__all__ = ["SNP_DOMAIN", "TPM_DOMAIN", "snp_report_data", "tpm_qualifying_data"]

TPM_DOMAIN = b"cx/attest/tpm/v1"
SNP_DOMAIN = b"cx/attest/sev-snp/v1"
MIN_NONCE = 16
MAX_NONCE = 64


def _binding_input(domain: bytes, provider_key: bytes, nonce: bytes, terms_hash: bytes) -> bytes:
    if len(provider_key) != 32:
        raise AttestUsageError(Reason.BAD_ARGUMENT, "provider key must be 32 raw Ed25519 bytes")
    if not MIN_NONCE <= len(nonce) <= MAX_NONCE:
        raise AttestUsageError(
            Reason.BAD_ARGUMENT, f"nonce must be {MIN_NONCE} to {MAX_NONCE} bytes"
        )
    if len(terms_hash) != 32:
        raise AttestUsageError(Reason.BAD_ARGUMENT, "terms hash must be a 32-byte SHA-256")
    return domain + b"\x00" + provider_key + len(nonce).to_bytes(2, "big") + nonce + terms_hash


def tpm_qualifying_data(provider_key: bytes, nonce: bytes, terms_hash: bytes) -> bytes:
    """The 32 bytes a provider passes to TPM2_Quote; raises AttestUsageError(BAD_ARGUMENT)."""
    return hashlib.sha256(_binding_input(TPM_DOMAIN, provider_key, nonce, terms_hash)).digest()


def snp_report_data(provider_key: bytes, nonce: bytes, terms_hash: bytes) -> bytes:
    """The 64 bytes of REPORT_DATA; raises AttestUsageError(BAD_ARGUMENT)."""
    return hashlib.sha512(_binding_input(SNP_DOMAIN, provider_key, nonce, terms_hash)).digest()
