"""``cx attest``: verify TPM quotes and SEV-SNP reports from files; show what this node proves.

Exit status: 0 verified (facts on stdout), 1 evidence refused (``refused: <reason>: ...`` on
stderr, one line), 2 unusable input (missing file, bad hex or JSON).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

from attest.errors import AttestError, EvidenceError
from attest.evidence import to_record
from attest.producers.snp import SnpProducer
from attest.snp import REPORT_SIZE, SnpFacts, verify_report
from attest.snp_certs import load_vcek_chain
from attest.tpm import QuoteFacts, load_attestation_key, verify_quote

__all__ = ["register"]

EXIT_REFUSED = 1
EXIT_INPUT = 2
DEFAULT_TCTI = "device:/dev/tpmrm0"


class _InputError(Exception):
    """A file or argument the user gave cannot be used."""


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    group = commands.add_parser("attest", help="verify and produce attestation evidence")
    sub = group.add_subparsers(dest="attest_command", metavar="ACTION", required=True)

    tpm = sub.add_parser(
        "verify-tpm",
        help="verify a TPM 2.0 quote (files as tpm2_quote -m -s writes them)",
    )
    tpm.add_argument(
        "--ak-public", type=Path, required=True, help="AK, TPMT_PUBLIC or TPM2B_PUBLIC"
    )
    tpm.add_argument("--quote", type=Path, required=True, help="TPMS_ATTEST (tpm2_quote -m)")
    tpm.add_argument("--signature", type=Path, required=True, help="TPMT_SIGNATURE (tpm2_quote -s)")
    tpm.add_argument(
        "--pcrs", type=Path, required=True, help='JSON {"sha256": {"0": "hex", ...}, ...}'
    )
    tpm.add_argument("--nonce", help="expected qualifying data (hex); unchecked if absent")
    tpm.add_argument("--allow-sha1", action="store_true", help="accept SHA-1 signatures and banks")
    tpm.add_argument("--json", action="store_true", help="print the facts as JSON")
    tpm.set_defaults(run=_verify_tpm)

    snp = sub.add_parser("verify-snp", help="verify an AMD SEV-SNP attestation report")
    snp.add_argument("report", type=Path, help="report, raw 1184 bytes or hex text")
    snp.add_argument("--vcek", type=Path, required=True, help="VCEK certificate, PEM or DER")
    snp.add_argument("--cert-chain", type=Path, required=True, help="ASK then ARK, PEM")
    snp.add_argument("--report-data", help="expected REPORT_DATA (hex); unchecked if absent")
    snp.add_argument("--json", action="store_true", help="print the facts as JSON")
    snp.set_defaults(run=_verify_snp)

    show = sub.add_parser("show", help="what this node can prove, with a fresh quote")
    show.add_argument("--tcti", default=DEFAULT_TCTI, help=f"TPM to use (default {DEFAULT_TCTI})")
    show.add_argument("--nonce", default="", help="qualifying data for the quote (hex)")
    show.add_argument("--pcrs", default="sha256:0,1,2,3,4,5,6,7", help="PCRs to quote")
    show.add_argument("--json", action="store_true", help="print as JSON")
    show.set_defaults(run=_show)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise _InputError(f"cannot read {path}: {exc.strerror}") from exc


def _hex(value: str, what: str) -> bytes:
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise _InputError(f"{what} is not hex: {value!r}") from None


def _load_pcrs(path: Path) -> dict[str, dict[int, bytes]]:
    try:
        data = json.loads(_read(path))
        return {
            str(bank): {int(index): bytes.fromhex(value) for index, value in values.items()}
            for bank, values in data.items()
        }
    except (ValueError, AttributeError, TypeError) as exc:
        raise _InputError(f'{path} is not JSON like {{"sha256": {{"0": "hex"}}}}: {exc}') from exc


def _report_bytes(data: bytes) -> bytes:
    if len(data) == REPORT_SIZE:
        return data
    try:
        return bytes.fromhex(data.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise _InputError("REPORT is neither 1184 raw bytes nor hex text") from None


def _emit(facts: QuoteFacts | SnpFacts, as_json: bool, title: str) -> None:
    record = to_record(facts)
    if as_json:
        print(json.dumps(record, sort_keys=True))
        return
    print(title)
    for key, value in record.items():
        print(f"  {key}: {json.dumps(value) if isinstance(value, dict | list) else value}")


def _guarded(action: Any) -> int:  # noqa: ANN401 - any zero-argument callable returning int
    try:
        code: int = action()
    except EvidenceError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except (_InputError, AttestError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    return code


def _verify_tpm(args: argparse.Namespace) -> int:
    def action() -> int:
        ak = load_attestation_key(_read(args.ak_public))
        facts = verify_quote(
            ak,
            _read(args.quote),
            _read(args.signature),
            _load_pcrs(args.pcrs),
            nonce=None if args.nonce is None else _hex(args.nonce, "--nonce"),
            allow_sha1=args.allow_sha1,
        )
        _emit(facts, args.json, "TPM quote verified")
        return 0

    return _guarded(action)


def _verify_snp(args: argparse.Namespace) -> int:
    def action() -> int:
        report = _report_bytes(_read(args.report))
        vcek = load_vcek_chain(
            _read(args.vcek), _read(args.cert_chain), at=datetime.datetime.now(datetime.UTC)
        )
        expected = None if args.report_data is None else _hex(args.report_data, "--report-data")
        facts = verify_report(report, vcek, report_data=expected)
        _emit(facts, args.json, f"SEV-SNP report verified ({vcek.product_name})")
        return 0

    return _guarded(action)


def _selection(spec: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    try:
        for part in spec.split("+"):
            bank, _, indices = part.partition(":")
            out[bank] = [int(i) for i in indices.split(",")]
    except ValueError:
        raise _InputError(f"--pcrs {spec!r} is not like sha256:0,1,7") from None
    return out


def _show(args: argparse.Namespace) -> int:
    def action() -> int:
        nonce = _hex(args.nonce, "--nonce")
        selection = _selection(args.pcrs)
        result: dict[str, Any] = {"levels": ["none"]}
        # The TSS C library logs its own errors to stderr; the one-line reason here suffices.
        if not args.verbose:
            os.environ.setdefault("TSS2_LOG", "all+none")
        try:
            from attest.producers.tpm import TpmProducer  # tpm2-pytss is an optional extra

            with TpmProducer(args.tcti) as producer:
                quote = producer.quote(nonce, selection)
                ak = load_attestation_key(quote.ak_public)
                facts = verify_quote(ak, quote.attest, quote.signature, quote.pcrs, nonce=nonce)
                result["tpm"] = {"tcti": args.tcti, "quote": to_record(facts)}
                try:
                    result["tpm"]["ek_certificate"] = len(producer.ek_certificate())
                except AttestError as exc:
                    result["tpm"]["ek_certificate"] = f"none: {exc}"
            result["levels"].append("tpm")
        except (AttestError, ImportError) as exc:
            result["tpm"] = f"cannot prove: {exc}"
        try:
            SnpProducer().report(bytes(64))
            result["levels"].append("sev-snp")
            result["sev-snp"] = "available"
        except AttestError as exc:
            result["sev-snp"] = f"cannot prove: {exc}"
        if args.json:
            print(json.dumps(result, sort_keys=True))
        else:
            print(f"this node can prove: {', '.join(result['levels'])}")
            for key in ("tpm", "sev-snp"):
                print(f"{key}: {json.dumps(result[key], indent=2, sort_keys=True)}")
        return 0

    return _guarded(action)
