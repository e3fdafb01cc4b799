"""End to end against a real swtpm: EK certificate, AK, credential activation, PCR extend,
quote, verify; and the ways a quote must fail."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib

import pytest

from attest.binding import tpm_qualifying_data
from attest.credential import check_activation, make_challenge
from attest.errors import EvidenceError, ProducerError, Reason
from attest.evidence import TPM_KIND, decode_pcrs, verify_evidence
from attest.producers.tpm import TpmProducer, ak_template
from attest.tpm import load_attestation_key, verify_quote
from node.tpm import swtpm
from protocol.messages import Evidence, TrustLevel, TrustRequirement

pytestmark = pytest.mark.integration

PROVIDER = bytes(range(32))
NONCE = b"buyer-nonce-0123456789abcdef"
TERMS = hashlib.sha256(b"terms").digest()
SELECTION = {"sha256": [0, 7, 16]}


def _now() -> datetime.datetime:
    # After the EK certificate was issued (swtpm_setup dates it "now").
    return datetime.datetime.now(datetime.UTC)


def _challenge(producer: TpmProducer, tpm: swtpm.Swtpm, ak_public: bytes, secret: bytes):
    return make_challenge(
        ek_certificate=producer.ek_certificate(),
        ek_public=producer.public(producer.ek),
        ak_public=ak_public,
        roots=[tpm.ca_root.read_bytes()],
        intermediates=[tpm.ca_intermediate.read_bytes()],
        at=_now(),
        secret=secret,
        entropy=hashlib.sha512(secret).digest(),
    )


def _enrol(producer: TpmProducer, tpm: swtpm.Swtpm) -> bytes:
    """Credential activation: returns the Name of an AK now trusted."""
    challenge = _challenge(producer, tpm, producer.public(producer.ak), b"s" * 32)
    answer = producer.activate(challenge.credential_blob, challenge.encrypted_secret)
    return check_activation(challenge, answer)


def test_end_to_end(tpm):
    with TpmProducer(tpm.tcti) as producer:
        ak_name = _enrol(producer, tpm)
        producer.extend(16, b"job image sha256:...")
        evidence = producer.evidence(
            provider_key=PROVIDER, nonce=NONCE, terms_hash=TERMS, selection=SELECTION
        )
        expected16 = producer.read_pcrs({"sha256": [16]})["sha256"][16]
    assert evidence.kind == TPM_KIND
    requirement = TrustRequirement(level=TrustLevel.TPM, pcrs={"sha256:16": expected16.hex()})
    facts = verify_evidence(
        evidence,
        requirement,
        provider_key=PROVIDER,
        nonce=NONCE,
        terms_hash=TERMS,
        at=_now(),
        trusted_aks={ak_name},
    )
    assert facts.pcrs["sha256:16"] == expected16
    assert facts.pcrs["sha256:16"] != bytes(32)
    assert facts.signature_scheme == "rsassa"
    assert facts.hash == "sha256"
    assert facts.nonce_checked


def _verify(evidence: Evidence, ak_name: bytes, **overrides):
    args = {
        "provider_key": PROVIDER,
        "nonce": NONCE,
        "terms_hash": TERMS,
        "at": _now(),
        "trusted_aks": {ak_name},
    }
    args.update(overrides)
    requirement = args.pop("requirement", TrustRequirement(level=TrustLevel.TPM))
    with pytest.raises(EvidenceError) as info:
        verify_evidence(evidence, requirement, **args)
    return info.value.reason


@pytest.fixture
def enrolled(tpm):
    with TpmProducer(tpm.tcti) as producer:
        ak_name = _enrol(producer, tpm)
        evidence = producer.evidence(
            provider_key=PROVIDER, nonce=NONCE, terms_hash=TERMS, selection=SELECTION
        )
        yield producer, ak_name, evidence


def _with_part(evidence: Evidence, name: str, value: bytes) -> Evidence:
    return dataclasses.replace(evidence, parts={**evidence.parts, name: value})


def test_tampered_quote_is_bad_signature(enrolled):
    _producer, ak_name, evidence = enrolled
    quote = bytearray(evidence.parts["quote"])
    quote[-1] ^= 1  # last byte of the PCR digest
    assert _verify(_with_part(evidence, "quote", bytes(quote)), ak_name) == Reason.BAD_SIGNATURE


def test_every_byte_of_quote_and_signature_matters(enrolled):
    _producer, _ak_name, evidence = enrolled
    ak = load_attestation_key(evidence.parts["ak_public"])

    pcrs = decode_pcrs(evidence.parts["pcrs"])
    nonce = tpm_qualifying_data(PROVIDER, NONCE, TERMS)
    for part in ("quote", "signature"):
        for offset in range(len(evidence.parts[part])):
            changed = bytearray(evidence.parts[part])
            changed[offset] ^= 1
            blobs = {"quote": evidence.parts["quote"], "signature": evidence.parts["signature"]}
            blobs[part] = bytes(changed)
            with pytest.raises(EvidenceError):
                verify_quote(ak, blobs["quote"], blobs["signature"], pcrs, nonce=nonce)


@pytest.mark.parametrize(
    "overrides",
    [
        {"nonce": b"another-nonce-0123456789abcd"},
        {"terms_hash": hashlib.sha256(b"other terms").digest()},
        {"provider_key": bytes(32)},
    ],
)
def test_wrong_binding_is_nonce_mismatch(enrolled, overrides):
    _producer, ak_name, evidence = enrolled
    assert _verify(evidence, ak_name, **overrides) == Reason.NONCE_MISMATCH


def test_wrong_pcr_value_is_pcr_digest_mismatch(enrolled):
    _producer, ak_name, evidence = enrolled
    pcrs = bytearray(evidence.parts["pcrs"])
    pcrs[-1] ^= 1
    assert _verify(_with_part(evidence, "pcrs", bytes(pcrs)), ak_name) == Reason.PCR_DIGEST_MISMATCH


def test_unexpected_pcr_value_is_policy_violation(enrolled):
    _producer, ak_name, evidence = enrolled
    requirement = TrustRequirement(level=TrustLevel.TPM, pcrs={"sha256:7": "11" * 32})
    assert _verify(evidence, ak_name, requirement=requirement) == Reason.PCR_MISMATCH
    requirement = TrustRequirement(level=TrustLevel.TPM, pcrs={"sha256:9": "00" * 32})
    assert _verify(evidence, ak_name, requirement=requirement) == Reason.PCR_MISMATCH


def test_foreign_ak_is_untrusted(enrolled, other_tpm):
    _producer, ak_name, _evidence = enrolled
    with TpmProducer(other_tpm.tcti) as other:
        foreign = other.evidence(
            provider_key=PROVIDER, nonce=NONCE, terms_hash=TERMS, selection=SELECTION
        )
    assert foreign.parts["ak_public"] != _evidence.parts["ak_public"]
    assert _verify(foreign, ak_name) == Reason.UNTRUSTED_KEY
    # The foreign quote under the enrolled AK's public key: the signature gives it away.
    swapped = _with_part(foreign, "ak_public", _evidence.parts["ak_public"])
    assert _verify(swapped, ak_name) == Reason.BAD_SIGNATURE


def test_activation_for_a_foreign_ak_fails(tpm, other_tpm):
    with TpmProducer(other_tpm.tcti) as other:
        foreign_ak = other.public(other.ak)
    with TpmProducer(tpm.tcti) as producer:
        challenge = _challenge(producer, tpm, foreign_ak, b"t" * 32)
        with pytest.raises(ProducerError) as info:
            producer.activate(challenge.credential_blob, challenge.encrypted_secret)
        assert info.value.reason == Reason.ACTIVATION_FAILED


def test_ek_certificate_of_another_ca_is_untrusted(tpm, other_tpm):
    with TpmProducer(tpm.tcti) as producer:
        with pytest.raises(EvidenceError) as info:
            make_challenge(
                ek_certificate=producer.ek_certificate(),
                ek_public=producer.public(producer.ek),
                ak_public=producer.public(producer.ak),
                roots=[other_tpm.ca_root.read_bytes()],
                intermediates=[other_tpm.ca_intermediate.read_bytes()],
                at=_now(),
                secret=b"u" * 32,
                entropy=b"e" * 64,
            )
        assert info.value.reason == Reason.UNTRUSTED_CHAIN


def test_ek_public_must_match_its_certificate(tpm, other_tpm):
    with TpmProducer(other_tpm.tcti) as other:
        other_ek = other.public(other.ek)
    with TpmProducer(tpm.tcti) as producer:
        with pytest.raises(EvidenceError) as info:
            make_challenge(
                ek_certificate=producer.ek_certificate(),
                ek_public=other_ek,
                ak_public=producer.public(producer.ak),
                roots=[tpm.ca_root.read_bytes()],
                intermediates=[tpm.ca_intermediate.read_bytes()],
                at=_now(),
                secret=b"u" * 32,
                entropy=b"e" * 64,
            )
        assert info.value.reason == Reason.CERTIFICATE_MISMATCH


@pytest.mark.parametrize(
    ("template", "scheme", "hash_name"),
    [
        ("rsa2048:rsassa-sha256:null", "rsassa", "sha256"),
        ("rsa2048:rsassa-sha384:null", "rsassa", "sha384"),
        ("rsa2048:rsapss-sha256:null", "rsapss", "sha256"),
        ("rsa2048:rsapss-sha384:null", "rsapss", "sha384"),
        ("ecc256:ecdsa-sha256:null", "ecdsa", "sha256"),
        ("ecc384:ecdsa-sha384:null", "ecdsa", "sha384"),
    ],
)
def test_signature_algorithms(tpm, template, scheme, hash_name):
    with TpmProducer(tpm.tcti) as producer:
        handle = producer.create_ak(ak_template(template))
        quote = producer.quote(b"q" * 32, {"sha256": [0, 16], "sha1": [16]}, ak=handle)
        producer.flush(handle)
    ak = load_attestation_key(quote.ak_public)
    facts = verify_quote(
        ak, quote.attest, quote.signature, quote.pcrs, nonce=b"q" * 32, allow_sha1=True
    )
    assert (facts.signature_scheme, facts.hash) == (scheme, hash_name)
    assert set(facts.pcrs) == {"sha256:0", "sha256:16", "sha1:16"}


@pytest.mark.parametrize("template", ["rsa2048:rsassa-sha1:null", "rsa2048:rsapss-sha1:null"])
def test_sha1_needs_explicit_permission(tpm, template):
    with TpmProducer(tpm.tcti) as producer:
        handle = producer.create_ak(ak_template(template))
        quote = producer.quote(b"q" * 32, {"sha256": [0]}, ak=handle)
        producer.flush(handle)
    ak = load_attestation_key(quote.ak_public)
    with pytest.raises(EvidenceError) as info:
        verify_quote(ak, quote.attest, quote.signature, quote.pcrs, nonce=b"q" * 32)
    assert info.value.reason == Reason.WEAK_ALGORITHM
    facts = verify_quote(
        ak, quote.attest, quote.signature, quote.pcrs, nonce=b"q" * 32, allow_sha1=True
    )
    assert facts.hash == "sha1"


def test_sha1_bank_needs_explicit_permission(tpm):
    with TpmProducer(tpm.tcti) as producer:
        quote = producer.quote(b"q" * 32, {"sha1": [0]})
    ak = load_attestation_key(quote.ak_public)
    with pytest.raises(EvidenceError) as info:
        verify_quote(ak, quote.attest, quote.signature, quote.pcrs, nonce=b"q" * 32)
    assert info.value.reason == Reason.WEAK_ALGORITHM


def test_pcr_values_must_match_the_selection(tpm):
    with TpmProducer(tpm.tcti) as producer:
        quote = producer.quote(b"q" * 32, {"sha256": [0, 7]})
    ak = load_attestation_key(quote.ak_public)
    for pcrs in (
        {"sha256": {0: quote.pcrs["sha256"][0]}},
        {"sha256": {**quote.pcrs["sha256"], 8: bytes(32)}},
    ):
        with pytest.raises(EvidenceError) as info:
            verify_quote(ak, quote.attest, quote.signature, pcrs, nonce=b"q" * 32)
        assert info.value.reason == Reason.PCR_SELECTION_MISMATCH


def test_keys_persist_and_reboots_show_in_counters(tpm):
    with TpmProducer(tpm.tcti) as producer:
        ak_public = producer.public(producer.ak)
        first = producer.quote(b"q" * 32, {"sha256": [0]})
    tpm.stop()
    restarted = swtpm.start(tpm.directory)
    try:
        with TpmProducer(restarted.tcti) as producer:
            assert producer.public(producer.ak) == ak_public
            second = producer.quote(b"q" * 32, {"sha256": [0]})
    finally:
        restarted.stop()
    ak = load_attestation_key(ak_public)
    before = verify_quote(ak, first.attest, first.signature, first.pcrs, nonce=b"q" * 32)
    after = verify_quote(ak, second.attest, second.signature, second.pcrs, nonce=b"q" * 32)
    assert after.reset_count == before.reset_count + 1


def test_leftover_transients_are_flushed(tpm):
    producer = TpmProducer(tpm.tcti)
    producer.create_ak(ak_template("ecc256:ecdsa-sha256:null"))
    producer.create_ak(ak_template("ecc256:ecdsa-sha256:null"))
    producer.close()  # a client that "crashed" without flushing
    with TpmProducer(tpm.tcti) as fresh:
        assert fresh.leftovers_flushed == 2
        assert fresh.flush_transients() == 0


def test_no_tpm_cannot_produce():
    with pytest.raises(ProducerError) as info:
        TpmProducer("swtpm:host=127.0.0.1,port=1")
    assert info.value.reason == Reason.CANNOT_PRODUCE
