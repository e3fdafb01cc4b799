"""AMD SEV-SNP key chain: VCEK -> ASK -> ARK, with the ARK pinned (spec/attestation.md §SNP).

Rules:
- Roots are never fetched: the evidence carries VCEK, ASK and ARK, and the ARK must be one
  of the pinned certificates (SHA-256 of its DER encoding). The pin says the product line.
- Every link is RSASSA-PSS with SHA-384 and a 48-byte salt, as AMD's key distribution
  service issues them; anything else is ``untrusted-chain``.
- The VCEK's AMD extensions (product name, TCB components, hardware id) are decoded here so
  the report verifier can compare them with the report. Turin encodes the TCB differently
  and has an 8-byte hardware id.
- Pure: time comes in as an argument; only ``cryptography`` and ``hashlib``.
"""

from __future__ import annotations

import enum
import hashlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import SignatureAlgorithmOID

from attest.errors import InvalidEvidence, MalformedEvidence, Reason

__all__ = ["PINNED_ARKS", "Product", "Tcb", "Vcek", "load_vcek_chain"]


class Product(enum.StrEnum):
    MILAN = "Milan"
    GENOA = "Genoa"
    TURIN = "Turin"


# SHA-256 of the DER of AMD's ARK per product line (../shared/testvectors/README.md).
PINNED_ARKS: Mapping[bytes, Product] = {
    bytes.fromhex(
        "69d063b45344d26a2e94e1f4210de49ef555308287d4c174445c95639a540bcd"
    ): Product.MILAN,
    bytes.fromhex(
        "4c6598d19c18719c5dfd4a7d335f674e5bfe1d8f800cea2cf270c10d103db2f1"
    ): Product.GENOA,
    bytes.fromhex(
        "1f084161a44bb6d93778a904877d4819cafa5d05ef4193b2ded9dd9c73dd3f6a"
    ): Product.TURIN,
}

_AMD = "1.3.6.1.4.1.3704.1."
_OID_PRODUCT = x509.ObjectIdentifier(_AMD + "2")
_OID_BL = x509.ObjectIdentifier(_AMD + "3.1")
_OID_TEE = x509.ObjectIdentifier(_AMD + "3.2")
_OID_SNP = x509.ObjectIdentifier(_AMD + "3.3")
_OID_UCODE = x509.ObjectIdentifier(_AMD + "3.8")
_OID_FMC = x509.ObjectIdentifier(_AMD + "3.9")
_OID_HWID = x509.ObjectIdentifier(_AMD + "4")
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48)


@dataclass(frozen=True, slots=True, kw_only=True)
class Tcb:
    """TCB component security patch levels; ``fmc`` exists on Turin only."""

    bootloader: int
    tee: int
    snp: int
    microcode: int
    fmc: int | None = None

    @classmethod
    def decode(cls, value: int, product: Product) -> Tcb:
        """Split a little-endian TCB_VERSION (as in the report) by the product's layout."""
        b = value.to_bytes(8, "little")
        if product == Product.TURIN:
            return cls(fmc=b[0], bootloader=b[1], tee=b[2], snp=b[3], microcode=b[7])
        return cls(bootloader=b[0], tee=b[1], snp=b[6], microcode=b[7])


@dataclass(frozen=True, slots=True, kw_only=True)
class Vcek:
    """A VCEK whose chain to a pinned ARK verified; load once, verify many reports."""

    product: Product
    product_name: str  # as the VCEK says, e.g. "Milan-B0"
    key: ec.EllipticCurvePublicKey
    tcb: Tcb
    hwid: bytes  # 64 bytes (Milan, Genoa) or 8 bytes (Turin)
    ark_sha256: bytes


def _load_certs(data: bytes, what: str) -> list[x509.Certificate]:
    with warnings.catch_warnings():
        # Real VCEKs have serial number 0, which cryptography warns about.
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)
        try:
            if data.lstrip().startswith(b"-----BEGIN"):
                return x509.load_pem_x509_certificates(data)
            return [x509.load_der_x509_certificate(data)]
        except ValueError as exc:
            raise MalformedEvidence(Reason.MALFORMED, f"{what} is not a certificate") from exc


def _check_signed_by(cert: x509.Certificate, issuer: x509.Certificate, what: str) -> None:
    key = issuer.public_key()
    if cert.signature_algorithm_oid != SignatureAlgorithmOID.RSASSA_PSS or not isinstance(
        key, rsa.RSAPublicKey
    ):
        raise InvalidEvidence(Reason.UNTRUSTED_CHAIN, f"{what} is not signed with RSA-PSS")
    if cert.issuer != issuer.subject:
        raise InvalidEvidence(Reason.UNTRUSTED_CHAIN, f"{what} names another issuer")
    try:
        key.verify(cert.signature, cert.tbs_certificate_bytes, _PSS, hashes.SHA384())
    except InvalidSignature:
        raise InvalidEvidence(Reason.UNTRUSTED_CHAIN, f"{what}'s signature is invalid") from None


def _check_time(cert: x509.Certificate, at: datetime, what: str) -> None:
    if not cert.not_valid_before_utc <= at <= cert.not_valid_after_utc:
        raise InvalidEvidence(Reason.UNTRUSTED_CHAIN, f"{what} is not valid at {at.isoformat()}")


def _der_value(data: bytes, tag: int, what: str) -> bytes:
    """The contents of one short DER TLV with ``tag`` (AMD's extensions are all short)."""
    if len(data) < 2 or data[0] != tag or data[1] >= 0x80 or len(data) != 2 + data[1]:
        raise MalformedEvidence(Reason.MALFORMED, f"VCEK extension {what} is not valid DER")
    return data[2:]


def _extension(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> bytes:
    try:
        ext = cert.extensions.get_extension_for_oid(oid)
    except x509.ExtensionNotFound:
        raise MalformedEvidence(
            Reason.MALFORMED, f"VCEK lacks AMD extension {oid.dotted_string}"
        ) from None
    value = ext.value
    if not isinstance(value, x509.UnrecognizedExtension):
        raise MalformedEvidence(Reason.MALFORMED, f"VCEK extension {oid.dotted_string} is odd")
    return value.value


def _spl(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> int:
    value = int.from_bytes(_der_value(_extension(cert, oid), 0x02, oid.dotted_string), "big")
    if not 0 <= value <= 255:
        raise MalformedEvidence(Reason.MALFORMED, f"VCEK {oid.dotted_string} is not one byte")
    return value


def load_vcek_chain(
    vcek: bytes,
    chain: bytes,
    *,
    at: datetime,
    pinned: Mapping[bytes, Product] = PINNED_ARKS,
) -> Vcek:
    """Verify VCEK -> ASK -> ARK and decode the VCEK's extensions.

    ``vcek`` is DER or PEM; ``chain`` is PEM holding the ASK then the ARK. ``at`` is the time
    (aware, UTC) at which every certificate must be valid.

    Raises MalformedEvidence (MALFORMED), InvalidEvidence (UNTRUSTED_ROOT when the ARK is not
    pinned, UNTRUSTED_CHAIN for a broken link or a product mismatch).
    """
    leaves = _load_certs(vcek, "VCEK")
    certs = _load_certs(chain, "certificate chain")
    if len(leaves) != 1 or len(certs) != 2:
        raise MalformedEvidence(
            Reason.MALFORMED, "expected one VCEK and a chain of exactly ASK then ARK"
        )
    (leaf,) = leaves
    ask, ark = certs
    ark_sha256 = hashlib.sha256(ark.public_bytes(Encoding.DER)).digest()
    product = pinned.get(ark_sha256)
    if product is None:
        raise InvalidEvidence(
            Reason.UNTRUSTED_ROOT, f"ARK {ark_sha256.hex()[:16]}... is not a pinned AMD root"
        )
    _check_signed_by(ark, ark, "ARK")
    _check_signed_by(ask, ark, "ASK")
    _check_signed_by(leaf, ask, "VCEK")
    for cert, what in ((ark, "ARK"), (ask, "ASK"), (leaf, "VCEK")):
        _check_time(cert, at, what)
    key = leaf.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp384r1":
        raise InvalidEvidence(Reason.UNTRUSTED_CHAIN, "VCEK key is not ECDSA P-384")

    name = _der_value(_extension(leaf, _OID_PRODUCT), 0x16, "productName").decode(
        "ascii", "replace"
    )
    if name.split("-")[0] != product.value:
        raise InvalidEvidence(
            Reason.UNTRUSTED_CHAIN, f"VCEK is for {name!r} but its root is {product.value}'s"
        )
    hwid = _extension(leaf, _OID_HWID)
    if len(hwid) != (8 if product == Product.TURIN else 64):
        raise MalformedEvidence(Reason.MALFORMED, f"VCEK hwID is {len(hwid)} bytes")
    tcb = Tcb(
        bootloader=_spl(leaf, _OID_BL),
        tee=_spl(leaf, _OID_TEE),
        snp=_spl(leaf, _OID_SNP),
        microcode=_spl(leaf, _OID_UCODE),
        fmc=_spl(leaf, _OID_FMC) if product == Product.TURIN else None,
    )
    return Vcek(
        product=product, product_name=name, key=key, tcb=tcb, hwid=hwid, ark_sha256=ark_sha256
    )
