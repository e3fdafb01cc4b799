"""``cx attest``: the real SNP vector, files written by tpm2-tools, and ``show`` on swtpm."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from node.cli import main

VECTORS = Path(__file__).resolve().parents[2] / ".." / "shared" / "testvectors" / "sev-snp"


def _snp_args(report: Path, *extra: str) -> list[str]:
    return [
        "attest",
        "verify-snp",
        str(report),
        "--vcek",
        str(VECTORS / "milan-vcek.der"),
        "--cert-chain",
        str(VECTORS / "milan-cert-chain.pem"),
        *extra,
    ]


@pytest.mark.skipif(not VECTORS.is_dir(), reason=f"real SEV-SNP vectors not found at {VECTORS}")
class TestVerifySnp:
    def test_hex_report_verifies(self, capsys):
        assert main(_snp_args(VECTORS / "milan-report.hex")) == 0
        assert "SEV-SNP report verified (Milan-B0)" in capsys.readouterr().out

    def test_raw_report_and_json(self, tmp_path, capsys):
        raw = bytes.fromhex((VECTORS / "milan-report.hex").read_text())
        (tmp_path / "report.bin").write_bytes(raw)
        data = raw[0x50:0x90].hex()
        assert main(_snp_args(tmp_path / "report.bin", "--report-data", data, "--json")) == 0
        facts = json.loads(capsys.readouterr().out)
        assert facts["report_data_checked"] is True
        assert facts["reported_tcb_parts"]["microcode"] == 0x73

    def test_refusal_is_one_line_with_reason(self, tmp_path, capsys):
        raw = bytearray(bytes.fromhex((VECTORS / "milan-report.hex").read_text()))
        raw[0x90] ^= 1
        (tmp_path / "report.bin").write_bytes(bytes(raw))
        assert main(_snp_args(tmp_path / "report.bin")) == 1
        err = capsys.readouterr().err
        assert err.startswith("refused: bad-signature: ")
        assert err.count("\n") == 1

    def test_wrong_report_data(self, capsys):
        assert main(_snp_args(VECTORS / "milan-report.hex", "--report-data", "00" * 64)) == 1
        assert capsys.readouterr().err.startswith("refused: nonce-mismatch: ")

    def test_missing_file_is_input_error(self, tmp_path, capsys):
        assert main(_snp_args(tmp_path / "nope")) == 2
        assert capsys.readouterr().err.startswith("error: cannot read ")


@pytest.fixture
def tools_quote(tpm, tmp_path):
    """An EK, an AK and a quote made by tpm2-tools, as an operator would make them."""
    env = {**os.environ, "TPM2TOOLS_TCTI": tpm.tcti}

    def run(*argv: str) -> None:
        subprocess.run(argv, cwd=tmp_path, env=env, check=True, capture_output=True)

    run("tpm2_createek", "-c", "ek.ctx", "-G", "rsa", "-u", "ek.pub")
    run("tpm2_flushcontext", "-t")  # swtpm has no resource manager
    run(
        "tpm2_createak",
        "-C",
        "ek.ctx",
        "-c",
        "ak.ctx",
        "-G",
        "ecc",
        "-g",
        "sha256",
        "-s",
        "ecdsa",
        "-u",
        "ak.pub",
    )
    run("tpm2_flushcontext", "-t")
    run("tpm2_flushcontext", "-s")
    run("tpm2_pcrextend", "16:sha256=" + "ab" * 32)
    run(
        "tpm2_quote", "-c", "ak.ctx", "-l", "sha256:0,16", "-q", "c0ffee",
        "-m", "quote.msg", "-s", "quote.sig", "-g", "sha256",
    )  # fmt: skip
    pcr16 = (
        subprocess.run(
            ["tpm2_pcrread", "sha256:16"], env=env, check=True, capture_output=True, text=True
        )
        .stdout.split("0x")[-1]
        .strip()
    )
    (tmp_path / "pcrs.json").write_text(
        json.dumps({"sha256": {"0": "00" * 32, "16": pcr16.lower()}})
    )
    return tmp_path


def _tpm_args(d: Path, *extra: str) -> list[str]:
    return [
        "attest", "verify-tpm", "--ak-public", str(d / "ak.pub"), "--quote", str(d / "quote.msg"),
        "--signature", str(d / "quote.sig"), "--pcrs", str(d / "pcrs.json"), *extra,
    ]  # fmt: skip


@pytest.mark.integration
def test_verify_tpm_files_from_tpm2_tools(tools_quote, capsys):
    assert main(_tpm_args(tools_quote, "--nonce", "c0ffee", "--json")) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["signature_scheme"] == "ecdsa"
    assert facts["ak"] == "ecc-p256"
    assert facts["pcrs"]["sha256:16"] != "00" * 32


@pytest.mark.integration
def test_verify_tpm_refusals(tools_quote, capsys):
    assert main(_tpm_args(tools_quote, "--nonce", "c0ffef")) == 1
    assert capsys.readouterr().err.startswith("refused: nonce-mismatch: ")
    (tools_quote / "pcrs.json").write_text(
        json.dumps({"sha256": {"0": "11" * 32, "16": "00" * 32}})
    )
    assert main(_tpm_args(tools_quote)) == 1
    assert capsys.readouterr().err.startswith("refused: pcr-digest-mismatch: ")
    (tools_quote / "pcrs.json").write_text("[1, 2]")
    assert main(_tpm_args(tools_quote)) == 2


@pytest.mark.integration
def test_show_on_swtpm(tpm, capsys):
    assert main(["attest", "show", "--tcti", tpm.tcti, "--nonce", "abcd", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["levels"] == ["none", "tpm"]
    assert shown["tpm"]["quote"]["nonce"] == "abcd"
    assert shown["sev-snp"].startswith("cannot prove: cannot-produce")


def test_show_without_tpm(capsys):
    assert main(["attest", "show", "--tcti", "swtpm:host=127.0.0.1,port=1", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["levels"] == ["none"]
    assert shown["tpm"].startswith("cannot prove: cannot-produce")
