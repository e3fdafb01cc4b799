"""The trust a bid asks for, checked against verified facts (spec/attestation.md §Policy).

Rules:
- ``none`` accepts anything, including no evidence. ``tpm`` needs a verified TPM quote and
  ``sev-snp`` a verified SNP report: one kind does not stand in for the other, since they
  prove different things (a measured boot versus an encrypted, measured guest).
- ``pcrs`` (``{"sha256:7": "<hex>"}``) must each be covered by the quote with that value.
- ``measurement`` and ``min_tcb`` apply to SNP reports; the TCB is compared per component.
- Pure.
"""

from __future__ import annotations

import dataclasses
import re

from attest.errors import AttestUsageError, PolicyViolation, Reason
from attest.snp import SnpFacts, SnpPolicy, check_policy
from attest.tpm import QuoteFacts
from protocol.messages import TrustLevel, TrustRequirement

__all__ = ["can_satisfy", "check_requirement"]

_PCR_KEY = re.compile(r"(sha1|sha256|sha384|sha512):([0-9]|1[0-9]|2[0-3])\Z")


def can_satisfy(offered: tuple[TrustLevel, ...], requirement: TrustRequirement) -> bool:
    """Can an offer advertising ``offered`` possibly meet ``requirement``? (for matching)"""
    return requirement.level == TrustLevel.NONE or requirement.level in offered


def check_requirement(
    requirement: TrustRequirement,
    facts: QuoteFacts | SnpFacts | None,
    *,
    snp_base: SnpPolicy | None = None,
) -> QuoteFacts | SnpFacts | None:
    """Return ``facts`` if they satisfy ``requirement``.

    ``snp_base`` carries the verifier's own SNP settings (debug, migration agent, VMPL);
    the requirement adds measurement and minimum TCB. Raises PolicyViolation (TRUST_LEVEL,
    PCR_MISMATCH, TCB_TOO_LOW, MEASUREMENT_MISMATCH, ...) and AttestUsageError(BAD_ARGUMENT)
    for a malformed PCR key in the requirement.
    """
    level = requirement.level
    if level == TrustLevel.NONE:
        return facts
    if level == TrustLevel.TPM:
        if not isinstance(facts, QuoteFacts):
            raise PolicyViolation(Reason.TRUST_LEVEL, "the bid requires a verified TPM quote")
        for key, expected in sorted(requirement.pcrs.items()):
            if not _PCR_KEY.match(key):
                raise AttestUsageError(Reason.BAD_ARGUMENT, f"PCR key {key!r} is not like sha256:7")
            value = facts.pcrs.get(key)
            if value is None:
                raise PolicyViolation(Reason.PCR_MISMATCH, f"the quote does not cover {key}")
            if value.hex() != expected.lower():
                raise PolicyViolation(Reason.PCR_MISMATCH, f"{key} is not the expected value")
        return facts
    if not isinstance(facts, SnpFacts):
        raise PolicyViolation(Reason.TRUST_LEVEL, "the bid requires a verified SEV-SNP report")
    policy = dataclasses.replace(
        snp_base or SnpPolicy(), min_tcb=requirement.min_tcb, measurement=requirement.measurement
    )
    return check_policy(facts, policy)
