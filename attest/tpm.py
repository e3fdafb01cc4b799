"""TPM 2.0 quote verification (TPM 2.0 Part 3 §18.4, spec/attestation.md §TPM).

Rules:
- An attestation key (AK) is loaded once (:func:`load_attestation_key`), which checks that it
  is a restricted signing key that never leaves its TPM; quotes are then verified against it.
  Whether this AK belongs to a genuine TPM is settled by credential activation
  (``attest.credential``), not here.
- Order of checks: structure, algorithms, signature, nonce, PCR selection, PCR digest. The
  signature comes before every content check, so any change to signed bytes reads
  ``bad-signature``, and the nonce and PCR reasons only describe genuine quotes.
- SHA-1 (as signature hash or PCR bank) is refused unless the caller passes
  ``allow_sha1=True``; the facts name the algorithms that were used.
- The PCR digest is recomputed with the signature's hash over the PCR values in the quote's
  selection order (banks as listed, indices ascending), as TPM2_Quote computes it.
- Pure: only ``cryptography``, ``hashlib`` and ``struct``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from attest.errors import InvalidEvidence, MalformedEvidence, Reason
from attest.tpm_structs import (
    Alg,
    EccCurve,
    ObjectAttr,
    Public,
    Signature,
    hash_name,
    hash_size,
    parse_attest,
    parse_public,
    parse_signature,
)

__all__ = ["AK_REQUIRED", "AttestationKey", "QuoteFacts", "load_attestation_key", "verify_quote"]

# A restricted signing key created inside the TPM that can never be duplicated: it only
# signs digests the TPM computed itself (Part 1 §25.2.2), so a quote cannot be forged by
# asking the AK to sign arbitrary bytes that begin with TPM_GENERATED.
AK_REQUIRED = (
    ObjectAttr.FIXED_TPM
    | ObjectAttr.FIXED_PARENT
    | ObjectAttr.SENSITIVE_DATA_ORIGIN
    | ObjectAttr.RESTRICTED
    | ObjectAttr.SIGN_ENCRYPT
)

_HASHES: dict[Alg, hashes.HashAlgorithm] = {
    Alg.SHA1: hashes.SHA1(),  # noqa: S303  only reached with allow_sha1
    Alg.SHA256: hashes.SHA256(),
    Alg.SHA384: hashes.SHA384(),
    Alg.SHA512: hashes.SHA512(),
}
_CURVES: dict[EccCurve, tuple[ec.EllipticCurve, int]] = {
    EccCurve.NIST_P256: (ec.SECP256R1(), 32),
    EccCurve.NIST_P384: (ec.SECP384R1(), 48),
}
_HASHLIB = {
    Alg.SHA1: hashlib.sha1,
    Alg.SHA256: hashlib.sha256,
    Alg.SHA384: hashlib.sha384,
    Alg.SHA512: hashlib.sha512,
}
_HASH_NAMES = {alg: hash_name(alg) for alg in _HASHES}
_HASH_SIZES = {alg: hash_size(alg) for alg in _HASHES}
_NO_VALUES: Mapping[int, bytes] = {}
_PKCS1 = padding.PKCS1v15()
_SCHEME_NAMES = {Alg.RSASSA: "rsassa", Alg.RSAPSS: "rsapss", Alg.ECDSA: "ecdsa"}
# Part 1 §B.7: verifiers accept any PSS salt size.
_PSS = {alg: padding.PSS(padding.MGF1(h), padding.PSS.AUTO) for alg, h in _HASHES.items()}
_ECDSA = {alg: ec.ECDSA(h) for alg, h in _HASHES.items()}
# "sha256:7" for every bank and index, so verifying does not format strings.
_PCR_KEYS = {(hash_name(a), i): f"{hash_name(a)}:{i}" for a in _HASHES for i in range(32)}


@dataclass(frozen=True, slots=True)
class AttestationKey:
    """A loaded AK: its parsed public area, Name, and the key object that verifies."""

    public: Public
    name: bytes
    key: rsa.RSAPublicKey | ec.EllipticCurvePublicKey
    description: str  # e.g. "rsa-2048", "ecc-p256"


@dataclass(frozen=True, slots=True, kw_only=True)
class QuoteFacts:
    """What a verified quote proves. ``pcrs`` maps ``"sha256:7"`` to the PCR value."""

    ak_name: bytes
    ak: str  # key type, e.g. "rsa-2048" or "ecc-p256"
    signature_scheme: str  # "rsassa", "rsapss" or "ecdsa"
    hash: str  # the signature's and the PCR digest's hash, e.g. "sha256"
    pcrs: dict[str, bytes]
    nonce: bytes  # the quote's extraData
    nonce_checked: bool
    clock: int
    reset_count: int  # TPM resets (reboots) since the TPM was cleared
    restart_count: int  # resumes from hibernation since the last reset
    safe: bool
    firmware_version: int


def load_attestation_key(data: bytes) -> AttestationKey:
    """Load an AK from TPMT_PUBLIC or TPM2B_PUBLIC bytes.

    Raises MalformedEvidence (MALFORMED, UNSUPPORTED) and InvalidEvidence(KEY_ATTRIBUTES)
    when the key is not a restricted signing key fixed to its TPM.
    """
    public = parse_public(data)
    attrs = public.attributes
    if attrs & AK_REQUIRED != AK_REQUIRED or attrs & ObjectAttr.DECRYPT:
        raise InvalidEvidence(
            Reason.KEY_ATTRIBUTES,
            f"AK attributes {attrs!r} are not those of a restricted signing key fixed to its TPM",
        )
    if public.scheme not in (Alg.NULL, *_SCHEME_NAMES):
        raise MalformedEvidence(
            Reason.UNSUPPORTED, f"AK scheme {public.scheme.name} is unsupported"
        )
    key: rsa.RSAPublicKey | ec.EllipticCurvePublicKey
    try:
        if public.curve is None:
            if public.rsa_bits < 2048:
                raise InvalidEvidence(
                    Reason.WEAK_ALGORITHM, f"RSA-{public.rsa_bits} AK is too weak"
                )
            modulus = int.from_bytes(public.rsa_modulus, "big")
            key = rsa.RSAPublicNumbers(public.rsa_exponent, modulus).public_key()
        else:
            curve, size = _CURVES[public.curve]
            if len(public.ecc_x) > size or len(public.ecc_y) > size:
                raise MalformedEvidence(Reason.MALFORMED, "ECC point is larger than its curve")
            point = b"\x04" + public.ecc_x.rjust(size, b"\0") + public.ecc_y.rjust(size, b"\0")
            key = ec.EllipticCurvePublicKey.from_encoded_point(curve, point)
    except ValueError as exc:
        raise MalformedEvidence(Reason.MALFORMED, f"AK public key is invalid: {exc}") from exc
    if public.curve is None:
        description = f"rsa-{public.rsa_bits}"
    else:
        description = "ecc-" + public.curve.name.lower().replace("nist_", "")
    return AttestationKey(public=public, name=public.name, key=key, description=description)


def _check_hash(alg: Alg, allow_sha1: bool, what: str) -> None:
    if alg not in _HASHES:
        raise MalformedEvidence(Reason.UNSUPPORTED, f"{what} hash {alg.name} is unsupported")
    if alg == Alg.SHA1 and not allow_sha1:
        raise InvalidEvidence(
            Reason.WEAK_ALGORITHM, f"{what} uses SHA-1; refused unless SHA-1 is allowed explicitly"
        )


def verify_quote(
    ak: AttestationKey,
    attest: bytes,
    signature: bytes,
    pcrs: Mapping[str, Mapping[int, bytes]],
    *,
    nonce: bytes | None,
    allow_sha1: bool = False,
) -> QuoteFacts:
    """Verify a TPM2_Quote: ``attest`` is the TPMS_ATTEST, ``signature`` the TPMT_SIGNATURE.

    ``pcrs`` maps a bank name (``"sha256"``) to PCR index to value, and must hold exactly the
    PCRs the quote selects. ``nonce`` is the expected extraData (qualifying data); ``None``
    skips that check, and the facts then say ``nonce_checked=False``.

    Raises MalformedEvidence (MALFORMED, UNSUPPORTED, WRONG_TYPE) and InvalidEvidence
    (WEAK_ALGORITHM, BAD_SIGNATURE, NONCE_MISMATCH, PCR_SELECTION_MISMATCH,
    PCR_DIGEST_MISMATCH).
    """
    sig = parse_signature(signature)
    quote = parse_attest(attest)
    public = ak.public
    _check_hash(sig.hash, allow_sha1, "signature")
    if public.scheme != Alg.NULL and (public.scheme, public.scheme_hash) != (sig.alg, sig.hash):
        raise InvalidEvidence(
            Reason.BAD_SIGNATURE,
            f"signature is {sig.alg.name}/{sig.hash.name} but the AK only signs "
            f"{public.scheme.name}/{public.scheme_hash.name}",
        )
    _verify_signature(ak, sig, attest)

    if nonce is not None and not hmac.compare_digest(quote.extra_data, nonce):
        raise InvalidEvidence(
            Reason.NONCE_MISMATCH, "the quote answers a different nonce: stale or replayed"
        )

    selected: list[bytes] = []
    facts_pcrs: dict[str, bytes] = {}
    for selection in quote.selections:
        bank_alg = selection.hash
        _check_hash(bank_alg, allow_sha1, "PCR bank")
        bank = _HASH_NAMES[bank_alg]
        values = pcrs.get(bank, _NO_VALUES)
        size = _HASH_SIZES[bank_alg]
        for index in selection.indices:
            value = values.get(index)
            if value is None:
                raise InvalidEvidence(
                    Reason.PCR_SELECTION_MISMATCH,
                    f"the quote covers {bank}:{index}, no value given",
                )
            if len(value) != size:
                raise MalformedEvidence(Reason.MALFORMED, f"{bank}:{index} is not {size} bytes")
            selected.append(value)
            facts_pcrs[_PCR_KEYS.get((bank, index)) or f"{bank}:{index}"] = value
    # Every value given must be covered, once: equal counts plus the lookups above suffice.
    if len(facts_pcrs) != len(selected) or sum(map(len, pcrs.values())) != len(selected):
        raise InvalidEvidence(
            Reason.PCR_SELECTION_MISMATCH, "PCR values were given that the quote does not cover"
        )
    digest = _HASHLIB[sig.hash](b"".join(selected)).digest()
    if not hmac.compare_digest(digest, quote.pcr_digest):
        raise InvalidEvidence(
            Reason.PCR_DIGEST_MISMATCH, "the PCR values given are not the ones the TPM quoted"
        )
    return QuoteFacts(
        ak_name=ak.name,
        ak=ak.description,
        signature_scheme=_SCHEME_NAMES[sig.alg],
        hash=_HASH_NAMES[sig.hash],
        pcrs=facts_pcrs,
        nonce=quote.extra_data,
        nonce_checked=nonce is not None,
        clock=quote.clock,
        reset_count=quote.reset_count,
        restart_count=quote.restart_count,
        safe=quote.safe,
        firmware_version=quote.firmware_version,
    )


def _verify_signature(ak: AttestationKey, sig: Signature, msg: bytes) -> None:
    # Dispatch on the parsed key type, not isinstance: ABC checks cost as much as the parse.
    try:
        if ak.public.curve is None:
            if sig.alg == Alg.ECDSA:
                raise InvalidEvidence(
                    Reason.BAD_SIGNATURE, "an RSA AK cannot make ECDSA signatures"
                )
            pad = _PKCS1 if sig.alg == Alg.RSASSA else _PSS[sig.hash]
            cast(rsa.RSAPublicKey, ak.key).verify(sig.rsa, msg, pad, _HASHES[sig.hash])
        else:
            if sig.alg != Alg.ECDSA:
                raise InvalidEvidence(
                    Reason.BAD_SIGNATURE, f"an ECC AK cannot make {sig.alg.name} signatures"
                )
            der = encode_dss_signature(int.from_bytes(sig.r, "big"), int.from_bytes(sig.s, "big"))
            cast(ec.EllipticCurvePublicKey, ak.key).verify(der, msg, _ECDSA[sig.hash])
    except InvalidSignature:
        raise InvalidEvidence(
            Reason.BAD_SIGNATURE, "the quote's signature does not verify with this AK"
        ) from None
