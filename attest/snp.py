"""AMD SEV-SNP attestation report verification (SEV-SNP ABI spec, Table 22 "ATTESTATION_REPORT").

Rules:
- A report is exactly 1184 bytes, version 2, 3 or 5 (later versions fill formerly reserved
  bytes; the signed layout is otherwise the same), signature algorithm 1 (ECDSA P-384 with
  SHA-384) over bytes 0x000-0x29F, by a VCEK (signing_key 0).
- Bytes the signature does not cover must be zero: the high 24 bytes of the 72-byte
  little-endian ``r`` and ``s`` and everything after them. Otherwise a modified report would
  still verify; with this rule every single-byte change of a report is refused.
- Order: structure, unsigned bytes, signature, then contents (binding, VCEK match, policy),
  so any change to signed bytes reads ``bad-signature``.
- The VCEK must be the one for this chip and TCB: its hwID equals chip_id (unless the guest
  masked it) and its TCB extensions equal reported_tcb.
- Policy defaults are strict: debug off, no migration agent, VMPL 0.
- Pure: only ``cryptography``, ``hashlib`` and ``struct``.
"""

from __future__ import annotations

import hmac
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from attest.errors import InvalidEvidence, MalformedEvidence, PolicyViolation, Reason
from attest.snp_certs import Tcb, Vcek

__all__ = [
    "REPORT_SIZE",
    "SUPPORTED_VERSIONS",
    "SnpFacts",
    "SnpPolicy",
    "check_policy",
    "tcb_at_least",
    "verify_report",
]

REPORT_SIZE = 0x4A0
SUPPORTED_VERSIONS = frozenset({2, 3, 5})
SIGNED_END = 0x2A0
_SIG_R = 0x2A0
_SIG_S = 0x2E8
_SIG_FIELD = 72
_SIG_USED = 48  # P-384 scalars; the upper 24 bytes of each field are unsigned
_SIG_END = _SIG_S + _SIG_FIELD

_POLICY_SMT = 1 << 16
_POLICY_MIGRATE_MA = 1 << 18
_POLICY_DEBUG = 1 << 19
_POLICY_SINGLE_SOCKET = 1 << 20
_FLAG_MASK_CHIP_ID = 1 << 1
_SHA384 = ec.ECDSA(hashes.SHA384())

# Everything up to chip_id is one fixed layout in every version (little-endian).
_HEAD = struct.Struct("<IIQ16s16sIIQQII64s48s32s48s48s32s32sQBBB")


@dataclass(frozen=True, slots=True, kw_only=True)
class SnpPolicy:
    """What the verifier accepts beyond a valid signature. ``min_tcb`` is a TCB_VERSION in
    the report's encoding, compared component by component; ``measurement`` is 48 bytes."""

    allow_debug: bool = False
    allow_migration_agent: bool = False
    max_vmpl: int = 0
    min_tcb: int | None = None
    measurement: bytes | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SnpFacts:
    """What a verified report proves. TCB values are the raw little-endian TCB_VERSION."""

    product: str
    version: int
    guest_svn: int
    policy: int
    debug: bool
    migration_agent: bool
    smt: bool
    vmpl: int
    measurement: bytes
    report_data: bytes
    report_data_checked: bool
    host_data: bytes
    family_id: bytes
    image_id: bytes
    id_key_digest: bytes
    author_key_digest: bytes
    report_id: bytes
    chip_id: bytes
    platform_info: int
    current_tcb: int
    reported_tcb: int
    committed_tcb: int
    launch_tcb: int
    reported_tcb_parts: Tcb
    cpuid: tuple[int, int, int] | None  # family, model, stepping; version 3 and later


def tcb_at_least(tcb: int, minimum: int) -> bool:
    """True when every component of ``tcb`` is at least that of ``minimum``.

    Both are TCB_VERSION values of the same product; each byte is one component (or
    reserved, hence zero in both), so byte-wise comparison is right for every layout.
    """
    return all((tcb >> shift) & 0xFF >= (minimum >> shift) & 0xFF for shift in range(0, 64, 8))


def verify_report(
    report: bytes,
    vcek: Vcek,
    *,
    report_data: bytes | None,
    policy: SnpPolicy | None = None,
) -> SnpFacts:
    """Verify a raw 1184-byte report against a VCEK whose chain already verified.

    ``report_data`` is the expected 64-byte REPORT_DATA (the binding); ``None`` skips the
    check and the facts say ``report_data_checked=False``.

    Raises MalformedEvidence (MALFORMED, UNSUPPORTED, NONZERO_RESERVED), InvalidEvidence
    (BAD_SIGNATURE, NONCE_MISMATCH, CERTIFICATE_MISMATCH) and PolicyViolation (DEBUG_ENABLED,
    MIGRATION_AGENT, VMPL, TCB_TOO_LOW, MEASUREMENT_MISMATCH).
    """
    report = bytes(report)
    if len(report) != REPORT_SIZE:
        raise MalformedEvidence(
            Reason.MALFORMED, f"report is {len(report)} bytes, not {REPORT_SIZE}"
        )
    (
        version,
        guest_svn,
        guest_policy,
        family_id,
        image_id,
        vmpl,
        sig_algo,
        current_tcb,
        platform_info,
        flags,
        _reserved,
        data,
        measurement,
        host_data,
        id_key_digest,
        author_key_digest,
        report_id,
        _report_id_ma,
        reported_tcb,
        cpuid_fam,
        cpuid_mod,
        cpuid_step,
    ) = _HEAD.unpack_from(report)
    if version not in SUPPORTED_VERSIONS:
        raise MalformedEvidence(Reason.UNSUPPORTED, f"report version {version} is unsupported")
    if sig_algo != 1:
        raise MalformedEvidence(Reason.UNSUPPORTED, f"signature algorithm {sig_algo} is not 1")
    if (flags >> 2) & 7 != 0:
        raise MalformedEvidence(Reason.UNSUPPORTED, "report is not signed by a VCEK")
    if (
        any(report[_SIG_R + _SIG_USED : _SIG_S])
        or any(report[_SIG_S + _SIG_USED : _SIG_END])
        or any(report[_SIG_END:])
    ):
        raise MalformedEvidence(
            Reason.NONZERO_RESERVED, "bytes outside the signed region are not zero"
        )
    r = int.from_bytes(report[_SIG_R : _SIG_R + _SIG_USED], "little")
    s = int.from_bytes(report[_SIG_S : _SIG_S + _SIG_USED], "little")
    try:
        vcek.key.verify(encode_dss_signature(r, s), report[:SIGNED_END], _SHA384)
    except InvalidSignature:
        raise InvalidEvidence(
            Reason.BAD_SIGNATURE, "the report's signature does not verify with this VCEK"
        ) from None

    if report_data is not None and not hmac.compare_digest(data, report_data):
        raise InvalidEvidence(
            Reason.NONCE_MISMATCH, "the report answers a different nonce: stale or replayed"
        )
    chip_id = report[0x1A0:0x1E0]
    if not flags & _FLAG_MASK_CHIP_ID and chip_id[: len(vcek.hwid)] != vcek.hwid:
        raise InvalidEvidence(Reason.CERTIFICATE_MISMATCH, "the VCEK is for another chip")
    parts = Tcb.decode(reported_tcb, vcek.product)
    if parts != vcek.tcb:
        raise InvalidEvidence(
            Reason.CERTIFICATE_MISMATCH, "the VCEK is for another TCB than the report's"
        )
    (committed_tcb,) = struct.unpack_from("<Q", report, 0x1E0)
    (launch_tcb,) = struct.unpack_from("<Q", report, 0x1F0)
    facts = SnpFacts(
        product=vcek.product.value,
        version=version,
        guest_svn=guest_svn,
        policy=guest_policy,
        debug=bool(guest_policy & _POLICY_DEBUG),
        migration_agent=bool(guest_policy & _POLICY_MIGRATE_MA),
        smt=bool(guest_policy & _POLICY_SMT),
        vmpl=vmpl,
        measurement=measurement,
        report_data=data,
        report_data_checked=report_data is not None,
        host_data=host_data,
        family_id=family_id,
        image_id=image_id,
        id_key_digest=id_key_digest,
        author_key_digest=author_key_digest,
        report_id=report_id,
        chip_id=chip_id,
        platform_info=platform_info,
        current_tcb=current_tcb,
        reported_tcb=reported_tcb,
        committed_tcb=committed_tcb,
        launch_tcb=launch_tcb,
        reported_tcb_parts=parts,
        cpuid=(cpuid_fam, cpuid_mod, cpuid_step) if version >= 3 else None,
    )
    check_policy(facts, policy or SnpPolicy())
    return facts


def check_policy(facts: SnpFacts, policy: SnpPolicy) -> SnpFacts:
    """Return ``facts`` if they satisfy ``policy``; raise PolicyViolation otherwise."""
    if facts.debug and not policy.allow_debug:
        raise PolicyViolation(
            Reason.DEBUG_ENABLED, "the guest allows debugging: its memory is open"
        )
    if facts.migration_agent and not policy.allow_migration_agent:
        raise PolicyViolation(Reason.MIGRATION_AGENT, "the guest allows a migration agent")
    if facts.vmpl > policy.max_vmpl:
        raise PolicyViolation(
            Reason.VMPL, f"report came from VMPL {facts.vmpl}, above {policy.max_vmpl}"
        )
    if policy.min_tcb is not None and not tcb_at_least(facts.reported_tcb, policy.min_tcb):
        raise PolicyViolation(
            Reason.TCB_TOO_LOW,
            f"TCB {facts.reported_tcb:016x} is below the minimum {policy.min_tcb:016x}",
        )
    if policy.measurement is not None and not hmac.compare_digest(
        facts.measurement, policy.measurement
    ):
        raise PolicyViolation(
            Reason.MEASUREMENT_MISMATCH, "the guest's launch measurement is not the expected one"
        )
    return facts
