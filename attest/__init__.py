"""Attestation: pure verifiers for TPM 2.0 quotes and AMD SEV-SNP reports, and producers."""
