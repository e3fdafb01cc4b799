"""Credential activation: proving an AK lives on a genuine TPM (TPM 2.0 Part 1 §24).

The verifier checks the provider's EK certificate against configured roots, then encrypts a
secret to that EK, bound to the AK's Name (TPM2_MakeCredential, done here in pure Python).
Only the TPM holding the EK, with the AK loaded, can recover it (TPM2_ActivateCredential).
A correct answer proves the AK and the certified EK share one TPM; the verifier may then
trust quotes signed by that AK.

Rules:
- EK certificates are ordinary X.509 apart from the TCG extended key usage 2.23.133.8.1 and
  a critical subjectAltName of TPM attributes, which the web-PKI defaults refuse; the
  leaf's extension policy here accepts them (``../shared/PLATFORM.md``).
- The EK public area the provider sends must carry the certified key, and be a restricted
  decryption key; the AK must pass ``attest.tpm.load_attestation_key``.
- Randomness comes in as ``entropy`` (the OAEP padding of an RSA EK draws its own).
- Pure: only ``cryptography``, ``hashlib``, ``hmac`` and ``struct``.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from cryptography import x509
from cryptography.hazmat.decrepit.ciphers.modes import CFB
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.x509.verification import (
    Criticality,
    ExtensionPolicy,
    Policy,
    PolicyBuilder,
    Store,
    VerificationError,
)

from attest.errors import AttestUsageError, InvalidEvidence, MalformedEvidence, Reason
from attest.tpm import load_attestation_key
from attest.tpm_structs import Alg, ObjectAttr, Public, hash_name, hash_size, parse_public

__all__ = [
    "EK_CERTIFICATE_EKU",
    "Challenge",
    "check_activation",
    "kdfa",
    "kdfe",
    "make_challenge",
    "make_credential",
    "verify_ek_certificate",
]

EK_CERTIFICATE_EKU = x509.ObjectIdentifier("2.23.133.8.1")
_EK_REQUIRED = ObjectAttr.FIXED_TPM | ObjectAttr.FIXED_PARENT | ObjectAttr.RESTRICTED
_EK_REQUIRED |= ObjectAttr.DECRYPT


def kdfa(
    alg: Alg, key: bytes, label: bytes, context_u: bytes, context_v: bytes, bits: int
) -> bytes:
    """KDFa: SP800-108 counter-mode HMAC (Part 1 §11.4.10.2); the label gets its NUL."""
    name = hash_name(alg)
    tail = label + b"\x00" + context_u + context_v + struct.pack(">I", bits)
    out = b""
    counter = 0
    while len(out) * 8 < bits:
        counter += 1
        out += hmac.new(key, struct.pack(">I", counter) + tail, name).digest()
    return out[: (bits + 7) // 8]


def kdfe(alg: Alg, z: bytes, label: bytes, party_u: bytes, party_v: bytes, bits: int) -> bytes:
    """KDFe: SP800-56A concatenation KDF (Part 1 §11.4.10.3)."""
    name = hash_name(alg)
    tail = z + label + b"\x00" + party_u + party_v
    out = b""
    counter = 0
    while len(out) * 8 < bits:
        counter += 1
        out += hashlib.new(name, struct.pack(">I", counter) + tail).digest()
    return out[: (bits + 7) // 8]


def _ek_key(ek: Public) -> rsa.RSAPublicKey | ec.EllipticCurvePublicKey:
    try:
        if ek.curve is None:
            modulus = int.from_bytes(ek.rsa_modulus, "big")
            return rsa.RSAPublicNumbers(ek.rsa_exponent, modulus).public_key()
        curve: ec.EllipticCurve = ec.SECP256R1() if ek.curve.value == 3 else ec.SECP384R1()
        size = (curve.key_size + 7) // 8
        point = b"\x04" + ek.ecc_x.rjust(size, b"\0") + ek.ecc_y.rjust(size, b"\0")
        return ec.EllipticCurvePublicKey.from_encoded_point(curve, point)
    except ValueError as exc:
        raise MalformedEvidence(Reason.MALFORMED, f"EK public key is invalid: {exc}") from exc


def make_credential(
    ek: Public, name: bytes, secret: bytes, *, entropy: bytes
) -> tuple[bytes, bytes]:
    """TPM2_MakeCredential: return (credentialBlob, secret) as the TPM2B contents.

    ``entropy`` is at least 64 fresh random bytes. Raises MalformedEvidence(UNSUPPORTED) for
    EKs whose symmetric scheme is not AES-CFB, AttestUsageError(BAD_ARGUMENT) for a secret of
    the wrong size or too little entropy.
    """
    size = hash_size(ek.name_alg)
    if not 1 <= len(secret) <= size:
        raise AttestUsageError(Reason.BAD_ARGUMENT, f"credential must be 1 to {size} bytes")
    if len(entropy) < 64:
        raise AttestUsageError(Reason.BAD_ARGUMENT, "make_credential needs 64 bytes of entropy")
    if ek.symmetric != Alg.AES:
        raise MalformedEvidence(Reason.UNSUPPORTED, "EK symmetric algorithm is not AES")
    key = _ek_key(ek)
    algorithm = {
        Alg.SHA1: hashes.SHA1(),  # noqa: S303  OAEP with SHA-1 EKs is what the TPM does
        Alg.SHA256: hashes.SHA256(),
        Alg.SHA384: hashes.SHA384(),
        Alg.SHA512: hashes.SHA512(),
    }[ek.name_alg]
    if isinstance(key, rsa.RSAPublicKey):
        seed = entropy[:size]
        oaep = padding.OAEP(padding.MGF1(algorithm), algorithm, b"IDENTITY\x00")
        encrypted_seed = key.encrypt(seed, oaep)
    else:
        order_bytes = (key.curve.key_size + 7) // 8
        scalar = int.from_bytes(entropy, "big") % (2 ** (order_bytes * 8 - 1)) or 1
        ephemeral = ec.derive_private_key(scalar, key.curve)
        z = ephemeral.exchange(ec.ECDH(), key)
        numbers = ephemeral.public_key().public_numbers()
        ex, ey = numbers.x.to_bytes(order_bytes, "big"), numbers.y.to_bytes(order_bytes, "big")
        ek_x = ek.ecc_x.rjust(order_bytes, b"\0")
        seed = kdfe(ek.name_alg, z, b"IDENTITY", ex, ek_x, size * 8)
        encrypted_seed = struct.pack(">H", len(ex)) + ex + struct.pack(">H", len(ey)) + ey
    sym_key = kdfa(ek.name_alg, seed, b"STORAGE", name, b"", ek.symmetric_bits)
    plain = struct.pack(">H", len(secret)) + secret
    # AES-CFB with a zero IV, as the TPM decrypts it (Part 1 §24.4); cryptography calls CFB
    # decrepit, which is about its use elsewhere, not here.
    encryptor = Cipher(algorithms.AES(sym_key), CFB(b"\0" * 16)).encryptor()
    enc_identity = encryptor.update(plain) + encryptor.finalize()
    hmac_key = kdfa(ek.name_alg, seed, b"INTEGRITY", b"", b"", size * 8)
    outer = hmac.new(hmac_key, enc_identity + name, hash_name(ek.name_alg)).digest()
    return struct.pack(">H", len(outer)) + outer + enc_identity, encrypted_seed


def _check_eku(_policy: Policy, _cert: x509.Certificate, eku: x509.ExtendedKeyUsage | None) -> None:
    if eku is not None and EK_CERTIFICATE_EKU not in eku:
        raise ValueError("extended key usage lacks tcg-kp-EKCertificate (2.23.133.8.1)")


def _ek_policy() -> ExtensionPolicy:
    return ExtensionPolicy.permit_all().may_be_present(
        x509.ExtendedKeyUsage, Criticality.AGNOSTIC, _check_eku
    )


def verify_ek_certificate(
    cert: bytes,
    *,
    roots: Sequence[bytes],
    intermediates: Sequence[bytes] = (),
    at: datetime,
) -> x509.Certificate:
    """Return the EK certificate (DER) once it chains to one of ``roots`` at time ``at``.

    ``roots`` and ``intermediates`` are DER or PEM certificates. Raises
    MalformedEvidence(MALFORMED) and InvalidEvidence(UNTRUSTED_CHAIN).
    """
    leaf = _load(cert, "EK certificate")
    store = Store([_load(r, "root certificate") for r in roots])
    verifier = (
        PolicyBuilder()
        .store(store)
        .time(at)
        .extension_policies(ca_policy=ExtensionPolicy.webpki_defaults_ca(), ee_policy=_ek_policy())
        .build_client_verifier()
    )
    try:
        verifier.verify(leaf, [_load(c, "intermediate certificate") for c in intermediates])
    except VerificationError as exc:
        raise InvalidEvidence(
            Reason.UNTRUSTED_CHAIN, f"EK certificate does not chain to a trusted root: {exc}"
        ) from exc
    return leaf


def _load(data: bytes, what: str) -> x509.Certificate:
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            return x509.load_pem_x509_certificate(data)
        return x509.load_der_x509_certificate(data)
    except ValueError as exc:
        raise MalformedEvidence(Reason.MALFORMED, f"{what} is not a certificate") from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class Challenge:
    """What the verifier sends (``credential_blob``, ``encrypted_secret``) and keeps."""

    credential_blob: bytes
    encrypted_secret: bytes
    ak_name: bytes
    secret: bytes


def make_challenge(
    *,
    ek_certificate: bytes,
    ek_public: bytes,
    ak_public: bytes,
    roots: Sequence[bytes],
    intermediates: Sequence[bytes] = (),
    at: datetime,
    secret: bytes,
    entropy: bytes,
) -> Challenge:
    """Check the EK certificate and the AK, and encrypt ``secret`` for activation.

    Raises MalformedEvidence, InvalidEvidence (UNTRUSTED_CHAIN, CERTIFICATE_MISMATCH when the
    EK public area is not the certified key or not an EK, KEY_ATTRIBUTES for a bad AK).
    """
    cert = verify_ek_certificate(ek_certificate, roots=roots, intermediates=intermediates, at=at)
    ek = parse_public(ek_public)
    if ek.attributes & _EK_REQUIRED != _EK_REQUIRED or ek.attributes & ObjectAttr.SIGN_ENCRYPT:
        raise InvalidEvidence(Reason.CERTIFICATE_MISMATCH, "EK is not a restricted decryption key")
    if cert.public_key() != _ek_key(ek):
        raise InvalidEvidence(
            Reason.CERTIFICATE_MISMATCH, "the EK public area is not the key the certificate names"
        )
    ak = load_attestation_key(ak_public)
    blob, encrypted = make_credential(ek, ak.name, secret, entropy=entropy)
    return Challenge(
        credential_blob=blob, encrypted_secret=encrypted, ak_name=ak.name, secret=secret
    )


def check_activation(challenge: Challenge, answer: bytes) -> bytes:
    """Return the trusted AK Name if ``answer`` is the challenge's secret.

    Raises InvalidEvidence(ACTIVATION_FAILED) otherwise.
    """
    if not hmac.compare_digest(challenge.secret, answer):
        raise InvalidEvidence(
            Reason.ACTIVATION_FAILED, "credential activation answer is wrong: AK not on that TPM"
        )
    return challenge.ak_name
