"""Regenerate tpm-quote.json from a fresh swtpm (run from the project root:
``.venv/bin/python spec/vectors/attestation/make_tpm_vectors.py``).

The file is frozen once committed: regenerating changes every key and signature, so do it
only with a revision note in spec/attestation.md.
"""

from __future__ import annotations

import json
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from attest.producers.tpm import TpmProducer, ak_template
from node.tpm import swtpm

OUT = Path(__file__).with_name("tpm-quote.json")
NONCE = bytes.fromhex("5c0ffee5" * 8)
SELECTION = {"sha256": [0, 7, 16]}


def _pcrs_json(pcrs: dict[str, dict[int, bytes]]) -> dict[str, dict[str, str]]:
    return {bank: {str(i): v.hex() for i, v in sorted(vals.items())} for bank, vals in pcrs.items()}


def _flip(data: str, offset: int) -> str:
    raw = bytearray(bytes.fromhex(data))
    raw[offset] ^= 1
    return raw.hex()


def main() -> None:
    cases: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        swtpm.manufacture(directory)
        tpm = swtpm.start(directory)
        try:
            with TpmProducer(tpm.tcti) as producer:
                producer.extend(16, b"compute-exchange test vector")
                for template in (
                    "rsa2048:rsassa-sha256:null",
                    "rsa2048:rsapss-sha384:null",
                    "ecc256:ecdsa-sha256:null",
                    "ecc384:ecdsa-sha384:null",
                    "rsa2048:rsassa-sha1:null",
                ):
                    handle = producer.create_ak(ak_template(template))
                    quote = producer.quote(NONCE, SELECTION, ak=handle)
                    producer.flush(handle)
                    base = {
                        "ak_public": quote.ak_public.hex(),
                        "quote": quote.attest.hex(),
                        "signature": quote.signature.hex(),
                        "pcrs": _pcrs_json(quote.pcrs),
                        "nonce": NONCE.hex(),
                        "allow_sha1": False,
                    }
                    if template.endswith("sha1:null"):
                        cases.append(
                            {**base, "name": f"{template} refused", "expect": "weak-algorithm"}
                        )
                        cases.append(
                            {
                                **base,
                                "name": f"{template} allowed",
                                "allow_sha1": True,
                                "expect": "acceptable",
                            }
                        )
                        continue
                    cases.append({**base, "name": template, "expect": "valid"})
                    if template != "rsa2048:rsassa-sha256:null":
                        continue
                    size = len(quote.attest)
                    pcrs = _pcrs_json(quote.pcrs)
                    pcrs_wrong = {"sha256": {**pcrs["sha256"], "7": "11" * 32}}
                    pcrs_missing = {"sha256": {k: v for k, v in pcrs["sha256"].items() if k != "7"}}
                    pcrs_extra = {"sha256": {**pcrs["sha256"], "8": "00" * 32}}
                    attrs = struct.unpack_from(">I", quote.ak_public, 6)[0] | 1 << 17  # decrypt
                    ak_decrypt = bytearray(quote.ak_public)
                    struct.pack_into(">I", ak_decrypt, 6, attrs)
                    cases += [
                        {
                            **base,
                            "name": "pcr digest byte changed",
                            "quote": _flip(base["quote"], size - 1),
                            "expect": "bad-signature",
                        },
                        {
                            **base,
                            "name": "magic changed",
                            "quote": _flip(base["quote"], 0),
                            "expect": "wrong-type",
                        },
                        {
                            **base,
                            "name": "signature changed",
                            "signature": _flip(base["signature"], 10),
                            "expect": "bad-signature",
                        },
                        {
                            **base,
                            "name": "trailing byte",
                            "signature": base["signature"] + "00",
                            "expect": "malformed",
                        },
                        {
                            **base,
                            "name": "hmac signature",
                            "signature": "0005000b0000",
                            "expect": "unsupported",
                        },
                        {
                            **base,
                            "name": "wrong nonce",
                            "nonce": "00" * 32,
                            "expect": "nonce-mismatch",
                        },
                        {
                            **base,
                            "name": "wrong pcr value",
                            "pcrs": pcrs_wrong,
                            "expect": "pcr-digest-mismatch",
                        },
                        {
                            **base,
                            "name": "pcr missing",
                            "pcrs": pcrs_missing,
                            "expect": "pcr-selection-mismatch",
                        },
                        {
                            **base,
                            "name": "pcr not quoted",
                            "pcrs": pcrs_extra,
                            "expect": "pcr-selection-mismatch",
                        },
                        {
                            **base,
                            "name": "AK may decrypt",
                            "ak_public": ak_decrypt.hex(),
                            "expect": "key-attributes",
                        },
                        {
                            **base,
                            "name": "AK public truncated",
                            "ak_public": base["ak_public"][:-2],
                            "expect": "malformed",
                        },
                    ]
        finally:
            tpm.stop()
    document = {
        "kind": "attest/tpm-quote",
        "format": "spec/attestation.md#vectors",
        "description": "TPM 2.0 quotes from swtpm; verify_quote(load_attestation_key(ak_public), ...)",
        "cases": cases,
    }
    OUT.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
