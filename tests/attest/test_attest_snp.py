"""SEV-SNP: the real Milan vector, every single-byte change of it, and synthetic reports
(versions 3 and 5, Turin) signed by a fake AMD hierarchy that only these tests pin."""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path

import pytest
from attest_fakes import AT, CHIP_ID, MILAN_TCB, TURIN_TCB, make_fake_amd

from attest.errors import AttestError, EvidenceError, Reason
from attest.snp import REPORT_SIZE, SnpPolicy, check_policy, tcb_at_least, verify_report
from attest.snp_certs import Product, load_vcek_chain

VECTORS = Path(__file__).resolve().parents[2] / ".." / "shared" / "testvectors" / "sev-snp"
NOW = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)

if not VECTORS.is_dir():  # pragma: no cover - the vectors live outside the repository
    pytest.skip(f"real SEV-SNP vectors not found at {VECTORS}", allow_module_level=True)


def _read(name: str) -> bytes:
    return (VECTORS / name).read_bytes()


@pytest.fixture(scope="module")
def milan_report() -> bytes:
    return bytes.fromhex(_read("milan-report.hex").decode())


@pytest.fixture(scope="module")
def milan_vcek():
    return load_vcek_chain(_read("milan-vcek.der"), _read("milan-cert-chain.pem"), at=NOW)


@pytest.fixture(scope="module")
def fake_milan():
    return make_fake_amd(Product.MILAN, MILAN_TCB)


@pytest.fixture(scope="module")
def fake_turin():
    return make_fake_amd(Product.TURIN, TURIN_TCB)


def test_real_milan_report_verifies(milan_report, milan_vcek):
    facts = verify_report(milan_report, milan_vcek, report_data=milan_report[0x50:0x90])
    assert facts.product == "Milan"
    assert facts.version == 2
    assert facts.report_data_checked
    assert not facts.debug
    assert not facts.migration_agent
    assert facts.vmpl == 0
    assert facts.reported_tcb_parts == milan_vcek.tcb
    assert facts.measurement.hex().startswith("7a1e5c266c0108db")
    assert milan_vcek.product_name == "Milan-B0"


def test_every_single_byte_change_fails(milan_report, milan_vcek):
    assert len(milan_report) == REPORT_SIZE
    accepted = []
    for offset in range(REPORT_SIZE):
        changed = bytearray(milan_report)
        changed[offset] ^= 0x01
        try:
            verify_report(bytes(changed), milan_vcek, report_data=None)
        except EvidenceError:
            continue
        accepted.append(offset)
    assert accepted == []


@pytest.mark.parametrize(
    ("offset", "reason"),
    [
        (0x000, Reason.BAD_SIGNATURE),  # version 2 -> 3 is supported, but not what was signed
        (0x034, Reason.UNSUPPORTED),  # signature algorithm
        (0x050, Reason.BAD_SIGNATURE),  # report_data
        (0x2A0, Reason.BAD_SIGNATURE),  # r
        (0x2D0, Reason.NONZERO_RESERVED),  # high bytes of r
        (0x318, Reason.NONZERO_RESERVED),  # high bytes of s
        (0x49F, Reason.NONZERO_RESERVED),  # last byte
    ],
)
def test_single_byte_changes_give_specific_reasons(milan_report, milan_vcek, offset, reason):
    changed = bytearray(milan_report)
    changed[offset] ^= 0x01
    with pytest.raises(EvidenceError) as info:
        verify_report(bytes(changed), milan_vcek, report_data=None)
    assert info.value.reason == reason


def test_wrong_report_data_is_nonce_mismatch(milan_report, milan_vcek):
    with pytest.raises(EvidenceError) as info:
        verify_report(milan_report, milan_vcek, report_data=b"\0" * 64)
    assert info.value.reason == Reason.NONCE_MISMATCH


@pytest.mark.parametrize("size", [0, REPORT_SIZE - 1, REPORT_SIZE + 1])
def test_wrong_size_is_malformed(milan_report, milan_vcek, size):
    with pytest.raises(EvidenceError) as info:
        verify_report((milan_report * 2)[:size], milan_vcek, report_data=None)
    assert info.value.reason == Reason.MALFORMED


def test_other_products_chain_is_refused():
    genoa_chain = _read("genoa-ask.pem") + _read("genoa-ark.pem")
    with pytest.raises(EvidenceError) as info:
        load_vcek_chain(_read("milan-vcek.der"), genoa_chain, at=NOW)
    assert info.value.reason == Reason.UNTRUSTED_CHAIN


def test_unpinned_ark_is_untrusted_root():
    with pytest.raises(EvidenceError) as info:
        load_vcek_chain(_read("milan-vcek.der"), _read("milan-cert-chain.pem"), at=NOW, pinned={})
    assert info.value.reason == Reason.UNTRUSTED_ROOT


def test_chain_in_wrong_order_is_refused():
    chain = _read("milan-ark.pem") + _read("milan-ask.pem")
    with pytest.raises(EvidenceError) as info:
        load_vcek_chain(_read("milan-vcek.der"), chain, at=NOW)
    assert info.value.reason == Reason.UNTRUSTED_ROOT


def test_expired_vcek_is_refused():
    with pytest.raises(EvidenceError) as info:
        load_vcek_chain(
            _read("milan-vcek.der"),
            _read("milan-cert-chain.pem"),
            at=datetime.datetime(2031, 1, 1, tzinfo=datetime.UTC),
        )
    assert info.value.reason == Reason.UNTRUSTED_CHAIN


@pytest.mark.parametrize("name", ["genoa", "turin"])
def test_pinned_arks_of_other_products_self_verify(name):
    # A VCEK from Milan under another product's real ASK/ARK fails at the VCEK link only.
    chain = _read(f"{name}-ask.pem") + _read(f"{name}-ark.pem")
    with pytest.raises(EvidenceError) as info:
        load_vcek_chain(_read("milan-vcek.der"), chain, at=NOW)
    assert "VCEK" in str(info.value)


def test_policy_measurement_and_tcb(milan_report, milan_vcek):
    facts = verify_report(milan_report, milan_vcek, report_data=None)
    check_policy(facts, SnpPolicy(measurement=facts.measurement, min_tcb=facts.reported_tcb))
    with pytest.raises(EvidenceError) as info:
        check_policy(facts, SnpPolicy(measurement=b"\0" * 48))
    assert info.value.reason == Reason.MEASUREMENT_MISMATCH
    higher_snp = facts.reported_tcb + (1 << 48)  # snp component + 1 on Milan
    with pytest.raises(EvidenceError) as info:
        check_policy(facts, SnpPolicy(min_tcb=higher_snp))
    assert info.value.reason == Reason.TCB_TOO_LOW


def test_tcb_comparison_is_per_component():
    assert tcb_at_least(0x0300000000000873, 0x0300000000000873)
    # numerically larger but microcode lower: refused
    assert not tcb_at_least(0x0200000000000974, 0x0300000000000873)
    assert tcb_at_least(0x0300000000000974, 0x0300000000000873)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"debug": True}, Reason.DEBUG_ENABLED),
        ({"migration_agent": True}, Reason.MIGRATION_AGENT),
        ({"vmpl": 1}, Reason.VMPL),
    ],
)
def test_policy_defaults_are_strict(milan_report, milan_vcek, change, reason):
    facts = dataclasses.replace(verify_report(milan_report, milan_vcek, report_data=None), **change)
    with pytest.raises(EvidenceError) as info:
        check_policy(facts, SnpPolicy())
    assert info.value.reason == reason
    permissive = SnpPolicy(allow_debug=True, allow_migration_agent=True, max_vmpl=3)
    assert check_policy(facts, permissive) is facts


@pytest.mark.parametrize("version", [2, 3, 5])
def test_synthetic_versions_verify(fake_milan, version):
    vcek = load_vcek_chain(
        fake_milan.vcek_der(), fake_milan.chain_pem, at=AT, pinned=fake_milan.pinned
    )
    facts = verify_report(fake_milan.report(version=version), vcek, report_data=b"\0" * 64)
    assert facts.version == version
    assert (facts.cpuid is None) == (version == 2)


@pytest.mark.parametrize("version", [0, 1, 4, 6])
def test_other_versions_are_unsupported(fake_milan, version):
    vcek = load_vcek_chain(
        fake_milan.vcek_der(), fake_milan.chain_pem, at=AT, pinned=fake_milan.pinned
    )
    with pytest.raises(EvidenceError) as info:
        verify_report(fake_milan.report(version=version), vcek, report_data=None)
    assert info.value.reason == Reason.UNSUPPORTED


def test_turin_layout(fake_turin):
    vcek = load_vcek_chain(
        fake_turin.vcek_der(), fake_turin.chain_pem, at=AT, pinned=fake_turin.pinned
    )
    assert len(vcek.hwid) == 8
    facts = verify_report(fake_turin.report(version=3), vcek, report_data=None)
    parts = facts.reported_tcb_parts
    assert (parts.fmc, parts.bootloader, parts.tee, parts.snp, parts.microcode) == (
        5,
        2,
        1,
        9,
        0x48,
    )


@pytest.mark.parametrize(
    ("vcek_args", "report_args", "reason"),
    [
        ({}, {"chip_id": bytes(64)}, Reason.CERTIFICATE_MISMATCH),
        ({}, {"tcb": MILAN_TCB + 1}, Reason.CERTIFICATE_MISMATCH),
        ({"tcb": MILAN_TCB + (1 << 56)}, {}, Reason.CERTIFICATE_MISMATCH),
        ({}, {"flags": 1 << 2}, Reason.UNSUPPORTED),  # signed by a VLEK
        ({}, {"policy": 0x30000 | 1 << 19}, Reason.DEBUG_ENABLED),
        ({}, {"policy": 0x30000 | 1 << 18}, Reason.MIGRATION_AGENT),
        ({}, {"vmpl": 2}, Reason.VMPL),
    ],
)
def test_synthetic_refusals(fake_milan, vcek_args, report_args, reason):
    vcek = load_vcek_chain(
        fake_milan.vcek_der(**vcek_args), fake_milan.chain_pem, at=AT, pinned=fake_milan.pinned
    )
    with pytest.raises(EvidenceError) as info:
        verify_report(fake_milan.report(**report_args), vcek, report_data=None)
    assert info.value.reason == reason


def test_masked_chip_id_skips_the_chip_check(fake_milan):
    vcek = load_vcek_chain(
        fake_milan.vcek_der(), fake_milan.chain_pem, at=AT, pinned=fake_milan.pinned
    )
    facts = verify_report(
        fake_milan.report(chip_id=bytes(64), flags=1 << 1), vcek, report_data=None
    )
    assert facts.chip_id == bytes(64)
    assert facts.chip_id != CHIP_ID


def test_vcek_for_another_product_is_refused(fake_milan):
    with pytest.raises(EvidenceError) as info:
        load_vcek_chain(
            fake_milan.vcek_der(name="Genoa-B1"),
            fake_milan.chain_pem,
            at=AT,
            pinned=fake_milan.pinned,
        )
    assert info.value.reason == Reason.UNTRUSTED_CHAIN


@pytest.mark.parametrize(
    "junk", [b"", b"-----BEGIN CERTIFICATE-----\nAAAA\n", b"\x30\x03\x02\x01\x00"]
)
def test_junk_certificates_are_malformed(junk):
    with pytest.raises(AttestError) as info:
        load_vcek_chain(junk, _read("milan-cert-chain.pem"), at=NOW)
    assert info.value.reason == Reason.MALFORMED
