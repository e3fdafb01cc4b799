"""MakeCredential in pure Python against a real TPM's ActivateCredential, RSA and ECC EKs,
and the KDFs against known answers."""

from __future__ import annotations

import hashlib

import pytest

from attest.credential import kdfa, kdfe, make_credential
from attest.errors import AttestUsageError, ProducerError, Reason
from attest.producers.tpm import TpmProducer
from attest.tpm_structs import Alg, parse_public


def test_kdfa_known_answer():
    # Independent computation of SP800-108 counter mode, one block, from the definition.
    import hmac

    key, label, u, v = b"k" * 32, b"STORAGE", b"u", b"v"
    block = hmac.new(key, b"\0\0\0\1" + label + b"\0" + u + v + (128).to_bytes(4, "big"), "sha256")
    assert kdfa(Alg.SHA256, key, label, u, v, 128) == block.digest()[:16]
    assert len(kdfa(Alg.SHA256, key, label, u, v, 512)) == 64


def test_kdfe_known_answer():
    z, label, u, v = b"z" * 32, b"IDENTITY", b"u", b"v"
    block = hashlib.sha256(b"\0\0\0\1" + z + label + b"\0" + u + v).digest()
    assert kdfe(Alg.SHA256, z, label, u, v, 256) == block


@pytest.mark.integration
@pytest.mark.parametrize(
    ("ek_type", "handle"), [("EK-RSA2048", 0x81010001), ("EK-ECC256", 0x81010002)]
)
def test_make_credential_activates_on_a_real_tpm(tpm, ek_type, handle):
    with TpmProducer(tpm.tcti, ek_type=ek_type, ek_handle=handle) as producer:
        ek = parse_public(producer.public(producer.ek))
        assert (ek.curve is None) == (ek_type == "EK-RSA2048")
        ak_name = parse_public(producer.public(producer.ak)).name
        secret = b"fresh secret 0123456789abcdef!!"
        blob, encrypted = make_credential(
            ek, ak_name, secret, entropy=hashlib.sha512(b"e").digest()
        )
        assert producer.activate(blob, encrypted) == secret
        # The blob is bound to the AK's Name: bound to another Name, the TPM refuses it.
        other = b"\x00\x0b" + hashlib.sha256(b"another key").digest()
        blob, encrypted = make_credential(ek, other, secret, entropy=hashlib.sha512(b"f").digest())
        with pytest.raises(ProducerError) as info:
            producer.activate(blob, encrypted)
        assert info.value.reason == Reason.ACTIVATION_FAILED


@pytest.mark.integration
def test_make_credential_arguments(tpm):
    with TpmProducer(tpm.tcti) as producer:
        ek = parse_public(producer.public(producer.ek))
    with pytest.raises(AttestUsageError):
        make_credential(ek, b"\0\x0b" + bytes(32), b"x" * 33, entropy=bytes(64))
    with pytest.raises(AttestUsageError):
        make_credential(ek, b"\0\x0b" + bytes(32), b"x" * 16, entropy=bytes(63))
