"""TPM 2.0 structures the verifier reads: TPMT_PUBLIC, TPMS_ATTEST, TPMT_SIGNATURE.

Rules:
- Big-endian, as TPM 2.0 Part 2 marshals them. Every parse consumes the whole input:
  trailing bytes are ``malformed`` (a second structure smuggled after the first must not be
  ignored).
- Parsing only parses: it raises :class:`MalformedEvidence` or, for algorithms this package
  does not verify, ``unsupported``; whether the values are acceptable is ``attest.tpm``'s job.
- Pure: no I/O, only ``struct`` and ``hashlib``.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import struct
from dataclasses import dataclass
from typing import NamedTuple

from attest.errors import MalformedEvidence, Reason

__all__ = [
    "TPM_GENERATED_VALUE",
    "Alg",
    "Attest",
    "EccCurve",
    "ObjectAttr",
    "PcrSelection",
    "Public",
    "Signature",
    "hash_name",
    "hash_size",
    "object_name",
    "parse_attest",
    "parse_public",
    "parse_signature",
]

TPM_GENERATED_VALUE = 0xFF544347  # "\xffTCG": the TPM made this structure (Part 2 §6.2)
TPM_ST_ATTEST_QUOTE = 0x8018


class Alg(enum.IntEnum):
    """TPM_ALG_ID values used here (Part 2 §6.3)."""

    RSA = 0x0001
    SHA1 = 0x0004
    HMAC = 0x0005
    AES = 0x0006
    KEYEDHASH = 0x0008
    XOR = 0x000A
    SHA256 = 0x000B
    SHA384 = 0x000C
    SHA512 = 0x000D
    NULL = 0x0010
    RSASSA = 0x0014
    RSAES = 0x0015
    RSAPSS = 0x0016
    OAEP = 0x0017
    ECDSA = 0x0018
    ECDH = 0x0019
    ECDAA = 0x001A
    SM2 = 0x001B
    ECSCHNORR = 0x001C
    ECC = 0x0023
    SYMCIPHER = 0x0025
    CFB = 0x0043


class EccCurve(enum.IntEnum):
    NIST_P256 = 0x0003
    NIST_P384 = 0x0004


class ObjectAttr(enum.IntFlag):
    """TPMA_OBJECT bits (Part 2 §8.3)."""

    FIXED_TPM = 1 << 1
    ST_CLEAR = 1 << 2
    FIXED_PARENT = 1 << 4
    SENSITIVE_DATA_ORIGIN = 1 << 5
    USER_WITH_AUTH = 1 << 6
    ADMIN_WITH_POLICY = 1 << 7
    NO_DA = 1 << 10
    ENCRYPTED_DUPLICATION = 1 << 11
    RESTRICTED = 1 << 16
    DECRYPT = 1 << 17
    SIGN_ENCRYPT = 1 << 18


_HASH_NAMES = {Alg.SHA1: "sha1", Alg.SHA256: "sha256", Alg.SHA384: "sha384", Alg.SHA512: "sha512"}
_HASH_SIZES = {Alg.SHA1: 20, Alg.SHA256: 32, Alg.SHA384: 48, Alg.SHA512: 64}


def hash_name(alg: Alg) -> str:
    """``"sha256"`` for Alg.SHA256; raises MalformedEvidence(UNSUPPORTED) for non-hashes."""
    try:
        return _HASH_NAMES[alg]
    except KeyError:
        raise MalformedEvidence(Reason.UNSUPPORTED, f"{alg!r} is not a hash algorithm") from None


def hash_size(alg: Alg) -> int:
    """Digest size in bytes; raises like :func:`hash_name`."""
    hash_name(alg)
    return _HASH_SIZES[alg]


def object_name(name_alg: Alg, public_area: bytes) -> bytes:
    """An object's Name: nameAlg (2 bytes) || H_nameAlg(TPMT_PUBLIC) (Part 1 §16)."""
    return struct.pack(">H", name_alg) + hashlib.new(hash_name(name_alg), public_area).digest()


class _Reader:
    """A cursor over big-endian bytes that raises MalformedEvidence when it runs out."""

    __slots__ = ("buf", "pos", "what")

    def __init__(self, buf: bytes, what: str) -> None:
        self.buf = buf
        self.pos = 0
        self.what = what

    def _take(self, fmt: str, size: int) -> int:
        if self.pos + size > len(self.buf):
            raise MalformedEvidence(Reason.MALFORMED, f"{self.what} is truncated")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return int(value)

    def u8(self) -> int:
        return self._take(">B", 1)

    def u16(self) -> int:
        return self._take(">H", 2)

    def u32(self) -> int:
        return self._take(">I", 4)

    def u64(self) -> int:
        return self._take(">Q", 8)

    def raw(self, size: int) -> bytes:
        end = self.pos + size
        if end > len(self.buf):
            raise MalformedEvidence(Reason.MALFORMED, f"{self.what} is truncated")
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def tpm2b(self) -> bytes:
        return self.raw(self.u16())

    def alg(self) -> Alg:
        value = self.u16()
        try:
            return Alg(value)
        except ValueError:
            raise MalformedEvidence(
                Reason.UNSUPPORTED, f"{self.what} names unknown algorithm 0x{value:04x}"
            ) from None

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise MalformedEvidence(
                Reason.MALFORMED, f"{self.what} has {len(self.buf) - self.pos} trailing bytes"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Public:
    """A parsed TPMT_PUBLIC. ``area`` is the exact TPMT_PUBLIC bytes (the Name hashes them)."""

    area: bytes
    type: Alg
    name_alg: Alg
    attributes: ObjectAttr
    auth_policy: bytes
    symmetric: Alg  # NULL for signing keys
    symmetric_bits: int
    scheme: Alg  # NULL when the key leaves the scheme to the command
    scheme_hash: Alg  # NULL when scheme is NULL
    rsa_bits: int  # 0 for ECC
    rsa_exponent: int  # 65537 when the TPM says 0
    rsa_modulus: bytes
    curve: EccCurve | None
    ecc_x: bytes
    ecc_y: bytes

    @property
    def name(self) -> bytes:
        return object_name(self.name_alg, self.area)


def parse_public(data: bytes) -> Public:
    """Parse a TPMT_PUBLIC, or a TPM2B_PUBLIC (size-prefixed) holding one.

    Only RSA and ECC keys are understood. Raises MalformedEvidence (MALFORMED, UNSUPPORTED).
    """
    data = bytes(data)
    # A TPMT_PUBLIC starts with its type (0x0001 or 0x0023); anything else must be a
    # TPM2B_PUBLIC whose size is the rest of the input (no real key is 1 or 35 bytes long).
    if len(data) >= 2 and struct.unpack_from(">H", data)[0] not in (Alg.RSA, Alg.ECC):
        if struct.unpack_from(">H", data)[0] != len(data) - 2:
            raise MalformedEvidence(Reason.MALFORMED, "TPM2B_PUBLIC size differs from its length")
        data = data[2:]
    r = _Reader(data, "TPMT_PUBLIC")
    key_type = r.alg()
    if key_type not in (Alg.RSA, Alg.ECC):
        raise MalformedEvidence(Reason.UNSUPPORTED, f"key type {key_type.name} is not RSA or ECC")
    name_alg = r.alg()
    attributes = ObjectAttr(r.u32())
    auth_policy = r.tpm2b()
    symmetric = r.alg()
    symmetric_bits = 0
    if symmetric != Alg.NULL:
        symmetric_bits = r.u16()
        r.u16()  # mode
    scheme = r.alg()
    scheme_hash = Alg.NULL
    if scheme != Alg.NULL:
        scheme_hash = r.alg()
        if scheme == Alg.ECDAA:
            r.u16()  # count
    rsa_bits = exponent = 0
    modulus = x = y = b""
    curve: EccCurve | None = None
    if key_type == Alg.RSA:
        rsa_bits = r.u16()
        exponent = r.u32() or 65537
        modulus = r.tpm2b()
        if len(modulus) * 8 != rsa_bits:
            raise MalformedEvidence(Reason.MALFORMED, "RSA modulus size differs from keyBits")
    else:
        curve_id = r.u16()
        try:
            curve = EccCurve(curve_id)
        except ValueError:
            raise MalformedEvidence(
                Reason.UNSUPPORTED, f"ECC curve 0x{curve_id:04x} is not P-256 or P-384"
            ) from None
        if r.alg() != Alg.NULL:  # kdf scheme
            r.u16()
        x = r.tpm2b()
        y = r.tpm2b()
    r.end()
    return Public(
        area=data,
        type=key_type,
        name_alg=name_alg,
        attributes=attributes,
        auth_policy=auth_policy,
        symmetric=symmetric,
        symmetric_bits=symmetric_bits,
        scheme=scheme,
        scheme_hash=scheme_hash,
        rsa_bits=rsa_bits,
        rsa_exponent=exponent,
        rsa_modulus=modulus,
        curve=curve,
        ecc_x=x,
        ecc_y=y,
    )


class PcrSelection(NamedTuple):
    """One bank of a TPML_PCR_SELECTION: the hash and the selected indices, ascending."""

    hash: Alg
    indices: tuple[int, ...]


class Attest(NamedTuple):
    """A parsed TPMS_ATTEST of type quote. Parsed wire structures are NamedTuples: they are
    built for every quote verified, and a frozen dataclass costs several times more."""

    qualified_signer: bytes
    extra_data: bytes
    clock: int
    reset_count: int
    restart_count: int
    safe: bool
    firmware_version: int
    selections: tuple[PcrSelection, ...]
    pcr_digest: bytes


_ALGS = {int(a): a for a in Alg}
_MAGIC_TYPE = struct.Struct(">IHH")  # magic, type, qualifiedSigner size
_SIG_HEAD = struct.Struct(">HHH")  # sigAlg, hash, first TPM2B size
_SIG_SCHEMES = frozenset({0x0014, 0x0016, 0x0018})  # RSASSA, RSAPSS, ECDSA
_CLOCK_INFO = struct.Struct(">QIIBQI")  # clock, resetCount, restartCount, safe, firmware, count
_U16 = struct.Struct(">H")


def _truncated(what: str) -> MalformedEvidence:
    return MalformedEvidence(Reason.MALFORMED, f"{what} is truncated")


@functools.lru_cache(maxsize=256)
def _indices(bitmap: bytes) -> tuple[int, ...]:
    return tuple(
        8 * i + bit for i, octet in enumerate(bitmap) for bit in range(8) if octet >> bit & 1
    )


def parse_attest(data: bytes) -> Attest:
    """Parse a TPMS_ATTEST produced by TPM2_Quote.

    Raises MalformedEvidence: WRONG_TYPE for a bad magic or a non-quote type, MALFORMED else.
    """
    # Straight-line struct reads rather than _Reader: this runs for every quote verified and
    # dominates the verifier's own cost (bench/attest.py).
    data = bytes(data)
    size = len(data)
    if size < 10:
        raise _truncated("TPMS_ATTEST")
    magic, st, n = _MAGIC_TYPE.unpack_from(data)
    if magic != TPM_GENERATED_VALUE:
        raise MalformedEvidence(Reason.WRONG_TYPE, "TPMS_ATTEST magic is not TPM_GENERATED")
    if st != TPM_ST_ATTEST_QUOTE:
        raise MalformedEvidence(Reason.WRONG_TYPE, f"attestation type 0x{st:04x} is not a quote")
    signer_end = 8 + n
    if signer_end + 2 > size:
        raise _truncated("TPMS_ATTEST")
    (n,) = _U16.unpack_from(data, signer_end)
    extra_end = signer_end + 2 + n
    if extra_end + _CLOCK_INFO.size > size:
        raise _truncated("TPMS_ATTEST")
    clock, reset_count, restart_count, safe, firmware, count = _CLOCK_INFO.unpack_from(
        data, extra_end
    )
    if safe > 1:
        raise MalformedEvidence(Reason.MALFORMED, "TPMS_CLOCK_INFO.safe is not a boolean")
    if count > 16:  # more banks than any TPM implements
        raise MalformedEvidence(Reason.MALFORMED, f"{count} PCR banks selected")
    pos = extra_end + _CLOCK_INFO.size
    selections = []
    for _ in range(count):
        if pos + 3 > size:
            raise _truncated("TPMS_ATTEST")
        (alg_id,) = _U16.unpack_from(data, pos)
        alg = _ALGS.get(alg_id)
        if alg is None:
            raise MalformedEvidence(Reason.UNSUPPORTED, f"PCR bank 0x{alg_id:04x} is unknown")
        end = pos + 3 + data[pos + 2]
        if end > size:
            raise _truncated("TPMS_ATTEST")
        selections.append(PcrSelection(hash=alg, indices=_indices(data[pos + 3 : end])))
        pos = end
    if pos + 2 > size:
        raise _truncated("TPMS_ATTEST")
    (n,) = _U16.unpack_from(data, pos)
    if pos + 2 + n != size:
        raise MalformedEvidence(Reason.MALFORMED, "TPMS_ATTEST is truncated or has trailing bytes")
    return Attest(
        qualified_signer=data[8:signer_end],
        extra_data=data[signer_end + 2 : extra_end],
        clock=clock,
        reset_count=reset_count,
        restart_count=restart_count,
        safe=bool(safe),
        firmware_version=firmware,
        selections=tuple(selections),
        pcr_digest=data[pos + 2 :],
    )


class Signature(NamedTuple):
    """A parsed TPMT_SIGNATURE: RSA has ``rsa`` (big-endian), ECDSA has ``r`` and ``s``."""

    alg: Alg
    hash: Alg
    rsa: bytes = b""
    r: bytes = b""
    s: bytes = b""


def parse_signature(data: bytes) -> Signature:
    """Parse a TPMT_SIGNATURE of scheme RSASSA, RSAPSS or ECDSA.

    Raises MalformedEvidence (UNSUPPORTED for other schemes, MALFORMED else).
    """
    data = bytes(data)
    size = len(data)
    if size < 6:
        raise _truncated("TPMT_SIGNATURE")
    scheme, hash_id, n = _SIG_HEAD.unpack_from(data)
    alg, hash_alg = _ALGS.get(scheme), _ALGS.get(hash_id)
    if alg is None or scheme not in _SIG_SCHEMES or hash_alg is None:
        raise MalformedEvidence(
            Reason.UNSUPPORTED, f"signature scheme 0x{scheme:04x}/0x{hash_id:04x} is not verified"
        )
    first_end = 6 + n
    if alg != Alg.ECDSA:
        if first_end != size:
            raise MalformedEvidence(Reason.MALFORMED, "TPMT_SIGNATURE length is wrong")
        return Signature(alg=alg, hash=hash_alg, rsa=data[6:])
    if first_end + 2 > size:
        raise _truncated("TPMT_SIGNATURE")
    (m,) = _U16.unpack_from(data, first_end)
    if first_end + 2 + m != size:
        raise MalformedEvidence(Reason.MALFORMED, "TPMT_SIGNATURE length is wrong")
    return Signature(alg=alg, hash=hash_alg, r=data[6:first_end], s=data[first_end + 2 :])
