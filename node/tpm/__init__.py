"""The provider's TPM on the wire: evidence for proposals, enrolment of buyers
(spec/attestation.md §3.1), and a software TPM (swtpm) for providers without a device."""

from node.tpm.attestor import (
    AkTrust,
    Attestor,
    EnrolmentError,
    TpmAttestor,
    enrol,
    open_swtpm_attestor,
    serve_enrolment,
)
from node.tpm.swtpm import Swtpm, SwtpmError

__all__ = [
    "AkTrust",
    "Attestor",
    "EnrolmentError",
    "Swtpm",
    "SwtpmError",
    "TpmAttestor",
    "enrol",
    "open_swtpm_attestor",
    "serve_enrolment",
]
