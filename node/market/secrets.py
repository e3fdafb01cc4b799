"""A job's secrets on their way to the agreed provider (spec/messages.md, "Sealed secrets").

Rules:
- The provider holds one X25519 key per process (:class:`SealKey`), in memory only; its
  public half goes in every offer as ``seal_key``. A restarted provider has a new key and
  new offers, and faults the jobs it was running anyway.
- The buyer keeps each job's secrets in memory (:class:`Vault`) for the job's life, never in
  the database; after the agreement it seals them to the agreed offer's key and sends them
  on the negotiate stream (:func:`send_secrets`). A buyer restarted before its job ran has
  lost them; the job then fails at the provider for want of them, and says so.
- The provider opens them (:func:`receive_secrets`) only from the agreement's buyer, for
  that agreement, and keeps them with the run; nothing here logs a secret.
"""

from __future__ import annotations

import dataclasses
import logging

import nacl.public
import trio

from node.net.transport import FramedStream, NetworkError
from node.net.wire import control, read_control
from node.storage.jobdata import Credentials
from node.storage.objects import S3Keys
from node.storage.registry import Login
from protocol.envelope import open_signed, seal
from protocol.errors import InvalidMessage, ProtocolError, Reason
from protocol.identity import PrivateKey
from protocol.messages import JobSecrets, JobSpec, RegistryLogin, S3Secret, SecretsPlain
from protocol.negotiation import Agreement
from protocol.secrets import encode_secrets, open_secrets

__all__ = [
    "SECRETS_TIMEOUT_S",
    "SealKey",
    "Vault",
    "credentials_of",
    "lost_secrets",
    "plain_secrets",
    "receive_secrets",
    "send_secrets",
]

log = logging.getLogger(__name__)

SECRETS_TIMEOUT_S = 30.0
_SECRETS_TTL_MS = 300_000


def plain_secrets(credentials: Credentials, agreement_id: bytes) -> SecretsPlain:
    """What the buyer seals for ``agreement_id``."""
    login, keys = credentials.registry, credentials.s3
    return SecretsPlain(
        agreement_id=agreement_id,
        registry=None if login is None else RegistryLogin(**dataclasses.asdict(login)),
        s3=None if keys is None else S3Secret(**dataclasses.asdict(keys)),
    )


def credentials_of(plain: SecretsPlain) -> Credentials:
    """What the provider uses from an opened box."""
    login, keys = plain.registry, plain.s3
    return Credentials(
        registry=None if login is None else Login(**dataclasses.asdict(login)),
        s3=None if keys is None else S3Keys(**dataclasses.asdict(keys)),
    )


class SealKey:
    """The provider's X25519 key for this process."""

    def __init__(self) -> None:
        self._private = bytes(nacl.public.PrivateKey.generate())

    @property
    def public(self) -> bytes:
        return bytes(nacl.public.PrivateKey(self._private).public_key)

    def open(self, box: bytes, agreement_id: bytes) -> SecretsPlain:
        """Raises InvalidMessage (spec/messages.md rule 8)."""
        return open_secrets(box, self._private, agreement_id=agreement_id)


def lost_secrets(job: JobSpec, held: Credentials | None) -> bool:
    """Does ``job`` name secrets this buyer no longer holds (it restarted since)?"""
    return bool(job.secrets) and (held is None or held.names() != job.secrets)


class Vault:
    """The buyer's secrets per job id, in memory only."""

    def __init__(self) -> None:
        self._jobs: dict[str, Credentials] = {}

    def keep(self, job_id: str, credentials: Credentials) -> None:
        if credentials.names():
            self._jobs[job_id] = credentials

    def get(self, job_id: str) -> Credentials | None:
        return self._jobs.get(job_id)

    def forget(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)


async def send_secrets(
    stream: FramedStream,
    key: PrivateKey,
    agreement: Agreement,
    seal_key: bytes,
    credentials: Credentials,
    *,
    nonce: bytes,
    now_ms: int,
) -> None:
    """Buyer: seal ``credentials`` to ``seal_key`` and send them for ``agreement``.

    Raises:
        NetworkError, node.net.wire.PeerRefused: the provider did not take them.
    """
    plaintext = encode_secrets(plain_secrets(credentials, agreement.id))
    box = nacl.public.SealedBox(nacl.public.PublicKey(seal_key)).encrypt(plaintext)
    message = seal(
        key,
        JobSecrets(agreement_id=agreement.id, sealed=bytes(box)),
        nonce=nonce,
        issued_ms=now_ms,
        expires_ms=now_ms + _SECRETS_TTL_MS,
    )
    await stream.send_frame(message.wire)
    read_control(await stream.receive_frame())


async def receive_secrets(
    stream: FramedStream, agreement: Agreement, seal_key: SealKey
) -> Credentials:
    """Provider: the secrets the agreed job names, from its buyer, within the time allowed.

    Raises:
        ProtocolError: not a JobSecrets from this agreement's buyer, a box that does not
            open, or not exactly the secrets the job names (the buyer is told why).
        NetworkError, trio.TooSlowError: nothing came.
    """
    with trio.fail_after(SECRETS_TIMEOUT_S):
        wire = await stream.receive_frame()
    if wire is None:
        raise ProtocolError(Reason.MALFORMED, "the buyer left without sending the secrets")
    try:
        message = open_signed(wire, JobSecrets)
        if message.signer.raw != agreement.terms.buyer:
            raise ProtocolError(Reason.WRONG_PARTY, "the secrets are not from the job's buyer")
        if message.payload.agreement_id != agreement.id:
            raise ProtocolError(Reason.TERMS_MISMATCH, "the secrets name another agreement")
        plain = seal_key.open(message.payload.sealed, agreement.id)
        if plain.names() != agreement.terms.job.secrets:
            raise InvalidMessage(Reason.BAD_FIELD, "the secrets are not the ones the job names")
    except ProtocolError as exc:
        await _refuse(stream, exc)
        raise
    await stream.send_frame(control(ok=True))
    return credentials_of(plain)


async def _refuse(stream: FramedStream, exc: ProtocolError) -> None:
    try:
        await stream.send_frame(control(error=exc.reason.value, detail=str(exc)))
    except NetworkError:
        log.info("could not tell the buyer its secrets were refused")
