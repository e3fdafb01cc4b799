"""verify_evidence: kinds against levels, parts, and SNP binding end to end (fake AMD)."""

from __future__ import annotations

import hashlib

import pytest
from attest_fakes import AT, MILAN_TCB, make_fake_amd

from attest.binding import snp_report_data
from attest.errors import EvidenceError, Reason
from attest.evidence import SNP_KIND, TPM_KIND, snp_evidence, to_record, verify_evidence
from attest.policy import can_satisfy
from attest.snp import SnpPolicy
from attest.snp_certs import Product
from protocol.messages import Evidence, TrustLevel, TrustRequirement

PROVIDER = b"P" * 32
NONCE = b"N" * 24
TERMS = hashlib.sha256(b"terms").digest()
SNP = TrustRequirement(level=TrustLevel.SEV_SNP)


@pytest.fixture(scope="module")
def amd():
    return make_fake_amd(Product.MILAN, MILAN_TCB)


def _evidence(amd, **report_args) -> Evidence:
    report_args.setdefault("report_data", snp_report_data(PROVIDER, NONCE, TERMS))
    return snp_evidence(report=amd.report(**report_args), vcek=amd.vcek_der(), chain=amd.chain_pem)


def _verify(amd, evidence, requirement=SNP, **overrides):
    args = {"provider_key": PROVIDER, "nonce": NONCE, "terms_hash": TERMS, "at": AT}
    args.update(overrides)
    return verify_evidence(evidence, requirement, pinned_arks=amd.pinned, **args)


def _reason(amd, evidence, requirement=SNP, **overrides) -> Reason:
    with pytest.raises(EvidenceError) as info:
        _verify(amd, evidence, requirement, **overrides)
    return info.value.reason


def test_bound_snp_evidence_verifies_and_records(amd):
    facts = _verify(amd, _evidence(amd))
    record = to_record(facts)
    assert record["report_data"] == snp_report_data(PROVIDER, NONCE, TERMS).hex()
    assert record["reported_tcb_parts"]["snp"] == 8


@pytest.mark.parametrize(
    "overrides",
    [
        {"nonce": b"M" * 24},
        {"terms_hash": hashlib.sha256(b"other").digest()},
        {"provider_key": b"Q" * 32},
    ],
)
def test_replayed_snp_evidence_is_refused(amd, overrides):
    assert _reason(amd, _evidence(amd), **overrides) == Reason.NONCE_MISMATCH


def test_requirement_measurement_and_tcb(amd):
    good = TrustRequirement(level=TrustLevel.SEV_SNP, measurement=b"\x11" * 48, min_tcb=MILAN_TCB)
    assert _verify(amd, _evidence(amd), good).measurement == b"\x11" * 48
    other = TrustRequirement(level=TrustLevel.SEV_SNP, measurement=b"\x22" * 48)
    assert _reason(amd, _evidence(amd), other) == Reason.MEASUREMENT_MISMATCH
    higher = TrustRequirement(level=TrustLevel.SEV_SNP, min_tcb=MILAN_TCB + 1)
    assert _reason(amd, _evidence(amd), higher) == Reason.TCB_TOO_LOW


def test_verifier_may_relax_its_own_snp_policy(amd):
    debug = _evidence(amd, policy=0x30000 | 1 << 19)
    assert _reason(amd, debug) == Reason.DEBUG_ENABLED
    assert _verify(amd, debug, snp_policy=SnpPolicy(allow_debug=True)).debug


def test_kinds_and_levels(amd):
    evidence = _evidence(amd)
    tpm = TrustRequirement(level=TrustLevel.TPM)
    assert _reason(amd, evidence, tpm) == Reason.TRUST_LEVEL
    assert _reason(amd, None) == Reason.TRUST_LEVEL
    assert _verify(amd, None, TrustRequirement()) is None
    assert _verify(amd, evidence, TrustRequirement()) is not None  # none still verifies it
    unknown = Evidence(kind="sgx-quote/v3", parts={})
    assert _reason(amd, unknown) == Reason.UNSUPPORTED


@pytest.mark.parametrize("kind", [SNP_KIND, TPM_KIND])
def test_parts_must_be_exact(amd, kind):
    evidence = _evidence(amd)
    extra = Evidence(kind=kind, parts={**evidence.parts, "extra": b""})
    level = TrustLevel.SEV_SNP if kind == SNP_KIND else TrustLevel.TPM
    assert _reason(amd, extra, TrustRequirement(level=level)) == Reason.MALFORMED


def test_can_satisfy():
    assert can_satisfy((TrustLevel.NONE,), TrustRequirement())
    assert can_satisfy((TrustLevel.NONE, TrustLevel.TPM), TrustRequirement(level=TrustLevel.TPM))
    assert not can_satisfy((TrustLevel.TPM,), SNP)
