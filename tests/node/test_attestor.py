"""TPM enrolment over the network against a real swtpm (node/tpm/attestor.py): after enrolment a
buyer verifies the provider's quotes; wrong roots, wrong secrets and wrong signers are
refused. Over the in-memory network, and once end to end over libp2p.

Every wait is bounded by trio.fail_after; nothing sleeps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio

from attest.errors import AttestUsageError, InvalidEvidence, Reason
from attest.evidence import verify_evidence
from attest.producers.tpm import TpmProducer
from attest.tpm import QuoteFacts
from node.net.memnet import MemoryHub, MemoryNetwork, serve_memory_network
from node.net.p2p import serve_network
from node.net.transport import FramedStream, NetReason, Network
from node.tpm import swtpm
from node.tpm.attestor import (
    ENROL_PROTOCOL,
    AkTrust,
    EnrolmentRefused,
    EnrolmentUnavailable,
    TpmAttestor,
    enrol,
    open_swtpm_attestor,
    serve_enrolment,
)
from protocol.envelope import Signed, seal
from protocol.errors import Reason as ProtocolReason
from protocol.identity import PrivateKey
from protocol.messages import (
    ActivationAnswer,
    ActivationChallenge,
    Enrolment,
    Evidence,
    TrustLevel,
    TrustRequirement,
)

pytestmark = pytest.mark.integration

BOUND = 30
PROVIDER = PrivateKey.from_seed(hashlib.sha256(b"attestor provider").digest())
BUYER = PrivateKey.from_seed(hashlib.sha256(b"attestor buyer").digest())
IMPOSTOR = PrivateKey.from_seed(hashlib.sha256(b"attestor impostor").digest())
NONCE = hashlib.sha256(b"attestation nonce").digest()
TERMS = hashlib.sha256(b"terms").digest()


def now_ms() -> int:
    # The real clock: swtpm_setup dated the EK certificate "now".
    return time.time_ns() // 1_000_000


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tpm_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A manufactured TPM whose AK already exists (made once, not once per test)."""
    directory = tmp_path_factory.mktemp("attestor-tpm")
    swtpm.manufacture(directory)
    tpm = swtpm.start(directory)
    try:
        with TpmProducer(tpm.tcti) as producer:
            _ = producer.ak
    finally:
        tpm.stop()
    return directory


@pytest.fixture(scope="module")
def other_ca_root(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The root of another swtpm's local CA: one that never certified our TPM."""
    directory = tmp_path_factory.mktemp("attestor-other-tpm")
    swtpm.manufacture(directory)
    return (directory / "ca" / "swtpm-localca-rootca-cert.pem").read_bytes()


@pytest.fixture
def tpm(tpm_template: Path, tmp_path: Path) -> Iterator[swtpm.Swtpm]:
    shutil.copytree(tpm_template, tmp_path / "tpm")
    running = swtpm.start(tmp_path / "tpm")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
async def attestor(tpm: swtpm.Swtpm) -> AsyncIterator[TpmAttestor]:
    opened = await open_swtpm_attestor(tpm)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def root(tpm: swtpm.Swtpm) -> bytes:
    return tpm.ca_root.read_bytes()


@contextlib.asynccontextmanager
async def memory_nodes() -> AsyncIterator[tuple[MemoryNetwork, MemoryNetwork]]:
    """(provider, buyer) on one in-memory hub, with their keys' peer ids."""
    hub = MemoryHub()
    async with trio.open_nursery() as nursery:
        provider = await nursery.start(serve_memory_network, hub, PROVIDER.peer_id)
        buyer = await nursery.start(serve_memory_network, hub, BUYER.peer_id)
        yield provider, buyer
        nursery.cancel_scope.cancel()


async def enrol_provider(buyer: Network, trust: AkTrust) -> bytes:
    with trio.fail_after(BOUND):
        return await enrol(buyer, PROVIDER.peer_id, PROVIDER.public_key, trust, BUYER, now_ms())


def verify(evidence: Evidence, trust: AkTrust) -> QuoteFacts:
    facts = verify_evidence(
        evidence,
        TrustRequirement(level=TrustLevel.TPM),
        provider_key=PROVIDER.public_key.raw,
        nonce=NONCE,
        terms_hash=TERMS,
        at=datetime.datetime.now(datetime.UTC),
        trusted_aks=trust.trusted(PROVIDER.public_key.raw),
    )
    assert isinstance(facts, QuoteFacts)
    return facts


async def quote(attestor: TpmAttestor) -> Evidence:
    with trio.fail_after(BOUND):
        return await attestor.evidence(
            provider_key=PROVIDER.public_key.raw, nonce=NONCE, terms_hash=TERMS
        )


# -- enrolment succeeds --------------------------------------------------------------------


async def test_enrolment_makes_the_providers_quotes_verifiable(attestor, root):
    added: list[tuple[bytes, bytes]] = []
    trust = AkTrust([root], on_add=lambda provider, name: added.append((provider, name)))
    evidence = await quote(attestor)
    with pytest.raises(InvalidEvidence) as before:
        verify(evidence, trust)
    assert before.value.reason == Reason.UNTRUSTED_KEY

    async with memory_nodes() as (provider, buyer):
        serve_enrolment(provider, attestor, PROVIDER, clock=now_ms)
        name = await enrol_provider(buyer, trust)
        assert trust.trusted(PROVIDER.public_key.raw) == {name}
        assert added == [(PROVIDER.public_key.raw, name)]

        facts = verify(evidence, trust)
        assert facts.ak_name == name
        assert set(facts.pcrs) == {f"sha256:{i}" for i in range(8)}
        assert facts.nonce_checked

        # The AK is persistent: enrolling again trusts the same Name, and on_add is not
        # told twice.
        assert await enrol_provider(buyer, trust) == name
        assert len(added) == 1
    assert trust.trusted(BUYER.public_key.raw) == frozenset()


async def test_enrolment_over_libp2p(attestor, root):
    trust = AkTrust([root])
    async with trio.open_nursery() as nursery:
        provider = await nursery.start(serve_network, PROVIDER)
        buyer = await nursery.start(serve_network, BUYER)
        serve_enrolment(provider, attestor, PROVIDER, clock=now_ms)
        with trio.fail_after(BOUND):
            await buyer.connect(provider.listen_addrs[0])
        name = await enrol_provider(buyer, trust)
        nursery.cancel_scope.cancel()
    assert verify(await quote(attestor), trust).ak_name == name


async def test_concurrent_quotes_take_turns_on_the_tpm(attestor, root):
    trust = AkTrust([root])
    async with memory_nodes() as (provider, buyer):
        serve_enrolment(provider, attestor, PROVIDER, clock=now_ms)
        await enrol_provider(buyer, trust)
    results: list[Evidence] = []

    async def one() -> None:
        results.append(await quote(attestor))

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(one)
    assert len(results) == 8
    for evidence in results:
        verify(evidence, trust)


# -- enrolment is refused ------------------------------------------------------------------


async def test_buyer_with_other_roots_refuses_the_ek_certificate(attestor, other_ca_root):
    trust = AkTrust([other_ca_root])
    async with memory_nodes() as (provider, buyer):
        serve_enrolment(provider, attestor, PROVIDER, clock=now_ms)
        with pytest.raises(EnrolmentRefused) as info:
            await enrol_provider(buyer, trust)
    assert info.value.reason == Reason.UNTRUSTED_CHAIN
    assert trust.trusted(PROVIDER.public_key.raw) == frozenset()


@dataclasses.dataclass
class WrongSecret:
    """A provider that answers every challenge with a secret its TPM did not recover."""

    inner: TpmAttestor

    async def enrolment(self, key: PrivateKey, *, nonce: bytes, now_ms: int) -> Signed[Enrolment]:
        return await self.inner.enrolment(key, nonce=nonce, now_ms=now_ms)

    async def answer(
        self, key: PrivateKey, challenge: Signed[ActivationChallenge], *, nonce: bytes, now_ms: int
    ) -> Signed[ActivationAnswer]:
        honest = await self.inner.answer(key, challenge, nonce=nonce, now_ms=now_ms)
        wrong = bytes(b ^ 0x5A for b in honest.payload.secret)
        payload = dataclasses.replace(honest.payload, secret=wrong)
        return seal(key, payload, nonce=nonce, issued_ms=now_ms, expires_ms=honest.expires_ms)


async def test_wrong_secret_is_refused(attestor, root):
    trust = AkTrust([root])
    async with memory_nodes() as (provider, buyer):
        serve_enrolment(provider, WrongSecret(attestor), PROVIDER, clock=now_ms)
        with pytest.raises(EnrolmentRefused) as info:
            await enrol_provider(buyer, trust)
    assert info.value.reason == Reason.ACTIVATION_FAILED
    assert trust.trusted(PROVIDER.public_key.raw) == frozenset()


async def test_enrolment_signed_by_another_key_is_refused(attestor, root):
    trust = AkTrust([root])
    async with memory_nodes() as (provider, buyer):
        serve_enrolment(provider, attestor, IMPOSTOR, clock=now_ms)  # not the provider's peer key
        with pytest.raises(EnrolmentRefused) as info:
            await enrol_provider(buyer, trust)
    assert info.value.reason == ProtocolReason.WRONG_PARTY
    assert trust.trusted(PROVIDER.public_key.raw) == frozenset()


async def test_provider_without_a_tpm_is_unavailable(root):
    trust = AkTrust([root])
    async with memory_nodes() as (_provider, buyer):
        with pytest.raises(EnrolmentUnavailable) as info:
            await enrol_provider(buyer, trust)
    assert info.value.reason == NetReason.UNSUPPORTED_PROTOCOL


async def test_provider_ignores_a_malformed_request(attestor):
    async with memory_nodes() as (provider, buyer):
        serve_enrolment(provider, attestor, PROVIDER, clock=now_ms)
        with trio.fail_after(BOUND):
            framed = FramedStream(await buyer.open_stream(provider.peer_id, ENROL_PROTOCOL))
            await framed.send_frame(b"not empty")
            assert await framed.receive_frame() is None  # closed, no enrolment sent


# -- AkTrust -------------------------------------------------------------------------------


def test_trust_restores_persisted_names_and_refuses_bad_roots(root):
    provider = PROVIDER.public_key.raw
    told: list[tuple[bytes, bytes]] = []
    trust = AkTrust([root], names={provider: [b"ak-1"]}, on_add=lambda p, n: told.append((p, n)))
    assert trust.trusted(provider) == {b"ak-1"}
    trust.add(provider, b"ak-1")
    trust.add(provider, b"ak-2")
    assert trust.trusted(provider) == {b"ak-1", b"ak-2"}
    assert told == [(provider, b"ak-2")]
    with pytest.raises(AttestUsageError):
        AkTrust([b"not a certificate"])


async def test_enrol_refuses_a_key_that_is_not_the_peers(root):
    async with memory_nodes() as (_provider, buyer):
        with pytest.raises(AttestUsageError):
            await enrol(buyer, PROVIDER.peer_id, IMPOSTOR.public_key, AkTrust([root]), BUYER, 0)
