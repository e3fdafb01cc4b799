"""The messages of a trade, as frozen dataclasses (spec/messages.md).

Units, everywhere: money in micro-credits (int), time in milliseconds since the Unix epoch or
as a duration (``*_ms``), CPU in millicores, memory and disk in bytes. Digests are
``sha256:<64 hex>`` strings (OCI style); peer keys are 32 raw Ed25519 bytes.

Order of a trade: Offer / Bid (gossiped) -> Proposal (buyer to provider, carries the terms
and the attestation nonce) -> Accept (with evidence and the provider's signature over the
terms) or Reject -> Agreement (both signatures over the same terms bytes) -> JobStatus
events -> UsageReceipt (provider-signed) -> CountersignedReceipt (buyer adds its signature).

After the agreement, when the job names sealed secrets (a registry login, S3 keys): JobSecrets
(buyer to provider, sealed to the offer's ``seal_key``).

TPM enrolment, once per buyer and provider before the first TPM quote is trusted
(spec/attestation.md §3.1): Enrolment (provider) -> ActivationChallenge (buyer) ->
ActivationAnswer (provider).
"""

from __future__ import annotations

import enum
import itertools
import re
from dataclasses import dataclass, field

from protocol.schema import SignedInt

__all__ = [
    "HOLD_PREFIX_BYTES",
    "LOG_CAP_BYTES",
    "LOG_PATHS",
    "MAX_HOLDS",
    "Accept",
    "ActivationAnswer",
    "ActivationChallenge",
    "Arch",
    "Bid",
    "Cancel",
    "Checkpoint",
    "Constraints",
    "DataRef",
    "DataSite",
    "Elastic",
    "Enrolment",
    "Evidence",
    "ExitReason",
    "Gpu",
    "Grant",
    "Hardware",
    "HardwareRequirement",
    "JobSecrets",
    "JobSpec",
    "JobState",
    "JobStatus",
    "Offer",
    "Prices",
    "Proposal",
    "QuotaKind",
    "QuotaRefusal",
    "RegistryLogin",
    "Reject",
    "RejectReason",
    "Resources",
    "S3Secret",
    "SecretsPlain",
    "SignedInt",
    "Terms",
    "TrustLevel",
    "TrustRequirement",
    "Usage",
    "UsageReceipt",
]

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")
# Where job data may live (spec/messages.md, "Data in registries and object stores").
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REGISTRY = re.compile(rf"[A-Za-z0-9.-]+(?::[0-9]{{1,5}})?/{_COMPONENT}(?:/{_COMPONENT})*\Z")
_OBJECT_URL = re.compile(r"(https?://[^/?#\s]+[^\s]*|s3://[a-z0-9][a-z0-9.-]{1,62}/[^\s]*[^/\s])\Z")
_S3_PREFIX = re.compile(r"s3://[a-z0-9][a-z0-9.-]{1,62}/(?:[^\s]*/)?\Z")
SECRET_NAMES = ("registry", "s3")
SEAL_KEY_SIZE = 32
HOLD_PREFIX_BYTES = 4  # an offer's ``holds``: digest prefixes of this many bytes
MAX_HOLDS = 1024  # ... at most this many (4 KiB)


def check_digest(value: str, what: str) -> None:
    """Raise ValueError unless ``value`` is a ``sha256:<64 lowercase hex>`` digest."""
    if not _DIGEST.match(value):
        raise ValueError(f"{what} {value!r} is not a sha256:<hex> digest")


def check_holds(holds: bytes) -> None:
    """Raise ValueError unless ``holds`` is at most ``MAX_HOLDS`` sorted, distinct
    ``HOLD_PREFIX_BYTES``-byte prefixes, concatenated."""
    n = HOLD_PREFIX_BYTES
    if len(holds) % n or len(holds) > n * MAX_HOLDS:
        raise ValueError(f"holds must be at most {MAX_HOLDS} prefixes of {n} bytes")
    prefixes = [holds[i : i + n] for i in range(0, len(holds), n)]
    if any(a >= b for a, b in itertools.pairwise(prefixes)):
        raise ValueError("holds must list distinct prefixes in ascending order")


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
class Hardware:
    """What an offer states of its machine: the CPU model (``/proc/cpuinfo``'s model
    name), its feature flags (sorted, as cpuinfo spells them: ``avx512f``) and the kernel
    release (``6.1.0-18-amd64``)."""

    cpu_model: str
    cpu_flags: tuple[str, ...]
    kernel: str


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareRequirement:
    """What a bid needs of the machine (spec/workloads.md, "Hardware"): a CPU model that
    contains ``cpu_model``, every flag of ``cpu_flags``, a kernel at least ``min_kernel``."""

    cpu_model: str | None = None
    cpu_flags: tuple[str, ...] | None = None
    min_kernel: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Constraints:
    arch: Arch | None = None
    regions: tuple[str, ...] = ()
    gpu_model: str | None = None
    min_reputation: int = 0  # on the matching node's own reputation scale
    trust: TrustRequirement = field(default_factory=TrustRequirement)
    provider: bytes | None = None  # only this provider's offers (its 32-byte key)
    hardware: HardwareRequirement | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DataRef:
    """A content-addressed blob and where the container sees it; ``url``, where the
    provider fetches it (an input) or put it (an output): ``http(s)://`` or
    ``s3://bucket/key``. Without one, it travels peer to peer."""

    digest: str
    path: str
    size: int
    url: str | None = None

    def __post_init__(self) -> None:
        check_digest(self.digest, "data digest")
        if not self.path.startswith("/"):
            raise ValueError(f"path {self.path!r} must be absolute")
        if self.url is not None and not _OBJECT_URL.match(self.url):
            raise ValueError(f"url {self.url!r} must be http(s)://... or s3://bucket/key")


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSite:
    """Where a bid's data lives (spec/matching.md, "Transfer cost"): its ``region``, its
    size (``bytes``: the job's image and inputs together), what that region charges per GiB
    sent out of it (``egress_gib``), the outputs expected back (``output_bytes``), and the
    most moving it all may cost (``budget``, micro-credits; absent: no cap)."""

    region: str
    bytes: int
    egress_gib: int = 0
    output_bytes: int = 0
    budget: int | None = None


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
class Elastic:
    """How far a running job may grow (spec/workloads.md, "Elastic jobs"): the provider
    raises its memory limit as it nears it, up to ``memory_bytes``, and grants CPU the job
    asks for, up to ``cpu_milli``, while capacity allows. 0: that resource stays as
    reserved."""

    memory_bytes: int = 0
    cpu_milli: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """A running job's limits from ``at_ms`` (since it started) on: the metered record of an
    elastic job's growth, in its receipt's usage."""

    at_ms: int
    cpu_milli: int
    memory_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """``image`` is an OCI image manifest digest; with ``registry`` (``HOST[:PORT]/REPO``)
    the provider pulls it from there, and it may name an index (resolved to the provider's
    architecture). ``output_to`` (``s3://bucket/prefix/``): where the provider uploads the
    outputs. ``secrets`` names the sealed secrets the buyer sends after the agreement."""

    image: str
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    inputs: tuple[DataRef, ...] = ()
    output_path: str = "/out"
    max_output_bytes: int = 64 * 1024 * 1024
    wall_ms: int = 3_600_000
    network: bool = False
    registry: str | None = None
    output_to: str | None = None
    secrets: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        check_digest(self.image, "image")
        if not self.command:
            raise ValueError("command must not be empty")
        if self.wall_ms <= 0:
            raise ValueError("wall_ms must be positive")
        if self.registry is not None and not _REGISTRY.match(self.registry):
            raise ValueError(f"registry {self.registry!r} must be HOST[:PORT]/REPO")
        if self.output_to is not None and not _S3_PREFIX.match(self.output_to):
            raise ValueError(f"output_to {self.output_to!r} must be s3://bucket/prefix/")
        if self.secrets is not None and (
            not self.secrets
            or list(self.secrets) != sorted(set(self.secrets))
            or not set(self.secrets) <= set(SECRET_NAMES)
        ):
            raise ValueError(
                f"secrets must be distinct, sorted and among {', '.join(SECRET_NAMES)}"
            )


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
    seal_key: bytes | None = None  # X25519 public key buyers seal a job's secrets to
    work_score: int | None = None  # work units per core-hour (protocol/work.py)
    watts: int | None = None  # drawn at full load, for work per kWh
    hardware: Hardware | None = None
    # Per GiB the provider brings in for a job, and sends out of it (spec/matching.md,
    # "Transfer cost"); absent: free.
    ingress_gib: int | None = None
    egress_gib: int | None = None
    # The blobs it holds: sorted distinct 4-byte digest prefixes (protocol/transfer.py)
    holds: bytes | None = None

    def __post_init__(self) -> None:
        if self.holds is not None:
            check_holds(self.holds)
        if self.capacity.gpus != len(self.gpus):
            raise ValueError("capacity.gpus must equal the number of gpus listed")
        if self.seal_key is not None and len(self.seal_key) != SEAL_KEY_SIZE:
            raise ValueError(f"seal_key must be {SEAL_KEY_SIZE} bytes (X25519)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Bid:
    job: JobSpec
    resources: Resources
    max_prices: Prices
    constraints: Constraints = field(default_factory=Constraints)
    preemptible: bool = False
    checkpoint: Checkpoint | None = None
    max_work_price: int | None = None  # micro-credits per work unit (protocol/work.py)
    elastic: Elastic | None = None
    data: DataSite | None = None  # where its data lives: matching counts moving it


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
    elastic: Elastic | None = None


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
    # provider's signature over the trade's print (protocol/tape.py), for the tape
    print_signature: bytes | None = None


class RejectReason(enum.StrEnum):
    NO_CAPACITY = "no-capacity"
    PRICE = "price"
    TRUST_UNAVAILABLE = "trust-unavailable"
    UNKNOWN_ORDER = "unknown-order"
    BAD_TERMS = "bad-terms"
    POLICY = "policy"
    QUOTA = "quota"  # a quota of the provider's for the buyer's group (spec/matching.md)


class QuotaKind(enum.StrEnum):
    """Which of a provider's quotas a proposal would exceed (protocol/quotas.py)."""

    CORES = "cores"
    MEMORY = "memory"
    GPUS = "gpus"
    JOBS = "jobs"
    CREDITS_PER_DAY = "credits-per-day"


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaRefusal:
    """The quota a rejected proposal would exceed: its group's name, its limit and what the
    group used before this proposal, in the quota's unit (millicores, bytes, GPUs, jobs,
    micro-credits)."""

    quota: QuotaKind
    group: str
    limit: int
    used: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Invitation:
    """A provider to a buyer whose bid its offer fits: propose to it (spec/matching.md)."""

    offer_id: bytes
    bid_id: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Reject:
    proposal_id: bytes
    reason: RejectReason
    detail: str = ""
    quota: QuotaRefusal | None = None  # with reason ``quota``, and only then

    def __post_init__(self) -> None:
        if (self.reason is RejectReason.QUOTA) != (self.quota is not None):
            raise ValueError("a reject names a quota exactly when its reason is quota")


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
    BAD_INPUT = "bad-input"  # the job's image or inputs could not be had as named
    STOPPED = "stopped"  # the buyer asked the provider to stop it (spec/peer.md rule 13)


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
    grants: tuple[Grant, ...] | None = None  # an elastic job's limits over time, in order
    gpu_memory_peak_bytes: int | None = None  # a GPU job's: the most its processes held


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
class JobSecrets:
    """Buyer to provider, after the agreement: the secrets ``JobSpec.secrets`` names, as a
    sealed box (X25519, XSalsa20-Poly1305) to the ``seal_key`` of the agreed offer. The box
    holds the canonical encoding of :class:`SecretsPlain`."""

    agreement_id: bytes
    sealed: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class RegistryLogin:
    username: str
    password: str = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class S3Secret:
    """Keys for the job's ``s3://`` inputs and ``output_to`` prefix (ideally for no more)."""

    access_key: str
    secret_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class SecretsPlain:
    """What a JobSecrets box holds (not a signed message: it is inside one)."""

    agreement_id: bytes
    registry: RegistryLogin | None = None
    s3: S3Secret | None = None

    def names(self) -> tuple[str, ...]:
        return tuple(n for n in SECRET_NAMES if getattr(self, n) is not None)


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
