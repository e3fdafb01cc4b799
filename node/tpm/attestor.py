"""Attestation on the node: the provider's TPM, the buyer's trusted AKs, and TPM enrolment
over a stream (spec/attestation.md §3.1).

Rules:
- One TPM client at a time: tpm2-pytss blocks, so every TPM call runs in a worker thread,
  under one trio.Lock per :class:`TpmAttestor`. A call in flight finishes even if its
  caller is cancelled (a TPM command is never cut in half).
- The exchange's checks are ``attest.enrolment``'s; this module moves their bytes, draws
  the randomness and reads the clock it is given, and bounds the waits.
- Stream protocol ``/cx/enrol/1``, one enrolment per stream, each frame one signed message:
  the buyer sends an empty request frame; the provider sends its Enrolment; the buyer an
  ActivationChallenge; the provider an ActivationAnswer; both close. A provider that
  refuses a request or a challenge closes the stream without an answer.
- A buyer enrols a provider once; :class:`AkTrust` remembers the AK Names that passed, per
  provider key, and tells the node (``on_add``) so it can persist them.

Errors of :func:`enrol`::

    EnrolmentError            base; ``reason``: the underlying machine-readable reason
    +-- EnrolmentRefused      the provider's TPM or messages failed a check: penalise it
    +-- EnrolmentUnavailable  the exchange did not complete (unreachable, closed, timeout)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

import trio
from cryptography import x509

from attest.enrolment import (
    DEFAULT_POLICY,
    ENROLMENT_TTL_MS,
    SECRET_SIZE,
    answer_challenge,
    challenge_enrolment,
    check_answer,
    open_challenge,
    open_enrolment,
)
from attest.errors import AttestUsageError, EvidenceError, ProducerError, Reason
from attest.producers.tpm import TpmProducer
from node.clock import Entropy, nonce, system_entropy
from node.net.transport import (
    FramedStream,
    NetReason,
    Network,
    NetworkError,
    ProtocolId,
    RemoteNetworkError,
    Stream,
    StreamClosed,
)
from node.tpm.swtpm import Swtpm
from protocol.admission import AdmissionPolicy, ReplayGuard
from protocol.envelope import Signed, seal
from protocol.errors import RemoteProtocolError
from protocol.identity import PeerId, PrivateKey, PublicKey
from protocol.messages import ActivationAnswer, ActivationChallenge, Enrolment, Evidence

__all__ = [
    "DEFAULT_SELECTION",
    "ENROL_MAX_FRAME",
    "ENROL_PROTOCOL",
    "TIMEOUT",
    "AkTrust",
    "Attestor",
    "EnrolmentError",
    "EnrolmentRefused",
    "EnrolmentUnavailable",
    "TpmAttestor",
    "enrol",
    "open_swtpm_attestor",
    "serve_enrolment",
]

log = logging.getLogger(__name__)

ENROL_PROTOCOL = ProtocolId("/cx/enrol/1")
ENROL_MAX_FRAME = 64 * 1024  # an EK certificate with a few intermediates is a few KiB
DEFAULT_SELECTION: Mapping[str, Sequence[int]] = {"sha256": tuple(range(8))}  # boot chain
TIMEOUT = "timeout"  # EnrolmentUnavailable.reason when the exchange took too long
_ENTROPY_SIZE = 64

T = TypeVar("T")


# -- errors --------------------------------------------------------------------------------


class EnrolmentError(Exception):
    """Enrolment did not make an AK trusted. ``reason`` is the machine-readable reason of
    what failed underneath (an ``attest.errors.Reason``, ``protocol.errors.Reason`` or
    ``node.net.transport.NetReason`` value, or :data:`TIMEOUT`)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


class EnrolmentRefused(EnrolmentError):
    """The provider's certificate, keys, answer or messages failed a check; do not trade
    at the TPM level with it, and penalise it."""


class EnrolmentUnavailable(EnrolmentError):
    """The exchange did not complete (unreachable, stream closed, too slow); try later."""


# -- provider ------------------------------------------------------------------------------


class Attestor(Protocol):
    """What :func:`serve_enrolment` needs of a provider's TPM."""

    async def enrolment(self, key: PrivateKey, *, nonce: bytes, now_ms: int) -> Signed[Enrolment]:
        """This TPM's EK certificate, EK and AK, signed by ``key``."""

    async def answer(
        self,
        key: PrivateKey,
        challenge: Signed[ActivationChallenge],
        *,
        nonce: bytes,
        now_ms: int,
    ) -> Signed[ActivationAnswer]:
        """Activate the credential and sign the recovered secret."""


class TpmAttestor:
    """The provider's TPM, for enrolment and quotes; implements :class:`Attestor`.

    ``ek_intermediates`` (DER or PEM) are sent with the EK certificate, for buyers whose
    roots are the vendor's root CAs. ``selection`` is the PCRs every quote covers.
    """

    def __init__(
        self,
        producer: TpmProducer,
        *,
        ek_intermediates: Sequence[bytes] = (),
        selection: Mapping[str, Sequence[int]] = DEFAULT_SELECTION,
    ) -> None:
        self._producer = producer
        self._intermediates = tuple(ek_intermediates)
        self.selection = selection
        self._lock = trio.Lock()
        self._keys: Enrolment | None = None

    @classmethod
    async def open(
        cls,
        tcti: str,
        *,
        ek_intermediates: Sequence[bytes] = (),
        selection: Mapping[str, Sequence[int]] = DEFAULT_SELECTION,
    ) -> TpmAttestor:
        """Open the TPM at ``tcti`` (``device:/dev/tpmrm0``, ``swtpm:host=...,port=...``).

        Raises ProducerError(CANNOT_PRODUCE) when no TPM answers there.
        """
        producer = await trio.to_thread.run_sync(TpmProducer, tcti)
        return cls(producer, ek_intermediates=ek_intermediates, selection=selection)

    def close(self) -> None:
        """Close the TPM connection; call it when no TPM call is in flight."""
        self._producer.close()

    async def _run(self, fn: Callable[[], T]) -> T:
        async with self._lock:
            return await trio.to_thread.run_sync(fn)

    def _read_keys(self) -> Enrolment:
        producer = self._producer
        return Enrolment(
            ek_certificate=producer.ek_certificate(),
            ek_public=producer.public(producer.ek),
            ak_public=producer.public(producer.ak),
            ek_intermediates=self._intermediates,
        )

    async def enrolment(self, key: PrivateKey, *, nonce: bytes, now_ms: int) -> Signed[Enrolment]:
        """The EK certificate, EK and AK (read once, created on first use), signed by ``key``.

        Raises ProducerError (CANNOT_PRODUCE without an EK certificate, DEVICE_ERROR).
        """
        if self._keys is None:
            self._keys = await self._run(self._read_keys)
        return seal(
            key, self._keys, nonce=nonce, issued_ms=now_ms, expires_ms=now_ms + ENROLMENT_TTL_MS
        )

    async def answer(
        self,
        key: PrivateKey,
        challenge: Signed[ActivationChallenge],
        *,
        nonce: bytes,
        now_ms: int,
    ) -> Signed[ActivationAnswer]:
        """TPM2_ActivateCredential on an opened challenge; the answer is signed by ``key``.

        Raises ProducerError(ACTIVATION_FAILED) when the TPM refuses: the challenge was not
        made for this TPM's EK and AK.
        """
        payload = challenge.payload
        secret = await self._run(
            lambda: self._producer.activate(payload.credential_blob, payload.encrypted_secret)
        )
        return answer_challenge(key, challenge, secret, nonce=nonce, now_ms=now_ms)

    async def evidence(self, *, provider_key: bytes, nonce: bytes, terms_hash: bytes) -> Evidence:
        """A fresh ``tpm-quote/v1`` over :attr:`selection`, bound to this negotiation (§2).

        ``provider_key`` MUST be this node's own key: a quote bound to another key would let
        that node pass off this TPM as its own. Raises ProducerError.
        """
        return await self._run(
            lambda: self._producer.evidence(
                provider_key=provider_key,
                nonce=nonce,
                terms_hash=terms_hash,
                selection=self.selection,
            )
        )


async def open_swtpm_attestor(
    tpm: Swtpm, *, selection: Mapping[str, Sequence[int]] = DEFAULT_SELECTION
) -> TpmAttestor:
    """A :class:`TpmAttestor` on a running swtpm (``node.tpm.swtpm.start``) that sends its local
    CA's intermediate with the EK certificate; buyers trust ``tpm.ca_root``."""
    intermediate = await trio.Path(tpm.ca_intermediate).read_bytes()
    return await TpmAttestor.open(tpm.tcti, ek_intermediates=[intermediate], selection=selection)


def serve_enrolment(
    net: Network,
    attestor: Attestor,
    key: PrivateKey,
    *,
    clock: Callable[[], int],
    entropy: Entropy = system_entropy,
    policy: AdmissionPolicy = DEFAULT_POLICY,
    timeout_s: float = 30.0,
) -> None:
    """Answer enrolment requests on ``net`` (``/cx/enrol/1``) with ``attestor``'s TPM.

    ``key`` is this node's key: the Enrolment and the answer are signed with it, and buyers
    refuse them under any other; ``clock`` gives the protocol time (ms). A request or
    challenge that breaks a rule, or that the TPM refuses, is logged and its stream closed.
    """
    guard = ReplayGuard()

    async def handle(stream: Stream) -> None:
        framed = FramedStream(stream, max_frame=ENROL_MAX_FRAME)
        peer = stream.remote_peer
        with trio.move_on_after(timeout_s) as scope:
            try:
                await _provide(framed, attestor, key, guard, policy, clock, entropy)
            except (RemoteProtocolError, NetworkError, ProducerError) as exc:
                log.warning("enrolment for %s ended: %s", peer, exc)
        if scope.cancelled_caught:
            log.warning("enrolment for %s took longer than %.0f s; dropped", peer, timeout_s)

    net.serve(ENROL_PROTOCOL, handle)


async def _provide(
    framed: FramedStream,
    attestor: Attestor,
    key: PrivateKey,
    guard: ReplayGuard,
    policy: AdmissionPolicy,
    clock: Callable[[], int],
    entropy: Entropy,
) -> None:
    buyer = PublicKey.from_peer_id(framed.stream.remote_peer)
    request = await framed.receive_frame()
    if request != b"":
        log.info("enrolment request from %s is not one empty frame; closing", buyer.peer_id)
        return
    enrolment = await attestor.enrolment(key, nonce=nonce(entropy), now_ms=clock())
    await framed.send_frame(enrolment.wire)
    wire = await framed.receive_frame()
    if wire is None:
        return  # the buyer refused our enrolment, or went away
    challenge = open_challenge(
        wire, enrolment=enrolment, buyer=buyer, now_ms=clock(), guard=guard, policy=policy
    )
    answer = await attestor.answer(key, challenge, nonce=nonce(entropy), now_ms=clock())
    await framed.send_frame(answer.wire)


# -- buyer ---------------------------------------------------------------------------------


def _load_certificate(data: bytes) -> x509.Certificate:
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            return x509.load_pem_x509_certificate(data)
        return x509.load_der_x509_certificate(data)
    except ValueError as exc:
        raise AttestUsageError(
            Reason.BAD_ARGUMENT, "an EK root or intermediate is not a PEM or DER certificate"
        ) from exc


class AkTrust:
    """The buyer's EK roots and the AK Names that passed activation, per provider key.

    ``roots`` and ``intermediates`` are CA certificates (PEM or DER) EK certificates must
    chain to. ``names`` restores what ``on_add(provider_key, ak_name)`` persisted; that hook
    runs once per newly trusted Name. Raises AttestUsageError(BAD_ARGUMENT) for a
    certificate that does not parse.
    """

    def __init__(
        self,
        roots: Sequence[bytes],
        *,
        intermediates: Sequence[bytes] = (),
        names: Mapping[bytes, Iterable[bytes]] | None = None,
        on_add: Callable[[bytes, bytes], None] | None = None,
    ) -> None:
        for certificate in (*roots, *intermediates):
            _load_certificate(certificate)
        self.roots = tuple(roots)
        self.intermediates = tuple(intermediates)
        self.on_add = on_add
        self._names: dict[bytes, set[bytes]] = {
            provider: set(aks) for provider, aks in (names or {}).items()
        }

    def trusted(self, provider_key: bytes) -> frozenset[bytes]:
        """The AK Names trusted for quotes of ``provider_key`` (``verify_evidence``'s
        ``trusted_aks``)."""
        return frozenset(self._names.get(provider_key, ()))

    def add(self, provider_key: bytes, ak_name: bytes) -> None:
        """Trust ``ak_name`` for ``provider_key``; tell ``on_add`` if it is new."""
        known = self._names.setdefault(provider_key, set())
        if ak_name in known:
            return
        known.add(ak_name)
        if self.on_add is not None:
            self.on_add(provider_key, ak_name)


async def enrol(
    net: Network,
    peer: PeerId,
    provider_key: PublicKey,
    trust: AkTrust,
    key: PrivateKey,
    now_ms: int,
    *,
    guard: ReplayGuard | None = None,
    policy: AdmissionPolicy = DEFAULT_POLICY,
    timeout_s: float = 30.0,
    entropy: Entropy = system_entropy,
) -> bytes:
    """Run credential activation with ``peer``; return the AK Name now in ``trust``.

    ``provider_key`` is the peer's key (the Enrolment and answer must be signed with it);
    ``now_ms`` is the time the EK certificate chain and the messages are checked at;
    ``guard`` is the node's replay guard (a fresh one when None). Raises
    EnrolmentRefused (``reason``: UNTRUSTED_CHAIN, CERTIFICATE_MISMATCH, KEY_ATTRIBUTES,
    ACTIVATION_FAILED, MALFORMED, WRONG_PARTY, TERMS_MISMATCH, a message or framing
    reason), EnrolmentUnavailable (a network reason or TIMEOUT), AttestUsageError when
    ``provider_key`` is not ``peer``'s.
    """
    if provider_key.peer_id != peer:
        raise AttestUsageError(Reason.BAD_ARGUMENT, f"{peer} is not the peer id of that key")
    guard = ReplayGuard() if guard is None else guard
    try:
        with trio.fail_after(timeout_s):
            stream = await net.open_stream(peer, ENROL_PROTOCOL)
            framed = FramedStream(stream, max_frame=ENROL_MAX_FRAME)
            try:
                await framed.send_frame(b"")
                wire = await _expect(framed, "its enrolment")
                enrolment = open_enrolment(
                    wire, provider=provider_key, now_ms=now_ms, guard=guard, policy=policy
                )
                pending = challenge_enrolment(
                    enrolment,
                    key=key,
                    roots=trust.roots,
                    intermediates=trust.intermediates,
                    now_ms=now_ms,
                    secret=entropy(SECRET_SIZE),
                    entropy=entropy(_ENTROPY_SIZE),
                    nonce=nonce(entropy),
                )
                await framed.send_frame(pending.message.wire)
                wire = await _expect(framed, "an answer to the activation challenge")
                name = check_answer(pending, wire, now_ms=now_ms, guard=guard, policy=policy)
            finally:
                await framed.aclose()
    except trio.TooSlowError as exc:
        raise EnrolmentUnavailable(
            TIMEOUT, f"{peer} did not complete enrolment within {timeout_s:.0f} s; try later"
        ) from exc
    except (RemoteProtocolError, EvidenceError, RemoteNetworkError) as exc:
        raise EnrolmentRefused(
            exc.reason, f"{peer} failed TPM enrolment ({exc}); do not trust its quotes"
        ) from exc
    except NetworkError as exc:
        raise EnrolmentUnavailable(exc.reason, f"enrolment with {peer}: {exc}; try later") from exc
    trust.add(provider_key.raw, name)
    log.info("trusting AK %s for %s", name.hex(), peer)
    return name


async def _expect(framed: FramedStream, what: str) -> bytes:
    frame = await framed.receive_frame()
    if frame is None:
        raise StreamClosed(NetReason.CLOSED, f"the provider closed the stream instead of {what}")
    return frame
