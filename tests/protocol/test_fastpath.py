"""The fast path opens exactly what the strict path opens, and hands back everything else."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import msgpack
import pytest
from factories import HOUR_MS, IMAGE, T0, Nonces, bid, key, offer

from protocol.encoding import DEFAULT_LIMITS, Limits, decode, encode
from protocol.envelope import (
    MESSAGE_TYPES,
    NONCE_SIZE,
    SIGNATURE_SIZE,
    _parse_body,
    seal,
)
from protocol.errors import DecodeError, InvalidMessage
from protocol.fastpath import FastCodec
from protocol.messages import (
    Bid,
    Cancel,
    Checkpoint,
    Constraints,
    DataRef,
    Gpu,
    JobSpec,
    TrustLevel,
    TrustRequirement,
)
from protocol.schema import from_value

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fuzz"))
from fuzz_messages import mutate

VECTORS = Path(__file__).resolve().parents[2] / "spec" / "vectors"
CODEC = FastCodec(MESSAGE_TYPES, DEFAULT_LIMITS, NONCE_SIZE)


def strict(body: bytes) -> tuple[object, ...] | None:
    """What protocol.envelope's strict path makes of a body, in the fast path's shape."""
    try:
        head = _parse_body(decode(body))
        cls = MESSAGE_TYPES.get(head["type"])
        if cls is None or len(head["from"]) != 32:
            return None
        payload = from_value(cls, head["data"])
    except (DecodeError, InvalidMessage):
        return None
    return head["type"], head["from"], head["nonce"], head["iat"], head["exp"], payload


def bodies() -> list[bytes]:
    nonce, signer = Nonces("fast"), key("fast")
    payloads = [
        offer(),
        offer(region="us", trust=(TrustLevel.NONE, TrustLevel.TPM)),
        bid(),
        bid(constraints=Constraints(regions=("eu", "ap"), gpu_model="h100", min_reputation=3)),
        bid(
            constraints=Constraints(
                trust=TrustRequirement(level=TrustLevel.TPM, pcrs={"sha256:7": "00" * 32})
            )
        ),
        Cancel(order_id=bytes(32)),
    ]
    wires = [
        seal(signer, p, nonce=nonce(), issued_ms=T0, expires_ms=T0 + HOUR_MS).wire for p in payloads
    ]
    for path in sorted(VECTORS.glob("messages*.json")):
        wires += [bytes.fromhex(case["wire"]) for case in json.loads(path.read_text())["cases"]]
    return [wire[SIGNATURE_SIZE:] for wire in wires if len(wire) > SIGNATURE_SIZE]


def test_every_valid_order_takes_the_fast_path_with_the_strict_result():
    opened = 0
    for body in bodies():
        expected = strict(body)
        got = CODEC.open(body)
        if expected is not None and expected[0] in ("offer", "bid", "cancel"):
            assert got == expected
            opened += 1
        else:
            assert got is None or got == expected
    assert opened >= 6


def test_the_other_messages_take_the_fast_path_too():
    job = JobSpec(
        image=IMAGE,
        command=("run",),
        inputs=(DataRef(digest=IMAGE, path="/in", size=3, url="s3://bucket/key"),),
        registry="localhost:5000/app",
        secrets=("registry",),
    )
    payload = Bid(
        job=job,
        resources=bid().resources,
        max_prices=bid().max_prices,
        checkpoint=Checkpoint(),
        preemptible=True,
    )
    body = seal(key("x"), payload, nonce=bytes(16), issued_ms=1, expires_ms=2).body
    assert CODEC.open(body) == strict(body) != None  # noqa: E711


def _body(data: dict[str, object], **head: object) -> bytes:
    value = {
        "type": "offer",
        "from": key("x").public_key.raw,
        "nonce": bytes(NONCE_SIZE),
        "iat": 1,
        "exp": 2,
        "data": data,
    }
    value.update(head)
    # raw msgpack: the data map as given, in any order and form; the head sorted
    return msgpack.packb(dict(sorted(value.items())), use_bin_type=True)


def _offer_value() -> dict[str, object]:
    value = decode(seal(key("x"), offer(), nonce=bytes(16), issued_ms=1, expires_ms=2).body)
    assert isinstance(value, dict)
    return dict(sorted(value["data"].items()))  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("why", "change"),
    [
        ("unknown field", lambda d: d.update(zzz=1)),
        ("missing field", lambda d: d.pop("region")),
        ("nil for an absent optional", lambda d: d.update(seal_key=None)),
        ("negative unsigned int", lambda d: d.update(max_wall_ms=-1)),
        ("bool for an int", lambda d: d.update(max_wall_ms=True)),
        ("str for bytes", lambda d: d.update(seal_key="k" * 32)),
        ("not an enum value", lambda d: d.update(arch="sparc")),
        ("post-init rule", lambda d: d.update(gpus=[{"memory_bytes": 1, "model": "a"}])),
    ],
)
def test_what_the_strict_path_refuses_is_handed_back(why, change):
    data = _offer_value()
    assert CODEC.open(_body(data)) is not None
    change(data)
    body = _body(dict(sorted(data.items())))
    assert strict(body) is None, why
    assert CODEC.open(body) is None, why


def test_non_canonical_forms_are_handed_back():
    data = _offer_value()
    canonical = _body(data)
    assert CODEC.open(canonical) is not None
    unsorted = _body(dict(reversed(data.items())))
    long_int = canonical.replace(b"\xa3iat\x01", b"\xa3iat\xcc\x01")  # uint8 for a fixint
    assert long_int != canonical
    for body in (unsorted, long_int, canonical + b"\x00", canonical[:-1]):
        assert strict(body) is None
        assert CODEC.open(body) is None
    assert encode({"k": Gpu(model="a", memory_bytes=1).memory_bytes}) == b"\x81\xa1k\x01"


def test_limits_beyond_what_the_fast_path_states_take_the_strict_path():
    small = Limits(max_str=64)
    body = bodies()[2]  # a bid, longer than 64 bytes
    assert FastCodec(MESSAGE_TYPES, small, NONCE_SIZE).open(body) is None
    shallow = Limits(max_depth=3)  # a bid nests deeper than that
    assert FastCodec(MESSAGE_TYPES, shallow, NONCE_SIZE).open(body) is None
    narrow = Limits(max_array=1)
    assert FastCodec(MESSAGE_TYPES, narrow, NONCE_SIZE).open(body) is None


def test_mutated_bodies_open_only_as_the_strict_path_opens_them():
    rng = random.Random(14)
    corpus = bodies()
    accepted = 0
    for _ in range(20_000):
        body = mutate(rng, rng.choice(corpus), corpus)
        got = CODEC.open(body)
        if got is not None:
            assert got == strict(body)
            accepted += 1
    assert accepted > 0
