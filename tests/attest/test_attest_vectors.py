"""Runs every file under spec/vectors/attestation/ (format: spec/attestation.md#vectors)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from attest.binding import snp_report_data, tpm_qualifying_data
from attest.errors import AttestError
from attest.policy import check_requirement
from attest.snp import SnpPolicy, verify_report
from attest.snp_certs import load_vcek_chain
from attest.tpm import QuoteFacts, load_attestation_key, verify_quote
from protocol.messages import TrustLevel, TrustRequirement

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "spec" / "vectors" / "attestation"
SHARED = ROOT / ".." / "shared" / "testvectors" / "sev-snp"


def _cases(name: str) -> list[tuple[str, dict[str, Any]]]:
    document = json.loads((VECTORS / name).read_text())
    assert document["format"] == "spec/attestation.md#vectors"
    assert document["kind"] == f"attest/{Path(name).stem}"
    return [pytest.param(case, id=case["name"]) for case in document["cases"]]


def _outcome(action) -> str:
    """'valid' or the reason; anything but an AttestError is a bug and propagates."""
    try:
        action()
    except AttestError as exc:
        return exc.reason.value
    return "valid"


def test_every_vector_file_has_a_runner():
    assert {p.name for p in VECTORS.glob("*.json")} == {
        "binding.json",
        "policy.json",
        "snp-report.json",
        "tpm-quote.json",
    }


@pytest.mark.parametrize("case", _cases("binding.json"))
def test_binding(case):
    key, nonce, terms = (bytes.fromhex(case[k]) for k in ("provider_key", "nonce", "terms_hash"))
    outcome = _outcome(lambda: tpm_qualifying_data(key, nonce, terms))
    assert outcome == case["expect"]
    assert _outcome(lambda: snp_report_data(key, nonce, terms)) == case["expect"]
    if outcome == "valid":
        assert tpm_qualifying_data(key, nonce, terms).hex() == case["tpm_qualifying_data"]
        assert snp_report_data(key, nonce, terms).hex() == case["snp_report_data"]


@pytest.mark.parametrize("case", _cases("tpm-quote.json"))
def test_tpm_quote(case):
    pcrs = {
        bank: {int(i): bytes.fromhex(v) for i, v in values.items()}
        for bank, values in case["pcrs"].items()
    }

    def verify() -> None:
        ak = load_attestation_key(bytes.fromhex(case["ak_public"]))
        verify_quote(
            ak,
            bytes.fromhex(case["quote"]),
            bytes.fromhex(case["signature"]),
            pcrs,
            nonce=bytes.fromhex(case["nonce"]),
            allow_sha1=case["allow_sha1"],
        )

    expected = "valid" if case["expect"] == "acceptable" else case["expect"]
    assert _outcome(verify) == expected


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"real SEV-SNP vectors not found at {SHARED}")
@pytest.mark.parametrize("case", _cases("snp-report.json"))
def test_snp_report(case):
    report = bytearray(bytes.fromhex((SHARED / case["report"]).read_text()))
    if "xor" in case:
        offset, value = case["xor"]
        report[offset] ^= value
    if "truncate" in case:
        del report[case["truncate"] :]
    chain = b"".join((SHARED / name).read_bytes() for name in case["chain"])
    at = datetime.datetime.fromisoformat(case["at"])
    requirement = case.get("requirement", {})
    policy = SnpPolicy(
        measurement=bytes.fromhex(requirement["measurement"])
        if "measurement" in requirement
        else None,
        min_tcb=int(requirement["min_tcb"], 16) if "min_tcb" in requirement else None,
    )
    expected_data = case["report_data"]

    def verify() -> None:
        vcek = load_vcek_chain((SHARED / case["vcek"]).read_bytes(), chain, at=at)
        verify_report(
            bytes(report),
            vcek,
            report_data=None if expected_data is None else bytes.fromhex(expected_data),
            policy=policy,
        )

    assert _outcome(verify) == case["expect"]


def _facts(pcrs: dict[str, str]) -> QuoteFacts:
    return QuoteFacts(
        ak_name=b"",
        ak="rsa-2048",
        signature_scheme="rsassa",
        hash="sha256",
        pcrs={k: bytes.fromhex(v) for k, v in pcrs.items()},
        nonce=b"",
        nonce_checked=True,
        clock=0,
        reset_count=0,
        restart_count=0,
        safe=True,
        firmware_version=0,
    )


@pytest.mark.parametrize("case", _cases("policy.json"))
def test_policy(case):
    spec = case["requirement"]
    requirement = TrustRequirement(level=TrustLevel(spec["level"]), pcrs=spec.get("pcrs", {}))
    facts = None if case["facts"] is None else _facts(case["facts"]["pcrs"])
    assert _outcome(lambda: check_requirement(requirement, facts)) == case["expect"]
