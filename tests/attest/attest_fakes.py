"""A stand-in AMD key hierarchy and report signer, for report versions and products that
no real vector here covers. The verifier is told to pin this fake ARK, never AMD's."""

from __future__ import annotations

import datetime
import hashlib
import struct
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from attest.snp_certs import Product

PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48)
NOT_BEFORE = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
NOT_AFTER = datetime.datetime(2034, 1, 1, tzinfo=datetime.UTC)
AT = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)
CHIP_ID = bytes(range(64))
MILAN_TCB = 0x7308000000000003  # ucode 0x73, snp 8, tee 0, bootloader 3
TURIN_TCB = 0x4800000009010205  # ucode 0x48, snp 9, tee 1, bootloader 2, fmc 5


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _der_int(value: int) -> bytes:
    body = value.to_bytes(max(1, (value.bit_length() + 8) // 8), "big")
    return bytes([0x02, len(body)]) + body


def _cert(subject: str, issuer: str, key, signer, extensions=()) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key)
        .serial_number(1)
        .not_valid_before(NOT_BEFORE)
        .not_valid_after(NOT_AFTER)
    )
    for oid, value in extensions:
        builder = builder.add_extension(
            x509.UnrecognizedExtension(x509.ObjectIdentifier(oid), value), critical=False
        )
    return builder.sign(signer, hashes.SHA384(), rsa_padding=PSS)


@dataclass
class FakeAmd:
    product: Product
    ark_key: rsa.RSAPrivateKey
    ask_key: rsa.RSAPrivateKey
    vcek_key: ec.EllipticCurvePrivateKey
    ark: x509.Certificate
    ask: x509.Certificate
    tcb: int

    @property
    def pinned(self) -> dict[bytes, Product]:
        return {
            hashlib.sha256(self.ark.public_bytes(serialization.Encoding.DER)).digest(): self.product
        }

    @property
    def chain_pem(self) -> bytes:
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (self.ask, self.ark))

    def vcek_der(
        self, *, tcb: int | None = None, hwid: bytes | None = None, name: str | None = None
    ) -> bytes:
        tcb = self.tcb if tcb is None else tcb
        b = tcb.to_bytes(8, "little")
        turin = self.product == Product.TURIN
        bl, tee, snp, ucode = (b[1], b[2], b[3], b[7]) if turin else (b[0], b[1], b[6], b[7])
        exts = [
            ("1.3.6.1.4.1.3704.1.1", _der_int(0)),
            (
                "1.3.6.1.4.1.3704.1.2",
                b"\x16" + bytes([len(n := (name or f"{self.product.value}-B0"))]) + n.encode(),
            ),
            ("1.3.6.1.4.1.3704.1.3.1", _der_int(bl)),
            ("1.3.6.1.4.1.3704.1.3.2", _der_int(tee)),
            ("1.3.6.1.4.1.3704.1.3.3", _der_int(snp)),
            ("1.3.6.1.4.1.3704.1.3.8", _der_int(ucode)),
            ("1.3.6.1.4.1.3704.1.4", hwid if hwid is not None else CHIP_ID[: 8 if turin else 64]),
        ]
        if turin:
            exts.append(("1.3.6.1.4.1.3704.1.3.9", _der_int(b[0])))
        cert = _cert(
            "SEV-VCEK", f"SEV-{self.product.value}", self.vcek_key.public_key(), self.ask_key, exts
        )
        return cert.public_bytes(serialization.Encoding.DER)

    def report(
        self,
        *,
        version: int = 2,
        policy: int = 0x30000,
        vmpl: int = 0,
        report_data: bytes = b"\0" * 64,
        measurement: bytes = b"\x11" * 48,
        chip_id: bytes = CHIP_ID,
        tcb: int | None = None,
        flags: int = 0,
    ) -> bytes:
        tcb = self.tcb if tcb is None else tcb
        body = bytearray(0x4A0)
        struct.pack_into("<IIQ", body, 0, version, 1, policy)
        struct.pack_into("<IIQQI", body, 0x30, vmpl, 1, tcb, 1, flags)
        body[0x50:0x90] = report_data
        body[0x90:0xC0] = measurement
        struct.pack_into("<Q", body, 0x180, tcb)
        if version >= 3:
            fam_mod = (0x1A, 0x02) if self.product == Product.TURIN else (0x19, 0x01)
            struct.pack_into("<BBB", body, 0x188, *fam_mod, 1)
        body[0x1A0:0x1E0] = chip_id
        struct.pack_into("<Q", body, 0x1E0, tcb)
        struct.pack_into("<Q", body, 0x1F0, tcb)
        if version >= 5:
            struct.pack_into("<QQ", body, 0x1F8, 1, 1)
        r, s = decode_dss_signature(
            self.vcek_key.sign(bytes(body[:0x2A0]), ec.ECDSA(hashes.SHA384()))
        )
        body[0x2A0:0x2D0] = r.to_bytes(48, "little")
        body[0x2E8:0x318] = s.to_bytes(48, "little")
        return bytes(body)


def make_fake_amd(product: Product, tcb: int) -> FakeAmd:
    ark_key = rsa.generate_private_key(65537, 2048)
    ask_key = rsa.generate_private_key(65537, 2048)
    ark = _cert(f"ARK-{product.value}", f"ARK-{product.value}", ark_key.public_key(), ark_key)
    ask = _cert(f"SEV-{product.value}", f"ARK-{product.value}", ask_key.public_key(), ark_key)
    return FakeAmd(
        product=product,
        ark_key=ark_key,
        ask_key=ask_key,
        vcek_key=ec.generate_private_key(ec.SECP384R1()),
        ark=ark,
        ask=ask,
        tcb=tcb,
    )
