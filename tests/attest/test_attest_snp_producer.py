"""The SNP producer on a machine that is not an SNP guest, and its certificate table."""

from __future__ import annotations

import struct
import uuid

import pytest

from attest.errors import ProducerError, Reason
from attest.producers.snp import SnpProducer, parse_cert_table


def test_not_a_guest_cannot_produce(tmp_path):
    producer = SnpProducer(tsm_root=tmp_path / "tsm", device=tmp_path / "sev-guest")
    with pytest.raises(ProducerError) as info:
        producer.evidence(provider_key=bytes(32), nonce=bytes(16), terms_hash=bytes(32))
    assert info.value.reason == Reason.CANNOT_PRODUCE
    assert "not an SEV-SNP guest" in str(info.value)


def test_cert_table():
    vcek = uuid.UUID("63da758d-e664-4564-adc5-f4b93be8accd")
    ark = uuid.UUID("c0b406a4-a803-4952-9743-3fb6014cd0ae")
    header = 3 * 24
    table = (
        vcek.bytes_le
        + struct.pack("<II", header, 3)
        + ark.bytes_le
        + struct.pack("<II", header + 3, 2)
        + bytes(24)
        + b"abcde"
    )
    assert parse_cert_table(table) == {vcek: b"abc", ark: b"de"}
    with pytest.raises(ProducerError):
        parse_cert_table(vcek.bytes_le + struct.pack("<II", 0, 999) + bytes(24))
