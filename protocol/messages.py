"""The messages of a trade, as frozen dataclasses (spec/messages.md).

Units, everywhere: money in micro-credits (int), time in milliseconds since the Unix epoch or
as a duration (``*_ms``), CPU in millicores, memory and disk in bytes. Digests are
``sha256:<64 hex>`` strings (OCI style); peer keys are 32 raw Ed25519 bytes.

Order of a trade: Offer / Bid (gossiped) -> Proposal (buyer to provider, carries the terms
and the attestation nonce) -> Accept (with evidence and the provider's signature over the
terms) or Reject -> Agreement (both signatures over the same terms bytes) -> JobStatus
events -> UsageReceipt (provider-signed) -> CountersignedReceipt (buyer adds its signature).

TPM enrolment, once per buyer and provider before the first TPM quote is trusted
(spec/attestation.md §3.1): Enrolment (provider) -> ActivationChallenge (buyer) ->
ActivationAnswer (provider).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from protocol.schema import SignedInt

__all__ = [
    "LOG_CAP_BYTES",
    "LOG_PATHS",
    "Accept",
    "ActivationAnswer",
    "ActivationChallenge",
    "Arch",
    "Bid",
    "Cancel",
    "Checkpoint",
    "Constraints",
    "DataRef",
    "Enrolment",
    "Evidence",
    "ExitReason",
    "Gpu",
    "JobSpec",
    "JobState",
    "JobStatus",
    "Offer",
    "Prices",
    "Proposal",
    "Reject",
    "RejectReason",
    "Resources",
    "SignedInt",
    "Terms",
    "TrustLevel",
    "TrustRequirement",
    "Usage",
    "UsageReceipt",
]

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")


def check_digest(value: str, what: str) -> None:
    """Raise ValueError unless ``value`` is a ``sha256:<64 lowercase hex>`` digest."""
    if not _DIGEST.match(value):
        raise ValueError(f"{what} {value!r} is not a sha256:<hex> digest")


class Arch(enum.StrEnum):
    AMD64 = "amd64"
    ARM64 = "arm64"


class TrustLevel(enum.StrEnum):
    """What a provider can prove about its machine; ordered weakest first."""

    NONE = "none"
    TPM = "tpm"
    SEV_SNP = "sev-snp"


@dataclass(frozen=True, slots=True, kw_only=True)
class Resources:
    cpu_milli: int
    memory_bytes: int
    disk_bytes: int = 0
    gpus: int = 0

    def fits_in(self, other: Resources) -> bool:
        return (
            self.cpu_milli <= other.cpu_milli
            and self.memory_bytes <= other.memory_bytes
            and self.disk_bytes <= other.disk_bytes
            and self.gpus <= other.gpus
        )

    def minus(self, other: Resources) -> Resources:
        return Resources(
            cpu_milli=self.cpu_milli - other.cpu_milli,
            memory_bytes=self.memory_bytes - other.memory_bytes,
            disk_bytes=self.disk_bytes - other.disk_bytes,
            gpus=self.gpus - other.gpus,
        )

    def plus(self, other: Resources) -> Resources:
        return Resources(
            cpu_milli=self.cpu_milli + other.cpu_milli,
            memory_bytes=self.memory_bytes + other.memory_bytes,
            disk_bytes=self.disk_bytes + other.disk_bytes,
            gpus=self.gpus + other.gpus,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Prices:
    """Unit prices in micro-credits: CPU per core-hour of CPU time used, the rest per hour
    of the reservation's wall time (memory and disk per GiB)."""

    cpu_core_hour: int
    memory_gib_hour: int = 0
    disk_gib_hour: int = 0
    gpu_hour: int = 0

    def all_at_most(self, limit: Prices, used: Resources) -> bool:
        """Is every price this order charges for ``used`` within ``limit``?"""
        return (
            self.cpu_core_hour <= limit.cpu_core_hour
            and (used.memory_bytes == 0 or self.memory_gib_hour <= limit.memory_gib_hour)
            and (used.disk_bytes == 0 or self.disk_gib_hour <= limit.disk_gib_hour)
            and (used.gpus == 0 or self.gpu_hour <= limit.gpu_hour)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Gpu:
    model: str
    memory_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TrustRequirement:
    """The trust a bid needs. ``pcrs`` maps ``"sha256:7"`` to the expected hex value."""

    level: TrustLevel = TrustLevel.NONE
    pcrs: dict[str, str] = field(default_factory=dict)
    measurement: bytes | None = None
    min_tcb: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Constraints:
    arch: Arch | None = None
    regions: tuple[str, ...] = ()
    gpu_model: str | None = None
    min_reputation: int = 0  # on the matching node's own reputation scale
    trust: TrustRequirement = field(default_factory=TrustRequirement)


@dataclass(frozen=True, slots=True, kw_only=True)
class DataRef:
    """A content-addressed blob and where the container sees it."""

    digest: str
    path: str
    size: int

    def __post_init__(self) -> None:
        check_digest(self.digest, "data digest")
        if not self.path.startswith("/"):
            raise ValueError(f"path {self.path!r} must be absolute")


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """Application-level checkpoint contract: on stop, ``signal``, ``grace_ms``, then kill;
    files under ``path`` become a checkpoint blob; ``resume_from`` restores one."""

    signal: str = "SIGTERM"
    grace_ms: int = 10_000
    path: str = "/checkpoint"
    resume_from: str | None = None

    def __post_init__(self) -> None:
        if self.resume_from is not None:
            check_digest(self.resume_from, "checkpoint digest")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    image: str  # OCI image manifest digest
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    inputs: tuple[DataRef, ...] = ()
    output_path: str = "/out"
    max_output_bytes: int = 64 * 1024 * 1024
    wall_ms: int = 3_600_000
    network: bool = False

    def __post_init__(self) -> None:
        check_digest(self.image, "image")
        if not self.command:
            raise ValueError("command must not be empty")
        if self.wall_ms <= 0:
            raise ValueError("wall_ms must be positive")


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer:
    capacity: Resources
    prices: Prices
    arch: Arch
    gpus: tuple[Gpu, ...] = ()
    trust: tuple[TrustLevel, ...] = (TrustLevel.NONE,)
    region: str = ""
    max_wall_ms: int = 24 * 3_600_000
    network: bool = False  # jobs may use the network

    def __post_init__(self) -> None:
        if self.capacity.gpus != len(self.gpus):
            raise ValueError("capacity.gpus must equal the number of gpus listed")


@dataclass(frozen=True, slots=True, kw_only=True)
class Bid:
    job: JobSpec
    resources: Resources
    max_prices: Prices
    constraints: Constraints = field(default_factory=Constraints)
    preemptible: bool = False
    checkpoint: Checkpoint | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel:
    order_id: bytes  # the id of an order by the same signer


@dataclass(frozen=True, slots=True, kw_only=True)
class Terms:
    """Exactly what both parties sign in an agreement."""

    bid_id: bytes
    offer_id: bytes
    buyer: bytes
    provider: bytes
    job: JobSpec
    resources: Resources
    prices: Prices
    max_cost: int
    preemptible: bool
    checkpoint: Checkpoint | None
    trust: TrustRequirement
    attestation_nonce: bytes
    created_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """Attestation evidence: ``kind`` names the format, ``parts`` its pieces.

    See spec/attestation.md.
    """

    kind: str
    parts: dict[str, bytes]


@dataclass(frozen=True, slots=True, kw_only=True)
class Proposal:
    terms: Terms


@dataclass(frozen=True, slots=True, kw_only=True)
class Accept:
    proposal_id: bytes
    terms_signature: bytes  # provider's signature over the terms, agreement domain
    evidence: Evidence | None = None


class RejectReason(enum.StrEnum):
    NO_CAPACITY = "no-capacity"
    PRICE = "price"
    TRUST_UNAVAILABLE = "trust-unavailable"
    UNKNOWN_ORDER = "unknown-order"
    BAD_TERMS = "bad-terms"
    POLICY = "policy"


@dataclass(frozen=True, slots=True, kw_only=True)
class Reject:
    proposal_id: bytes
    reason: RejectReason
    detail: str = ""


class JobState(enum.StrEnum):
    AGREED = "agreed"
    TRANSFERRING = "transferring"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed-out"
    PREEMPTED = "preempted"
    PROVIDER_FAULT = "provider-fault"
    RECEIPTED = "receipted"
    SETTLED = "settled"
    ERROR = "error"


@dataclass(frozen=True, slots=True, kw_only=True)
class JobStatus:
    agreement_id: bytes
    state: JobState
    detail: str = ""


class ExitReason(enum.StrEnum):
    SUCCESS = "success"
    NONZERO_EXIT = "nonzero-exit"
    OOM = "oom"
    TIMEOUT = "timeout"
    PIDS_EXHAUSTED = "pids-exhausted"
    OUTPUT_TOO_LARGE = "output-too-large"
    PREEMPTED = "preempted"
    PROVIDER_FAULT = "provider-fault"


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """What the provider metered from the job's cgroup."""

    wall_ms: int
    cpu_us: int
    memory_peak_bytes: int = 0
    io_read_bytes: int = 0
    io_write_bytes: int = 0
    pids_peak: int = 0
    oom_kills: int = 0
    checkpoint_ms: int = 0  # wall time at the last checkpoint; 0 when none was taken


LOG_PATHS = ("/dev/stdout", "/dev/stderr")
# A provider keeps each log up to this many bytes; past it the log is cut and marked.
LOG_CAP_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class UsageReceipt:
    """The provider's signed account of a job. ``logs`` names the job's stdout and stderr
    blobs (DataRef paths ``/dev/stdout``, ``/dev/stderr``; an empty log is left out), so the
    buyer can fetch them by digest; the signature binds them like the outputs.
    ``truncated_logs`` names the logs the job wrote past ``LOG_CAP_BYTES``: their blobs
    hold the first ``LOG_CAP_BYTES`` only."""

    agreement_id: bytes
    usage: Usage
    exit_reason: ExitReason
    exit_code: SignedInt
    outputs: tuple[DataRef, ...] = ()
    logs: tuple[DataRef, ...] = ()
    truncated_logs: tuple[str, ...] = ()
    checkpoint: str | None = None
    cost: int

    def __post_init__(self) -> None:
        if self.checkpoint is not None:
            check_digest(self.checkpoint, "checkpoint digest")
        paths = [log.path for log in self.logs]
        if len(set(paths)) != len(paths) or not set(paths) <= set(LOG_PATHS):
            raise ValueError(f"log paths must be distinct and among {', '.join(LOG_PATHS)}")
        cut = self.truncated_logs
        if len(set(cut)) != len(cut) or not set(cut) <= set(paths):
            raise ValueError("truncated_logs must name distinct paths of the receipt's logs")


@dataclass(frozen=True, slots=True, kw_only=True)
class Enrolment:
    """Provider to buyer: the TPM's keys for credential activation (spec/attestation.md
    §3.1). The buyer checks the EK certificate against its roots and challenges the AK."""

    ek_certificate: bytes  # DER, as the TPM holds it (NV 0x01c00002)
    ek_public: bytes  # TPM2B_PUBLIC of the EK the certificate names
    ak_public: bytes  # TPM2B_PUBLIC of the AK that will sign quotes
    ek_intermediates: tuple[bytes, ...] = ()  # CA certificates (DER or PEM) up to a root


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationChallenge:
    """Buyer to provider: a secret encrypted to the EK and bound to the AK's Name
    (TPM2_MakeCredential), in answer to the Enrolment ``enrolment_id`` names."""

    enrolment_id: bytes  # MessageId of the Enrolment
    credential_blob: bytes  # TPM2B_ID_OBJECT contents
    encrypted_secret: bytes  # TPM2B_ENCRYPTED_SECRET contents


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationAnswer:
    """Provider to buyer: the secret its TPM recovered (TPM2_ActivateCredential). It travels
    only on the encrypted stream to the buyer that made the challenge."""

    challenge_id: bytes  # MessageId of the ActivationChallenge
    secret: bytes
