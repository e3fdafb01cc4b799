"""Regenerate the protocol test vectors from the reference implementation.

Run ``.venv/bin/python spec/vectors/generate.py`` only for a spec revision: the vectors are
frozen, and a change to any of them needs a revision note in the spec document it belongs
to. ``tests/test_vectors.py`` checks the code against the files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import nacl.bindings
import nacl.public

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]

from reputation_vectors import reputation
from tagged import to_json

from attest.enrolment import ENROLMENT_TTL_MS
from protocol.book import OrderBook
from protocol.direct import (
    REQUESTER_HELLO,
    SERVER_HELLO,
    DirectOffer,
    Sealer,
    decode_offer,
    derive_keys,
    direct_request,
    parse_direct_request,
)
from protocol.elastic import cpu_grant, memory_step
from protocol.encoding import decode, encode
from protocol.envelope import (
    open_signed,
    seal,
)
from protocol.errors import DecodeError, InvalidMessage
from protocol.estimate import BadEstimateLabel, Observed, parse_estimate_label, recommend
from protocol.identity import PrivateKey
from protocol.limits import OutOfBounds, check_limits
from protocol.messages import (
    SEAL_KEY_SIZE,
    ActivationAnswer,
    ActivationChallenge,
    Arch,
    Bid,
    Checkpoint,
    Constraints,
    DataRef,
    DataSite,
    Enrolment,
    ExitReason,
    Grant,
    Invitation,
    JobSecrets,
    JobSpec,
    Offer,
    Prices,
    QuotaKind,
    QuotaRefusal,
    RegistryLogin,
    Reject,
    RejectReason,
    Resources,
    S3Secret,
    SecretsPlain,
    TrustLevel,
    TrustRequirement,
    Usage,
    UsageReceipt,
)
from protocol.pricing import (
    Policy,
    Pricing,
    ResourcePricing,
    asking,
    cost_floor,
    ladder,
    should_repost,
)
from protocol.schema import SignedInt, to_value
from protocol.secrets import encode_secrets, open_secrets
from protocol.settlement import charge, cost
from protocol.tape import Tape, TradePrint, sign_print
from protocol.transfer import holds_filter
from protocol.usage import Observation, classify
from protocol.work import score_of, work_fits, work_per_kwh, work_price

GIB = 1 << 30
T0 = 1_800_000_000_000
HOUR = 3_600_000


def seed(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


def write(name: str, kind: str, doc: str, cases: list[dict[str, object]]) -> None:
    body = {"kind": kind, "format": doc, "cases": cases}
    (HERE / f"{name}.json").write_text(json.dumps(body, indent=1) + "\n")


def reason_of(data: bytes, fn: object) -> str:
    try:
        fn(data)  # type: ignore[operator]
    except (DecodeError, InvalidMessage) as exc:
        return exc.reason.value
    raise AssertionError(f"{data.hex()} was accepted")


def encoding() -> None:
    from protocol.encoding import decode

    valid = [
        ("small map", {"b": 1, "a": [b"\x00", "x", True, False]}),
        ("integer limits", [0, -1, 127, 128, -32, -33, 2**64 - 1, -(2**63)]),
        ("keys sort by UTF-8 bytes", {"é": 1, "z": 2, "A": 3, "": 4}),
        ("empty containers", {"l": [], "m": {}, "s": "", "b": b""}),
        ("16 nested containers", [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]),
    ]
    invalid = [
        ("empty input", ""),
        ("trailing byte", "0102"),
        ("uint8 where fixint suffices", "cc01"),
        ("str8 where fixstr suffices", "d90161"),
        ("unsorted keys", "82a16201a16101"),
        ("duplicate keys", "82a16101a16102"),
        ("float32", "ca00000000"),
        ("float64", "cb0000000000000000"),
        ("nil", "c0"),
        ("timestamp extension", "d6ff00000001"),
        ("fixext 1", "d40100"),
        ("integer map key", "810102"),
        ("binary map key", "81c4016101"),
        ("invalid UTF-8", "a2fffe"),
        ("reserved type byte", "c1"),
        ("truncated string", "a3616263"[:-2]),
        ("nested 17 deep", "91" * 17 + "01"),
        ("array header beyond limit", "dd00010000"),
    ]
    cases: list[dict[str, object]] = [
        {"name": n, "hex": encode(v).hex(), "valid": True, "value": to_json(v)} for n, v in valid
    ]
    cases += [
        {"name": n, "hex": h, "valid": False, "error": reason_of(bytes.fromhex(h), decode)}
        for n, h in invalid
    ]
    write("encoding", "encoding", "spec/encoding.md#test-vectors", cases)


def identity() -> None:
    cases = []
    for name in ("alice", "bob"):
        key = PrivateKey.from_seed(seed(name))
        cases.append(
            {
                "name": name,
                "seed": key.seed.hex(),
                "public_key": key.public_key.raw.hex(),
                "peer_id": key.peer_id,
                "libp2p_private_key": key.to_libp2p_bytes().hex(),
                "domain": "cx/offer/v1",
                "data": "68656c6c6f",
                "signature": key.sign(b"cx/offer/v1", b"hello").hex(),
            }
        )
    write("identity", "identity", "spec/identity.md#test-vectors", cases)


def sample_offer() -> Offer:
    return Offer(
        capacity=Resources(cpu_milli=4000, memory_bytes=8 * GIB, disk_bytes=20 * GIB),
        prices=Prices(cpu_core_hour=100_000, memory_gib_hour=10_000, disk_gib_hour=100),
        arch=Arch.AMD64,
        trust=(TrustLevel.NONE, TrustLevel.TPM),
        region="eu",
    )


def sample_bid() -> Bid:
    return Bid(
        job=JobSpec(
            image="sha256:" + "ab" * 32,
            command=("sh", "-c", "echo hi > /out/x"),
            env={"LANG": "C"},
            wall_ms=HOUR,
        ),
        resources=Resources(cpu_milli=1000, memory_bytes=GIB),
        max_prices=Prices(cpu_core_hour=150_000, memory_gib_hour=20_000),
        constraints=Constraints(arch=Arch.AMD64, regions=("eu",)),
    )


def sample_receipt() -> UsageReceipt:
    def ref(byte: str, path: str, size: int) -> DataRef:
        return DataRef(digest="sha256:" + byte * 32, path=path, size=size)

    return UsageReceipt(
        agreement_id=hashlib.sha256(b"agreement").digest(),
        usage=Usage(wall_ms=HOUR // 2, cpu_us=1_800_000_000, memory_peak_bytes=1 << 20),
        exit_reason=ExitReason.SUCCESS,
        exit_code=SignedInt(0),
        outputs=(ref("cd", "/out/greeting", 6),),
        logs=(ref("ef", "/dev/stdout", 12), ref("0f", "/dev/stderr", 3)),
        cost=30_000,
    )


def valid_message(
    key: PrivateKey, name: str, payload: object, ttl_ms: int = HOUR
) -> dict[str, object]:
    msg = seal(key, payload, nonce=bytes(range(16)), issued_ms=T0, expires_ms=T0 + ttl_ms)
    return {
        "name": f"valid {name}",
        "valid": True,
        "seed": key.seed.hex(),
        "type": msg.type,
        "nonce": bytes(range(16)).hex(),
        "iat": T0,
        "exp": T0 + ttl_ms,
        "data": to_json(to_value(payload)),
        "wire": msg.wire.hex(),
        "id": msg.id.hex(),
    }


def resigned(key: PrivateKey, type_name: str, data: object, domain: str = "") -> bytes:
    """A body of ``type_name`` with arbitrary ``data``, signed under ``domain``'s type
    (by default its own)."""
    body = {
        "type": type_name,
        "from": key.public_key.raw,
        "nonce": bytes(16),
        "iat": T0,
        "exp": T0 + HOUR,
        "data": data,
    }
    raw = encode(body)  # type: ignore[arg-type]
    return key.sign(f"cx/{domain or type_name}/v1".encode(), raw) + raw


def revised_messages(key: PrivateKey) -> list[dict[str, object]]:
    """Cases added by revisions of messages.md (appended, so earlier cases stay as they were)."""
    receipt = to_value(sample_receipt())
    cases = [valid_message(key, "usage-receipt with logs", sample_receipt())]
    invalid = [
        (
            "receipt log at a path other than /dev/stdout or /dev/stderr",
            resigned(
                key,
                "usage-receipt",
                {
                    **receipt,
                    "logs": [{"digest": "sha256:" + "ef" * 32, "path": "/out/log", "size": 1}],
                },
            ),
        ),
    ]
    cases += [
        {"name": n, "valid": False, "wire": w.hex(), "error": reason_of(w, open_signed)}
        for n, w in invalid
    ]
    return cases


def enrolment_messages() -> list[dict[str, object]]:
    """TPM enrolment (attestation.md §3.1), provider bob and buyer alice. The TPM structures
    are placeholders: these cases pin encoding and signatures, the attestation vectors the
    TPM side."""
    provider, buyer = PrivateKey.from_seed(seed("bob")), PrivateKey.from_seed(seed("alice"))
    ttl = ENROLMENT_TTL_MS

    def blob(label: str, size: int = 48) -> bytes:
        return hashlib.shake_256(label.encode()).digest(size)

    enrolment = Enrolment(
        ek_certificate=blob("EK certificate (DER)", 96),
        ek_public=blob("EK TPM2B_PUBLIC"),
        ak_public=blob("AK TPM2B_PUBLIC"),
        ek_intermediates=(blob("intermediate CA (DER)", 64),),
    )
    enrolment_id = seal(
        provider, enrolment, nonce=bytes(range(16)), issued_ms=T0, expires_ms=T0 + ttl
    ).id
    challenge = ActivationChallenge(
        enrolment_id=enrolment_id,
        credential_blob=blob("TPM2B_ID_OBJECT"),
        encrypted_secret=blob("TPM2B_ENCRYPTED_SECRET"),
    )
    challenge_id = seal(
        buyer, challenge, nonce=bytes(range(16)), issued_ms=T0, expires_ms=T0 + ttl
    ).id
    answer = ActivationAnswer(challenge_id=challenge_id, secret=blob("secret", 16))
    cases = [
        valid_message(provider, "enrolment", enrolment, ttl),
        valid_message(buyer, "activation-challenge", challenge, ttl),
        valid_message(provider, "activation-answer", answer, ttl),
    ]
    without_ak = {k: v for k, v in to_value(enrolment).items() if k != "ak_public"}
    invalid = [
        ("enrolment without ak_public", resigned(provider, "enrolment", without_ak)),
        (
            "activation answer under the enrolment's domain",
            resigned(provider, "activation-answer", to_value(answer), domain="enrolment"),
        ),
    ]
    cases += [
        {"name": n, "valid": False, "wire": w.hex(), "error": reason_of(w, open_signed)}
        for n, w in invalid
    ]
    return cases


def truncation_messages(key: PrivateKey) -> list[dict[str, object]]:
    """messages.md revision: logs cut at LOG_CAP_BYTES are named in ``truncated_logs``."""
    cut = replace(sample_receipt(), truncated_logs=("/dev/stderr",))
    receipt = to_value(sample_receipt())
    stdout_only = [log for log in receipt["logs"] if log["path"] == "/dev/stdout"]  # type: ignore[attr-defined,index]
    invalid = [
        (
            "receipt marking a log it does not carry as truncated",
            resigned(
                key,
                "usage-receipt",
                {**receipt, "logs": stdout_only, "truncated_logs": ["/dev/stderr"]},
            ),
        ),
        (
            "receipt marking a log truncated twice",
            resigned(key, "usage-receipt", {**receipt, "truncated_logs": ["/dev/stdout"] * 2}),
        ),
        (
            "receipt without truncated_logs",
            resigned(
                key,
                "usage-receipt",
                {k: v for k, v in receipt.items() if k != "truncated_logs"},
            ),
        ),
    ]
    return [valid_message(key, "usage-receipt with a truncated log", cut)] + [
        {"name": n, "valid": False, "wire": w.hex(), "error": reason_of(w, open_signed)}
        for n, w in invalid
    ]


def x25519(name: str) -> nacl.public.PrivateKey:
    return nacl.public.PrivateKey(seed(f"x25519 {name}"))


def data_plane_bid() -> Bid:
    """A bid whose image comes from a registry, inputs from object stores, outputs go to
    an S3 prefix, with a registry login and S3 keys sealed after the agreement."""
    bid = sample_bid()
    inputs = (
        DataRef(
            digest="sha256:" + "11" * 32,
            path="/in/data/part-0.csv",
            size=1_000,
            url="s3://datasets/run1/part-0.csv",
        ),
        DataRef(
            digest="sha256:" + "22" * 32,
            path="/in/labels.csv",
            size=20,
            url="https://data.example/labels.csv",
        ),
    )
    job = dataclasses.replace(
        bid.job,
        image="sha256:" + "ab" * 32,  # an index digest: the provider resolves its arch
        registry="registry.example:5000/team/app",
        inputs=inputs,
        output_to="s3://results/run1/",
        secrets=("registry", "s3"),
    )
    return dataclasses.replace(bid, job=job)


def sealed_box(plaintext: bytes, recipient: bytes, ephemeral: nacl.public.PrivateKey) -> bytes:
    """crypto_box_seal with a chosen ephemeral key (libsodium picks a random one), so the
    vector is reproducible: epk || crypto_box(m, blake2b-192(epk || pk), pk, esk)."""
    epk = bytes(ephemeral.public_key)
    nonce = hashlib.blake2b(epk + recipient, digest_size=24).digest()
    return epk + nacl.bindings.crypto_box(plaintext, nonce, recipient, bytes(ephemeral))


def data_plane_messages(key: PrivateKey) -> list[dict[str, object]]:
    """Registry images, object-store data and sealed secrets (messages.md revision)."""
    offer = dataclasses.replace(sample_offer(), seal_key=bytes(x25519("provider").public_key))
    receipt = dataclasses.replace(
        sample_receipt(),
        outputs=(
            DataRef(
                digest="sha256:" + "cd" * 32,
                path="/out/greeting",
                size=6,
                url="s3://results/run1/greeting",
            ),
        ),
    )
    bad_input = dataclasses.replace(
        sample_receipt(),
        usage=Usage(wall_ms=1_500, cpu_us=0),
        exit_reason=ExitReason.BAD_INPUT,
        exit_code=SignedInt(-1),
        outputs=(),
        logs=(),
        cost=0,
    )
    secrets = JobSecrets(agreement_id=hashlib.sha256(b"agreement").digest(), sealed=bytes(96))
    cases = [
        valid_message(key, "offer with a seal key", offer),
        valid_message(key, "bid for registry and object-store data", data_plane_bid()),
        valid_message(key, "usage-receipt with outputs uploaded to a prefix", receipt),
        valid_message(key, "usage-receipt for a job whose input was not as named", bad_input),
        valid_message(key, "job-secrets", secrets),
    ]
    bid = to_value(data_plane_bid())
    job = bid["job"]
    assert isinstance(job, dict)

    def with_job(**changes: object) -> dict[str, object]:
        return {**bid, "job": {**job, **changes}}

    invalid = [
        (
            "seal key that is not 32 bytes",
            resigned(key, "offer", {**to_value(offer), "seal_key": bytes(SEAL_KEY_SIZE - 1)}),
        ),
        (
            "output prefix without a trailing slash",
            resigned(key, "bid", with_job(output_to="s3://results/run1")),
        ),
        ("secret name not in the list", resigned(key, "bid", with_job(secrets=["password"]))),
        ("registry with a tag", resigned(key, "bid", with_job(registry="registry.example/app:v1"))),
        (
            "input url that is an s3 prefix",
            resigned(
                key,
                "bid",
                with_job(
                    inputs=[
                        {
                            "digest": "sha256:" + "11" * 32,
                            "path": "/in/x",
                            "size": 1,
                            "url": "s3://datasets/run1/",
                        }
                    ]
                ),
            ),
        ),
    ]
    cases += [
        {"name": n, "valid": False, "wire": w.hex(), "error": reason_of(w, open_signed)}
        for n, w in invalid
    ]
    return cases


def transfer_offer() -> Offer:
    """An offer stating transfer prices and the blobs it holds (matching.md revision 6)."""
    return dataclasses.replace(
        sample_offer(),
        ingress_gib=20_000,
        egress_gib=50_000,
        holds=holds_filter(["sha256:" + "ab" * 32, "sha256:" + "11" * 32]),
    )


def transfer_bid(**site: object) -> Bid:
    """The sample bid with one 1 GiB input, its data in ``eu`` (or as ``site`` says)."""
    data = {"region": "eu", "bytes": 3 * GIB, "egress_gib": 90_000, **site}
    bid = sample_bid()
    return dataclasses.replace(
        bid,
        job=dataclasses.replace(
            bid.job, inputs=(DataRef(digest="sha256:" + "11" * 32, path="/in/data", size=GIB),)
        ),
        constraints=Constraints(arch=Arch.AMD64),
        data=DataSite(**data),  # type: ignore[arg-type]
    )


def transfer_messages(key: PrivateKey) -> list[dict[str, object]]:
    """Transfer prices, held blobs and where a bid's data lives (matching.md revision 6)."""
    bid = transfer_bid(output_bytes=GIB // 2, budget=2_000_000)
    cases = [
        valid_message(key, "offer with transfer prices and held blobs", transfer_offer()),
        valid_message(key, "bid stating where its data lives", bid),
    ]
    offer = to_value(transfer_offer())
    held = offer["holds"]
    assert isinstance(held, bytes)
    data = to_value(bid)["data"]
    assert isinstance(data, dict)
    invalid = [
        (
            "held prefixes out of order",
            resigned(key, "offer", {**offer, "holds": held[4:] + held[:4]}),
        ),
        ("held prefix of 3 bytes", resigned(key, "offer", {**offer, "holds": held[:3]})),
        (
            "data site without a region",
            resigned(
                key,
                "bid",
                {**to_value(bid), "data": {k: v for k, v in data.items() if k != "region"}},
            ),
        ),
    ]
    return cases + [
        {"name": n, "valid": False, "wire": w.hex(), "error": reason_of(w, open_signed)}
        for n, w in invalid
    ]


def sealed_secrets() -> None:
    provider, other = x25519("provider"), x25519("someone else")
    agreement = hashlib.sha256(b"agreement").digest()
    plain = SecretsPlain(
        agreement_id=agreement,
        registry=RegistryLogin(username="buyer", password="registry-password"),
        s3=S3Secret(access_key="AKIAEXAMPLE", secret_key="s3-secret", session_token="token"),
    )
    only_registry = SecretsPlain(
        agreement_id=agreement, registry=RegistryLogin(username="u", password="p")
    )

    def case(
        name: str, box: bytes, recipient: nacl.public.PrivateKey, **outcome: object
    ) -> dict[str, object]:
        return {
            "name": name,
            "recipient": bytes(recipient).hex(),
            "seal_key": bytes(recipient.public_key).hex(),
            "agreement_id": agreement.hex(),
            "box": box.hex(),
            **outcome,
        }

    def seal_to(value: bytes, recipient: nacl.public.PrivateKey, label: str) -> bytes:
        return sealed_box(value, bytes(recipient.public_key), x25519(f"ephemeral {label}"))

    cases = [
        case(
            f"valid {name}",
            seal_to(encode_secrets(p), provider, name),
            provider,
            valid=True,
            plaintext=to_json(to_value(p)),
        )
        for name, p in (
            ("registry login and s3 keys", plain),
            ("registry login only", only_registry),
        )
    ]
    wrong_job = dataclasses.replace(plain, agreement_id=hashlib.sha256(b"another").digest())
    unknown = encode({**to_value(only_registry), "ssh": "key"})
    flipped = bytearray(seal_to(encode_secrets(plain), provider, "flipped"))
    flipped[40] ^= 1
    invalid = [
        ("sealed to another key", seal_to(encode_secrets(plain), other, "other")),
        ("a flipped bit", bytes(flipped)),
        ("sealed for another agreement", seal_to(encode_secrets(wrong_job), provider, "job")),
        ("unknown secret", seal_to(unknown, provider, "unknown")),
    ]
    for name, box in invalid:
        try:
            open_secrets(box, bytes(provider), agreement_id=agreement)
        except InvalidMessage as exc:
            cases.append(case(name, box, provider, valid=False, error=exc.reason.value))
        else:
            raise AssertionError(f"{name} was accepted")
    write("secrets", "sealed-secrets", "spec/messages.md#sealed-secrets", cases)


def quota_messages(key: PrivateKey) -> list[dict[str, object]]:
    """A reject naming the quota it would pass (messages.md, matching.md "Quotas and
    priorities"), and rejects that name a quota without that reason or the other way."""
    quota = QuotaRefusal(quota=QuotaKind.CORES, group="students", limit=2000, used=1500)
    reject = Reject(
        proposal_id=hashlib.sha256(b"proposal").digest(),
        reason=RejectReason.QUOTA,
        detail="quota:cores: group 'students' may hold 2 cores; it has 1.5 cores",
        quota=quota,
    )
    data = to_value(reject)
    no_quota = {k: v for k, v in data.items() if k != "quota"}
    invalid = [
        ("reject for a quota that names none", resigned(key, "reject", no_quota)),
        ("reject naming a quota for another reason",
         resigned(key, "reject", {**data, "reason": "no-capacity"})),
        ("reject naming an unknown quota",
         resigned(key, "reject", {**data, "quota": {**to_value(quota), "quota": "disks"}})),
    ]  # fmt: skip
    return [valid_message(key, "reject for a quota", reject)] + [
        {"name": n, "valid": False, "wire": w.hex(), "error": reason_of(w, open_signed)}
        for n, w in invalid
    ]


def messages() -> None:
    key = PrivateKey.from_seed(seed("alice"))
    cases: list[dict[str, object]] = [
        valid_message(key, name, payload)
        for name, payload in (("offer", sample_offer()), ("bid", sample_bid()))
    ]
    good = seal(key, sample_offer(), nonce=bytes(16), issued_ms=T0, expires_ms=T0 + HOUR)

    def resign(body: dict[str, object], type_name: str = "offer") -> bytes:
        raw = encode(body)  # type: ignore[arg-type]
        return key.sign(f"cx/{type_name}/v1".encode(), raw) + raw

    base = {
        "type": "offer",
        "from": key.public_key.raw,
        "nonce": bytes(16),
        "iat": T0,
        "exp": T0 + HOUR,
        "data": to_value(sample_offer()),
    }
    flipped = bytearray(good.wire)
    flipped[0] ^= 1
    data = dict(base["data"])  # type: ignore[call-overload]
    invalid = [
        ("flipped signature bit", bytes(flipped)),
        ("signature under another type's domain", resign(base, "bid")),
        ("unknown message type", resign({**base, "type": "gift"}, "gift")),
        ("unknown field in data", resign({**base, "data": {**data, "colour": "red"}})),
        (
            "missing field in data",
            resign({**base, "data": {k: v for k, v in data.items() if k != "arch"}}),
        ),
        ("enum value out of range", resign({**base, "data": {**data, "arch": "sparc"}})),
        (
            "negative price",
            resign(
                {
                    **base,
                    "data": {
                        **data,
                        "prices": {
                            "cpu_core_hour": -1,
                            "disk_gib_hour": 0,
                            "gpu_hour": 0,
                            "memory_gib_hour": 0,
                        },
                    },
                }
            ),
        ),
        ("expiry before issue", resign({**base, "exp": T0 - 1})),
        ("short nonce", resign({**base, "nonce": bytes(8)})),
        ("non-canonical body", good.wire[:64] + b"\xde\x00\x06" + good.wire[65:]),
        ("shorter than a signature", good.wire[:40]),
    ]
    cases += [
        {"name": n, "valid": False, "wire": w.hex(), "error": reason_of(w, open_signed)}
        for n, w in invalid
    ]
    cases += revised_messages(key)
    cases += enrolment_messages()
    cases += truncation_messages(key)
    cases += data_plane_messages(key)
    cases.append(
        valid_message(
            key,
            "invitation",
            Invitation(offer_id=hashlib.sha256(b"offer").digest(), bid_id=bytes(32)),
        )
    )
    cases += transfer_messages(key)
    cases += quota_messages(key)
    write("messages", "messages", "spec/messages.md#test-vectors", cases)


def matching() -> None:
    def offer_of(who: str, at: int, **changes: object) -> dict[str, object]:
        payload = sample_offer()
        from dataclasses import replace

        payload = replace(payload, **changes)  # type: ignore[arg-type]
        return {"signer": seed(who).hex(), "issued_ms": at, "data": to_json(to_value(payload))}

    from dataclasses import replace

    scenarios = [
        (
            "cheapest offer wins",
            [
                offer_of("a", T0, prices=Prices(cpu_core_hour=120_000, memory_gib_hour=10_000)),
                offer_of("b", T0, prices=Prices(cpu_core_hour=90_000, memory_gib_hour=10_000)),
            ],
            sample_bid(),
        ),
        (
            "equal price: earlier offer wins",
            [
                offer_of("a", T0 + 5),
                offer_of("b", T0 + 1),
                offer_of("c", T0 + 3),
            ],
            sample_bid(),
        ),
        (
            "constraints rule offers out",
            [
                offer_of("arm", T0, arch=Arch.ARM64),
                offer_of("us", T0, region="us"),
                offer_of("dear", T0, prices=Prices(cpu_core_hour=900_000)),
                offer_of("small", T0, capacity=Resources(cpu_milli=500, memory_bytes=GIB)),
                offer_of("plain", T0, trust=(TrustLevel.NONE,)),
            ],
            replace(
                sample_bid(),
                constraints=Constraints(
                    arch=Arch.AMD64, regions=("eu",), trust=TrustRequirement(level=TrustLevel.TPM)
                ),
            ),
        ),
    ]
    scenarios += transfer_scenarios(offer_of)
    cases = []
    for name, offers, bid in scenarios:
        book = OrderBook()
        signed = []
        for i, o in enumerate(offers):
            from protocol.schema import from_value

            payload = from_value(Offer, _untag(o["data"]))
            msg = seal(
                PrivateKey.from_seed(bytes.fromhex(str(o["signer"]))),
                payload,
                nonce=i.to_bytes(16, "big"),
                issued_ms=int(o["issued_ms"]),  # type: ignore[call-overload]
                expires_ms=T0 + HOUR,
            )
            signed.append(msg)
            book.add_offer(msg, now_ms=T0 + 10)
        why = book.explain(bid, now_ms=T0 + 10)
        bid_msg = seal(
            PrivateKey.from_seed(seed("buyer")),
            bid,
            nonce=bytes(16),
            issued_ms=T0 + 10,
            expires_ms=T0 + HOUR,
        )
        matches = book.add_bid(bid_msg, now_ms=T0 + 10, active=True)
        winner = [i for i, s in enumerate(signed) if matches and s.id == matches[0].offer.id]
        cases.append(
            {
                "name": name,
                "now_ms": T0 + 10,
                "offers": offers,
                "bid": to_json(to_value(bid)),
                "match": winner[0] if winner else None,
                "max_cost": matches[0].max_cost if matches else None,
                "transfer": matches[0].transfer.total if matches else None,
                "ruled_out": why.ruled_out,
                "best_quote": why.best_quote,
                "budget": why.budget,
            }
        )
    write("matching", "matching", "spec/matching.md#test-vectors", cases)


def transfer_scenarios(
    offer_of: Callable[..., dict[str, object]],
) -> list[tuple[str, list[dict[str, object]], Bid]]:
    """Revision 6: the cost of moving a bid's data ranks offers and may rule them out."""
    far = {"region": "us", "prices": Prices(cpu_core_hour=80_000, memory_gib_hour=10_000)}
    near = {"region": "eu", "prices": Prices(cpu_core_hour=100_000, memory_gib_hour=10_000)}
    return [
        (
            "a cheap far provider loses when the data is large",
            [offer_of("far", T0, **far), offer_of("near", T0, **near)],
            transfer_bid(bytes=50 * GIB),
        ),
        (
            "a cheap far provider wins when the data is small",
            [offer_of("far", T0, **far), offer_of("near", T0, **near)],
            transfer_bid(bytes=10 << 20),
        ),
        (
            "the provider holding the data wins though it asks more",
            [
                offer_of("holder", T0, **transfer_offer_changes(cpu_core_hour=140_000)),
                offer_of("empty", T0, ingress_gib=20_000, region="eu"),
            ],
            transfer_bid(bytes=10 * GIB, output_bytes=GIB),
        ),
        (
            "over the egress budget: no match",
            [offer_of("far", T0, **far)],
            transfer_bid(bytes=50 * GIB, budget=1_000_000),
        ),
    ]


def transfer_offer_changes(cpu_core_hour: int) -> dict[str, object]:
    offer = transfer_offer()
    return {
        "ingress_gib": offer.ingress_gib,
        "egress_gib": offer.egress_gib,
        "holds": offer.holds,
        "prices": Prices(cpu_core_hour=cpu_core_hour, memory_gib_hour=10_000),
    }


def _untag(value: object) -> object:
    from tagged import from_json

    return from_json(value)


def settlement() -> None:
    prices = Prices(
        cpu_core_hour=100_000, memory_gib_hour=10_000, disk_gib_hour=1_000, gpu_hour=2_000_000
    )
    reserved = Resources(cpu_milli=2000, memory_bytes=4 * GIB, disk_bytes=10 * GIB, gpus=1)
    usages = [
        (
            "success, half an hour",
            Usage(wall_ms=HOUR // 2, cpu_us=1_800_000_000),
            ExitReason.SUCCESS,
            10**9,
        ),
        (
            "job's own failure pays used time",
            Usage(wall_ms=60_000, cpu_us=30_000_000),
            ExitReason.NONZERO_EXIT,
            10**9,
        ),
        ("OOM pays used time", Usage(wall_ms=1_000, cpu_us=999_999), ExitReason.OOM, 10**9),
        (
            "timeout pays used time",
            Usage(wall_ms=HOUR, cpu_us=7_200_000_000),
            ExitReason.TIMEOUT,
            10**9,
        ),
        (
            "provider fault pays nothing",
            Usage(wall_ms=HOUR, cpu_us=7_200_000_000),
            ExitReason.PROVIDER_FAULT,
            10**9,
        ),
        (
            "preempted pays until the checkpoint",
            Usage(wall_ms=HOUR, cpu_us=3_600_000_000, checkpoint_ms=HOUR // 4),
            ExitReason.PREEMPTED,
            10**9,
        ),
        (
            "preempted without checkpoint pays nothing",
            Usage(wall_ms=HOUR, cpu_us=3_600_000_000),
            ExitReason.PREEMPTED,
            10**9,
        ),
        (
            "capped by the agreement",
            Usage(wall_ms=HOUR, cpu_us=7_200_000_000),
            ExitReason.SUCCESS,
            1_234,
        ),
        ("rounds down once", Usage(wall_ms=1, cpu_us=1), ExitReason.SUCCESS, 10**9),
        (
            "stopped by the buyer pays used time",
            Usage(wall_ms=90_000, cpu_us=45_000_000),
            ExitReason.STOPPED,
            10**9,
        ),
    ]
    cases = [
        {
            "name": name,
            "prices": to_value(prices),
            "reserved": to_value(reserved),
            "usage": to_value(usage),
            "exit_reason": reason.value,
            "max_cost": cap,
            "charge": charge(prices, reserved, cap, usage, reason),
        }
        for name, usage, reason, cap in usages
    ]
    write("settlement", "settlement", "spec/settlement.md#test-vectors", cases)


def limits() -> None:
    """messages.md "Limits": a job's limits, and whether a provider may run them."""
    job = sample_bid().job
    res = Resources(cpu_milli=500, memory_bytes=64 << 20)
    variants: list[tuple[str, JobSpec, Resources, Checkpoint | None]] = [
        ("typical job", job, res, None),
        ("smallest of everything", replace(job, wall_ms=1, max_output_bytes=0),
         Resources(cpu_milli=10, memory_bytes=4 << 20), Checkpoint(grace_ms=0)),
        ("largest of everything", replace(job, wall_ms=30 * 24 * HOUR, max_output_bytes=1 << 46),
         Resources(cpu_milli=1_024_000, memory_bytes=1 << 46, disk_bytes=1 << 46, gpus=256),
         Checkpoint(grace_ms=600_000, signal="SIGUSR1", path="/state")),
        ("memory 0", job, replace(res, memory_bytes=0), None),
        ("memory 1 byte", job, replace(res, memory_bytes=1), None),
        ("memory one byte under 4 MiB", job, replace(res, memory_bytes=(4 << 20) - 1), None),
        ("memory 2^64 - 1", job, replace(res, memory_bytes=2**64 - 1), None),
        ("cpu 0", job, replace(res, cpu_milli=0), None),
        ("cpu 9 millicores", job, replace(res, cpu_milli=9), None),
        ("cpu a billion cores", job, replace(res, cpu_milli=10**12), None),
        ("disk over 64 TiB", job, replace(res, disk_bytes=(1 << 46) + 1), None),
        ("257 gpus", job, replace(res, gpus=257), None),
        ("wall time over 30 days", replace(job, wall_ms=30 * 24 * HOUR + 1), res, None),
        ("output cap over 64 TiB", replace(job, max_output_bytes=(1 << 46) + 1), res, None),
        ("relative output path", replace(job, output_path="out"), res, None),
        ("output path /", replace(job, output_path="/"), res, None),
        ("output path with ..", replace(job, output_path="/out/../etc"), res, None),
        ("grace over 10 minutes", job, res, Checkpoint(grace_ms=600_001)),
        ("checkpoint signal SIGKILL", job, res, Checkpoint(signal="SIGKILL")),
        ("checkpoint path /", job, res, Checkpoint(path="/")),
    ]  # fmt: skip
    cases: list[dict[str, object]] = []
    for name, j, r, cp in variants:
        case: dict[str, object] = {
            "name": name,
            "job": to_json(to_value(j)),
            "resources": to_json(to_value(r)),
            "checkpoint": None if cp is None else to_json(to_value(cp)),
        }
        try:
            check_limits(j, r, cp)
        except OutOfBounds as exc:
            case.update(valid=False, error=exc.reason.value, field=exc.field)
        else:
            case["valid"] = True
        cases.append(case)
    write("limits", "limits", "spec/messages.md#limits", cases)


def exit_reasons() -> None:
    """content.md "Exit reasons": what a provider observed, and the reason it reports."""
    observed: list[tuple[str, dict[str, object]]] = [
        ("exit 0", {"exit_code": 0}),
        ("exit 3", {"exit_code": 3}),
        ("killed by the OOM killer", {"exit_code": 137, "oom_kills": 1}),
        ("a child OOM-killed, the job exited 0", {"exit_code": 0, "oom_kills": 1}),
        ("a child OOM-killed, the job timed out", {"exit_code": 137, "oom_kills": 2,
                                                  "timed_out": True}),
        ("timed out", {"exit_code": 137, "timed_out": True}),
        ("timed out after forks hit the pids limit", {"exit_code": 137, "timed_out": True,
                                                      "pids_limit_hits": 5}),
        ("a fork failed, the job exited 1", {"exit_code": 1, "pids_limit_hits": 5}),
        ("a fork failed, the job exited 0", {"exit_code": 0, "pids_limit_hits": 5}),
        ("output one byte over the cap", {"exit_code": 0, "output_bytes": 11}),
        ("output over the cap after an OOM kill", {"exit_code": 137, "oom_kills": 1,
                                                   "output_bytes": 11}),
        ("output exactly at the cap", {"exit_code": 0, "output_bytes": 10}),
        ("preempted after an OOM kill", {"exit_code": 137, "preempted": True, "oom_kills": 1}),
        ("provider fault", {"exit_code": 0, "fault": True}),
    ]  # fmt: skip
    cases = [
        {
            "name": name,
            "observed": {"max_output_bytes": 10, **o},
            "exit_reason": classify(Observation(max_output_bytes=10, **o)).value,  # type: ignore[arg-type]
        }
        for name, o in observed
    ]
    write("exit-reasons", "exit_reasons", "spec/content.md#exit-reasons", cases)


def pricing() -> None:
    """pricing.md: what each policy asks, the cost floor, and when an offer is re-posted."""
    cases: list[dict[str, object]] = []
    capacity = Resources(cpu_milli=4000, memory_bytes=8 * GIB)
    rules = [
        ("fixed", {"policy": "fixed", "price": 90}, 3000, []),
        ("utilization, empty", {"policy": "utilization", "price": 90, "floor": 50,
                                "ceiling": 150}, 0, []),
        ("utilization, three quarters held", {"policy": "utilization", "price": 90,
                                              "floor": 50, "ceiling": 150}, 3000, []),
        ("utilization, a third held rounds down", {"policy": "utilization", "price": 90,
                                                   "floor": 0, "ceiling": 100}, 1333, []),
        ("utilization, over capacity is full", {"policy": "utilization", "price": 90,
                                                "floor": 50, "ceiling": 150}, 5000, []),
        ("market, no prints: the configured price", {"policy": "market", "price": 90,
                                                     "floor": 10}, 0, []),
        ("market, lower median of four less 2 %", {"policy": "market", "price": 90,
                                                   "undercut_ppm": 20_000}, 0,
         [120, 80, 100, 200]),
        ("market, never under its floor", {"policy": "market", "price": 90, "floor": 95},
         0, [60, 70, 80]),
        ("fixed, clamped into its ceiling", {"policy": "fixed", "price": 300,
                                             "ceiling": 200}, 0, []),
    ]  # fmt: skip
    for name, rule, held_milli, prints in rules:
        resource = ResourcePricing(
            **{**rule, "policy": Policy(rule["policy"])}  # type: ignore[arg-type]
        )
        got = asking(
            Pricing(resources={"cpu_core_hour": resource}),
            held=Resources(cpu_milli=held_milli, memory_bytes=0),
            capacity=capacity,
            prints={"cpu_core_hour": prints},
        )
        cases.append(
            {
                "name": name,
                "op": "asking",
                "rule": rule,
                "held_cpu_milli": held_milli,
                "capacity_cpu_milli": capacity.cpu_milli,
                "prints": prints,
                "cpu_core_hour": got.cpu_core_hour,
            }
        )
    for name, watts, kwh, wear, milli in [
        ("350 W at 0.30 per kWh, 16 cores", 350, 300_000, 0, 16_000),
        ("with 0.20 per hour of wear, 8 cores", 200, 250_000, 200_000, 8000),
        ("rounds up", 1, 1, 0, 3000),
    ]:
        floor = cost_floor(watts=watts, kwh_price=kwh, depreciation_per_hour=wear, cpu_milli=milli)
        cases.append(
            {
                "name": f"cost floor: {name}",
                "op": "cost_floor",
                "watts": watts,
                "kwh_price": kwh,
                "depreciation_per_hour": wear,
                "cpu_milli": milli,
                "floor": floor,
            }
        )
    for name, old, new, posted, now in [
        ("moved 10 %", 100, 110, 0, 10_000),
        ("moved exactly 5 %: not more than the step", 100, 105, 0, 10_000),
        ("moved 10 % too soon", 100, 110, 0, 9_999),
        ("from zero", 0, 1, 0, 10_000),
        ("unchanged", 100, 100, 0, 60_000),
    ]:
        cases.append(
            {
                "name": f"re-post: {name}",
                "op": "should_repost",
                "old_cpu_core_hour": old,
                "new_cpu_core_hour": new,
                "step_ppm": 50_000,
                "min_interval_ms": 10_000,
                "posted_ms": posted,
                "now_ms": now,
                "repost": should_repost(
                    Prices(cpu_core_hour=old),
                    Prices(cpu_core_hour=new),
                    step_ppm=50_000,
                    posted_ms=posted,
                    now_ms=now,
                    min_interval_ms=10_000,
                ),
            }
        )
    for at in (0, 149_999, 150_000, 449_999, 450_000, 600_000, 900_000):
        rung = ladder(
            Prices(cpu_core_hour=120_000_000, memory_gib_hour=10_000_000),
            created_ms=T0,
            deadline_ms=600_000,
            now_ms=T0 + at,
        )
        cases.append(
            {
                "name": f"ladder: {at} ms into a 10-minute deadline",
                "op": "ladder",
                "max_prices": {"cpu_core_hour": 120_000_000, "memory_gib_hour": 10_000_000},
                "created_ms": T0,
                "deadline_ms": 600_000,
                "now_ms": T0 + at,
                "limit": {
                    "cpu_core_hour": rung.limit.cpu_core_hour,
                    "memory_gib_hour": rung.limit.memory_gib_hour,
                },
                "next_rise_ms": rung.next_rise_ms,
            }
        )
    write("pricing", "pricing", "spec/pricing.md#test-vectors", cases)


def sample_print(at_ms: int = T0) -> TradePrint:
    return TradePrint(
        trade_id=hashlib.sha256(b"cx/trade-id/v1\x00" + bytes(32)).digest(),
        resource_class="amd64/cpu/eu",
        prices=Prices(cpu_core_hour=90_000_000, memory_gib_hour=9_000_000),
        resources=Resources(cpu_milli=1000, memory_bytes=GIB),
        at_ms=at_ms,
        buyer=PrivateKey.from_seed(seed("alice")).public_key.raw,
        provider=PrivateKey.from_seed(seed("bob")).public_key.raw,
    )


def tape() -> None:
    """tape.md: a print's bytes and signatures, and what admission refuses."""
    alice, bob = PrivateKey.from_seed(seed("alice")), PrivateKey.from_seed(seed("bob"))
    trade = sample_print()
    raw = encode(to_value(trade))
    buyer_sig, provider_sig = sign_print(alice, trade), sign_print(bob, trade)

    def wire(print_bytes: bytes, b: bytes, p: bytes) -> bytes:
        return encode({"print": print_bytes, "buyer_sig": b, "provider_sig": p})

    good = wire(raw, buyer_sig, provider_sig)
    cases: list[dict[str, object]] = [
        {
            "name": "a print signed by both parties",
            "valid": True,
            "trade": to_json(to_value(trade)),
            "print_hex": raw.hex(),
            "wire": good.hex(),
            "now_ms": T0,
        }
    ]
    selfish = replace(trade, provider=trade.buyer)
    selfish_raw = encode(to_value(selfish))
    invalid = [
        ("the buyer's signature forged", wire(raw, bytes(64), provider_sig), T0),
        ("one signature: the provider's twice", wire(raw, provider_sig, provider_sig), T0),
        ("a price changed after signing",
         wire(encode(to_value(replace(trade, prices=Prices(cpu_core_hour=1)))), buyer_sig,
              provider_sig), T0),
        ("buyer and provider the same key",
         wire(selfish_raw, sign_print(alice, selfish), sign_print(alice, selfish)), T0),
        ("older than the tape keeps (a day)", good, T0 + 86_400_001),
        ("from the future (more than 30 s ahead)", good, T0 - 30_001),
        ("a signature missing", encode({"print": raw, "buyer_sig": buyer_sig}), T0),
    ]  # fmt: skip
    for name, data, now in invalid:
        cases.append(
            {
                "name": name,
                "valid": False,
                "wire": data.hex(),
                "now_ms": now,
                "error": reason_of(data, lambda w, now=now: Tape().admit(w, now_ms=now)),
            }
        )
    tape_ = Tape()
    tape_.admit(good, now_ms=T0)
    cases.append(
        {
            "name": "the same print again",
            "valid": False,
            "wire": good.hex(),
            "now_ms": T0,
            "replay": True,
            "error": reason_of(good, lambda w: tape_.admit(w, now_ms=T0)),
        }
    )
    write("tape", "tape", "spec/tape.md#test-vectors", cases)


def work() -> None:
    """work.md: the score from a benchmark run, and what it makes of an offer."""
    cases: list[dict[str, object]] = [
        {"name": f"score: {b >> 20} MiB in {us} us", "op": "score", "bytes": b, "cpu_us": us,
         "work_score": score_of(b, us)}
        for b, us in ((256 << 20, 1_000_000), (256 << 20, 1_958_674), (1 << 30, 3_600_000_001))
    ]  # fmt: skip
    for name, price, score, watts, limit in [
        ("scored offer within a per-work limit", 90_000_000, 900, 350, 100_000),
        ("scored offer over a per-work limit", 90_000_000, 900, 350, 99_999),
        ("offer without a score fails any per-work limit", 90_000_000, None, None, 10**9),
        ("no per-work limit", 90_000_000, None, None, None),
        ("price per unit rounds up", 100, 3, None, None),
    ]:
        o = replace(sample_offer(), work_score=score, watts=watts)
        o = replace(o, prices=replace(o.prices, cpu_core_hour=price))
        cases.append(
            {
                "name": name,
                "op": "offer",
                "cpu_core_hour": price,
                "work_score": score,
                "watts": watts,
                "cpu_milli": o.capacity.cpu_milli,
                "work_price": work_price(o),
                "work_per_kwh": work_per_kwh(o),
                "max_work_price": limit,
                "fits": work_fits(o, limit),
            }
        )
    write("work", "work", "spec/work.md#test-vectors", cases)


def estimates() -> None:
    """workloads.md "Estimation": estimation labels, and the resources a measured run
    recommends."""
    labels = [
        ("command and sample", '{"command": ["sh", "-c", "run --quick"], "sample_bytes": 4096}'),
        ("memory grows with the input", '{"sample_bytes": 1, "memory": "linear"}'),
        ("empty: the job's own command on whole inputs", "{}"),
        ("not JSON", "sample 4k"),
        ("not an object", '["sh"]'),
        ("unknown key", '{"cmd": ["sh"]}'),
        ("command as a string", '{"command": "sh -c x"}'),
        ("empty command", '{"command": []}'),
        ("zero sample", '{"sample_bytes": 0}'),
        ("boolean sample", '{"sample_bytes": true}'),
        ("unknown memory rule", '{"memory": "quadratic"}'),
    ]
    cases: list[dict[str, object]] = []
    for name, label in labels:
        case: dict[str, object] = {"name": f"label: {name}", "label": label}
        try:
            rule = parse_estimate_label(label)
        except BadEstimateLabel as exc:
            case.update(valid=False, error=exc.reason, key=exc.key)
        else:
            case.update(
                valid=True,
                command=None if rule.command is None else list(rule.command),
                sample_bytes=rule.sample_bytes,
                memory_scales=rule.memory_scales,
            )
        cases.append(case)
    runs: list[tuple[str, Observed, int, int, bool]] = [
        ("a whole run", Observed(wall_ms=2000, cpu_us=1_500_000, memory_peak_bytes=100 << 20,
                                 scratch_bytes=10 << 20), 0, 0, False),
        ("a quarter sample, fixed memory", Observed(wall_ms=1000, cpu_us=900_000,
                                                    memory_peak_bytes=40 << 20,
                                                    io_read_bytes=10), 4000, 1000, False),
        ("a quarter sample, linear memory", Observed(wall_ms=1000, cpu_us=900_000,
                                                     memory_peak_bytes=40 << 20), 4000, 1000,
         True),
        ("an instant run", Observed(wall_ms=0, cpu_us=0, memory_peak_bytes=0), 0, 0, False),
        ("more than the bounds", Observed(wall_ms=20 * 24 * HOUR, cpu_us=10**15,
                                          memory_peak_bytes=1 << 47), 0, 0, False),
    ]  # fmt: skip
    for name, seen, full, sampled, linear in runs:
        rec = recommend(
            seen, full_input_bytes=full, sampled_input_bytes=sampled, memory_scales=linear
        )
        cases.append(
            {
                "name": f"recommend: {name}",
                "observed": dataclasses.asdict(seen),
                "full_input_bytes": full,
                "sampled_input_bytes": sampled,
                "memory_scales": linear,
                "resources": to_json(to_value(rec.resources)),
                "wall_ms": rec.wall_ms,
                "expected": to_json(to_value(rec.expected)),
            }
        )
    write("estimate", "estimate", "spec/workloads.md#test-vectors", cases)


def elastic() -> None:
    """workloads.md "Elastic jobs": when limits grow, and what grants cost."""
    mib = 1 << 20
    steps = [
        ("below 90 %: hold", 100 * mib, 89 * mib, 400 * mib, 1 << 30),
        ("at 90 %: half again", 100 * mib, 90 * mib, 400 * mib, 1 << 30),
        ("small limit: at least 16 MiB", 20 * mib, 19 * mib, 400 * mib, 1 << 30),
        ("capped by the ceiling", 100 * mib, 99 * mib, 120 * mib, 1 << 30),
        ("capped by what is free", 100 * mib, 99 * mib, 400 * mib, 10 * mib),
        ("no room: exhausted", 100 * mib, 99 * mib, 400 * mib, 0),
        ("at the ceiling: meets its limit", 100 * mib, 99 * mib, 100 * mib, 1 << 30),
    ]
    cases: list[dict[str, object]] = []
    for name, limit, used, top, free in steps:
        step = memory_step(limit=limit, used=used, top=top, free=free)
        cases.append({"name": f"memory: {name}", "limit": limit, "used": used, "top": top,
                      "free": free, "new_limit": step.limit, "exhausted": step.exhausted})  # fmt: skip
    grants_cpu = [
        ("within the ceiling", 4000, 1000, 8000, 16000),
        ("above the ceiling", 32000, 1000, 8000, 16000),
        ("more than is free", 8000, 1000, 8000, 2000),
        ("less than it has", 500, 1000, 8000, 16000),
    ]
    for name, asked, current, top, free in grants_cpu:
        cases.append({"name": f"cpu: {name}", "asked": asked, "current": current, "top": top,
                      "free": free, "granted": cpu_grant(asked=asked, current=current, top=top,
                                                         free=free)})  # fmt: skip
    prices = Prices(cpu_core_hour=1_000_000, memory_gib_hour=100_000)
    reserved = Resources(cpu_milli=1000, memory_bytes=1 << 30)
    usages = [
        ("no grants", Usage(wall_ms=HOUR, cpu_us=HOUR * 1000)),
        ("doubled memory half way", Usage(wall_ms=HOUR, cpu_us=HOUR * 1000, grants=(
            Grant(at_ms=HOUR // 2, cpu_milli=1000, memory_bytes=2 << 30),))),
        ("a grant after the end counts for nothing", Usage(wall_ms=HOUR, cpu_us=0, grants=(
            Grant(at_ms=HOUR, cpu_milli=4000, memory_bytes=8 << 30),))),
    ]  # fmt: skip
    for name, usage in usages:
        cases.append({"name": f"cost: {name}", "prices": to_json(to_value(prices)),
                      "reserved": to_json(to_value(reserved)), "usage": to_json(to_value(usage)),
                      "cost": cost(prices, reserved, usage)})  # fmt: skip
    write("elastic", "elastic", "spec/workloads.md#test-vectors", cases)


def direct_channel() -> None:
    """content.md "Direct channel": the negotiation, the keys and the records."""
    requester, server = (
        PrivateKey.from_seed(seed("requester")),
        PrivateKey.from_seed(seed("server")),
    )
    nonce_c, nonce_s = seed("requester nonce"), seed("server nonce")
    keys = derive_keys(nonce_c, nonce_s, requester.peer_id, server.peer_id, we_request=True)
    c2s, s2c = Sealer(keys.send), Sealer(keys.receive)
    c2s_plain = [
        REQUESTER_HELLO,
        encode({"blob": "sha256:" + "ab" * 32, "indices": [0, 1], "op": "chunks"}),
    ]
    s2c_plain = [SERVER_HELLO, encode({"ok": True})]
    c2s_records = [bytes(c2s.seal(p)) for p in c2s_plain]
    s2c_records = [bytes(s2c.seal(p)) for p in s2c_plain]
    offer = DirectOffer(nonce=nonce_s, port=40123).encode()
    valid = {
        "name": "a channel: request, offer, keys, the hellos and one request each way",
        "valid": True,
        "requester": requester.peer_id,
        "server": server.peer_id,
        "requester_nonce": nonce_c.hex(),
        "server_nonce": nonce_s.hex(),
        "request": encode(direct_request(nonce_c)).hex(),
        "offer": offer.hex(),
        "port": 40123,
        "c2s_key": keys.send.hex(),
        "s2c_key": keys.receive.hex(),
        "c2s": [{"plaintext": p.hex(), "record": r.hex()} for p, r in zip(c2s_plain, c2s_records, strict=True)],
        "s2c": [{"plaintext": p.hex(), "record": r.hex()} for p, r in zip(s2c_plain, s2c_records, strict=True)],
    }  # fmt: skip
    tampered = bytearray(c2s_records[1])
    tampered[-1] ^= 1
    wrong_key = Sealer(keys.receive)  # the server's key used the requester's way
    wrong_key.seal(b"x")
    over = (4 * 1024 * 1024 + 64 * 1024 + 17).to_bytes(4, "big")

    def record_case(name: str, before: list[bytes], record: bytes, error: str) -> dict[str, object]:
        return {"name": name, "valid": False, "check": "record", "key": keys.send.hex(),
                "before": [r.hex() for r in before], "data": record.hex(), "error": error}  # fmt: skip

    def message_case(name: str, check: str, data: bytes) -> dict[str, object]:
        parse = (
            decode_offer
            if check == "offer"
            else (
                lambda b: parse_direct_request(decode(b))  # type: ignore[arg-type]
            )
        )
        return {"name": name, "valid": False, "check": check, "data": data.hex(),
                "error": reason_of(data, parse)}  # fmt: skip

    invalid = [
        record_case("a tampered record", c2s_records[:1], bytes(tampered), "bad-seal"),
        record_case("a replayed record (the hello again)", c2s_records[:1], c2s_records[0], "bad-seal"),
        record_case("records out of order (second first)", [], c2s_records[1], "bad-seal"),
        record_case("a record sealed with the other direction's key", [], bytes(wrong_key.seal(b"x")), "bad-seal"),
        record_case("a length over the cap", [], over, "too-large"),
        record_case("a length that cannot hold a tag", [], (16).to_bytes(4, "big"), "too-large"),
        message_case("an offer of port 0", "offer", encode({"nonce": nonce_s, "port": 0})),
        message_case("an offer with a 31-byte nonce", "offer", encode({"nonce": nonce_s[:31], "port": 1})),
        message_case("an offer with an extra field", "offer", encode({"nonce": nonce_s, "port": 1, "host": "x"})),
        message_case("a request without its nonce", "request", encode({"op": "direct"})),
        message_case("a request with a string nonce", "request", encode({"nonce": "n" * 32, "op": "direct"})),
    ]  # fmt: skip
    write("direct", "direct-channel", "spec/content.md#direct-channel", [valid, *invalid])


if __name__ == "__main__":
    encoding()
    identity()
    messages()
    matching()
    settlement()
    limits()
    exit_reasons()
    sealed_secrets()
    pricing()
    tape()
    work()
    reputation()
    estimates()
    elastic()
    direct_channel()
