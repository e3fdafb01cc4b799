"""Property tests: arbitrary bytes only ever raise the package's evidence errors."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from attest.errors import EvidenceError, MalformedEvidence
from attest.evidence import decode_pcrs, encode_pcrs
from attest.tpm import load_attestation_key, verify_quote
from attest.tpm_structs import parse_attest, parse_public, parse_signature

VECTORS = Path(__file__).resolve().parents[2] / "spec" / "vectors" / "attestation"
CASE = next(
    c
    for c in json.loads((VECTORS / "tpm-quote.json").read_text())["cases"]
    if c["name"] == "rsa2048:rsassa-sha256:null"
)
AK = load_attestation_key(bytes.fromhex(CASE["ak_public"]))
QUOTE = bytes.fromhex(CASE["quote"])
SIGNATURE = bytes.fromhex(CASE["signature"])
PCRS = {b: {int(i): bytes.fromhex(v) for i, v in vals.items()} for b, vals in CASE["pcrs"].items()}


@given(st.binary(max_size=600))
def test_parsers_raise_only_malformed(data):
    for parse in (parse_public, parse_attest, parse_signature, decode_pcrs):
        with contextlib.suppress(MalformedEvidence):
            parse(data)


@settings(max_examples=300)
@given(st.data())
def test_mutated_quotes_fail_cleanly(data):
    which = data.draw(st.sampled_from(["quote", "signature"]))
    blob = bytearray(QUOTE if which == "quote" else SIGNATURE)
    offset = data.draw(st.integers(0, len(blob) - 1))
    value = data.draw(st.integers(0, 255).filter(lambda v: v != blob[offset]))
    blob[offset] = value
    quote, signature = (bytes(blob), SIGNATURE) if which == "quote" else (QUOTE, bytes(blob))
    try:
        verify_quote(AK, quote, signature, PCRS, nonce=bytes.fromhex(CASE["nonce"]))
    except EvidenceError:
        return
    raise AssertionError(f"a changed {which} byte at {offset} verified")


@given(
    st.dictionaries(
        st.sampled_from(["sha1", "sha256", "sha384"]),
        st.dictionaries(st.integers(0, 23), st.binary(min_size=1, max_size=1), max_size=5),
        max_size=3,
    )
)
def test_pcrs_round_trip(shape):
    sizes = {"sha1": 20, "sha256": 32, "sha384": 48}
    pcrs = {bank: {i: v * sizes[bank] for i, v in values.items()} for bank, values in shape.items()}
    pcrs = {bank: values for bank, values in pcrs.items() if values}
    assert decode_pcrs(encode_pcrs(pcrs)) == pcrs


def test_original_quote_verifies():
    assert verify_quote(AK, QUOTE, SIGNATURE, PCRS, nonce=bytes.fromhex(CASE["nonce"])).pcrs
