"""Runs every protocol vector file in spec/vectors/ against the code (spec/*.md#test-vectors)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nacl.public
import pytest

VECTORS = Path(__file__).resolve().parent.parent / "spec" / "vectors"
sys.path.insert(0, str(VECTORS))

from tagged import from_json

from protocol.book import OrderBook
from protocol.direct import (
    Opener,
    Sealer,
    decode_offer,
    derive_keys,
    direct_request,
    parse_direct_request,
)
from protocol.elastic import cpu_grant, memory_step
from protocol.encoding import decode, encode
from protocol.envelope import MESSAGE_TYPES, open_signed, seal
from protocol.errors import DecodeError, InvalidMessage
from protocol.estimate import BadEstimateLabel, Observed, parse_estimate_label, recommend
from protocol.identity import PrivateKey
from protocol.limits import OutOfBounds
from protocol.limits import check_limits as limits_of
from protocol.messages import (
    Arch,
    Bid,
    Checkpoint,
    ExitReason,
    JobSpec,
    Offer,
    Prices,
    Resources,
    Usage,
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
from protocol.schema import from_value, to_value
from protocol.secrets import encode_secrets, open_secrets
from protocol.settlement import charge, cost
from protocol.tape import Tape, TradePrint
from protocol.usage import Observation, classify
from protocol.work import score_of, work_fits, work_per_kwh, work_price


def _cases():
    for path in sorted(VECTORS.glob("*.json")):
        doc = json.loads(path.read_text())
        for case in doc["cases"]:
            yield pytest.param(doc["kind"], case, id=f"{path.stem}: {case['name']}")


def _reason(fn, data):
    with pytest.raises((DecodeError, InvalidMessage)) as info:
        fn(data)
    return info.value.reason.value


def check_encoding(case):
    data = bytes.fromhex(case["hex"])
    if case["valid"]:
        assert decode(data) == from_json(case["value"])
        assert encode(from_json(case["value"])) == data
    else:
        assert _reason(decode, data) == case["error"]


def check_identity(case):
    key = PrivateKey.from_seed(bytes.fromhex(case["seed"]))
    assert key.public_key.raw.hex() == case["public_key"]
    assert key.peer_id == case["peer_id"]
    assert key.to_libp2p_bytes().hex() == case["libp2p_private_key"]
    signature = bytes.fromhex(case["signature"])
    assert key.sign(case["domain"].encode(), bytes.fromhex(case["data"])) == signature
    key.public_key.verify(case["domain"].encode(), bytes.fromhex(case["data"]), signature)


def check_messages(case):
    wire = bytes.fromhex(case["wire"])
    if not case["valid"]:
        assert _reason(open_signed, wire) == case["error"]
        return
    cls = MESSAGE_TYPES[case["type"]]
    payload = from_value(cls, from_json(case["data"]))
    key = PrivateKey.from_seed(bytes.fromhex(case["seed"]))
    sealed = seal(
        key,
        payload,
        nonce=bytes.fromhex(case["nonce"]),
        issued_ms=case["iat"],
        expires_ms=case["exp"],
    )
    assert sealed.wire == wire
    opened = open_signed(wire, cls)
    assert opened.payload == payload
    assert opened.id.hex() == case["id"]


def check_matching(case):
    book = OrderBook()
    now = case["now_ms"]
    ids = []
    for i, entry in enumerate(case["offers"]):
        msg = seal(
            PrivateKey.from_seed(bytes.fromhex(entry["signer"])),
            from_value(Offer, from_json(entry["data"])),
            nonce=i.to_bytes(16, "big"),
            issued_ms=entry["issued_ms"],
            expires_ms=now + 3_600_000,
        )
        ids.append(msg.id)
        book.add_offer(msg, now_ms=now)
    bid = from_value(Bid, from_json(case["bid"]))
    why = book.explain(bid, now_ms=now)
    assert why.ruled_out == case["ruled_out"]
    assert why.best_quote == case["best_quote"]
    assert why.budget == case["budget"]
    buyer = PrivateKey.from_seed(b"\x01" * 32)
    order = seal(buyer, bid, nonce=bytes(16), issued_ms=now, expires_ms=now + 3_600_000)
    matches = book.add_bid(order, now_ms=now, active=True)
    if case["match"] is None:
        assert matches == []
    else:
        [match] = matches
        assert match.offer.id == ids[case["match"]]
        assert match.max_cost == case["max_cost"]
        assert match.transfer.total == case["transfer"]


def check_settlement(case):
    got = charge(
        from_value(Prices, case["prices"]),
        from_value(Resources, case["reserved"]),
        case["max_cost"],
        from_value(Usage, case["usage"]),
        ExitReason(case["exit_reason"]),
    )
    assert got == case["charge"]


def check_pricing(case):
    if case["op"] == "asking":
        rule = case["rule"]
        resource = ResourcePricing(**{**rule, "policy": Policy(rule["policy"])})
        got = asking(
            Pricing(resources={"cpu_core_hour": resource}),
            held=Resources(cpu_milli=case["held_cpu_milli"], memory_bytes=0),
            capacity=Resources(cpu_milli=case["capacity_cpu_milli"], memory_bytes=0),
            prints={"cpu_core_hour": case["prints"]},
        )
        assert got.cpu_core_hour == case["cpu_core_hour"]
    elif case["op"] == "ladder":
        rung = ladder(
            Prices(**case["max_prices"]),
            created_ms=case["created_ms"],
            deadline_ms=case["deadline_ms"],
            now_ms=case["now_ms"],
        )
        assert (rung.limit.cpu_core_hour, rung.limit.memory_gib_hour) == (
            case["limit"]["cpu_core_hour"],
            case["limit"]["memory_gib_hour"],
        )
        assert rung.next_rise_ms == case["next_rise_ms"]
    elif case["op"] == "cost_floor":
        named = ("watts", "kwh_price", "depreciation_per_hour", "cpu_milli")
        assert cost_floor(**{k: case[k] for k in named}) == case["floor"]
    else:
        moved = should_repost(
            Prices(cpu_core_hour=case["old_cpu_core_hour"]),
            Prices(cpu_core_hour=case["new_cpu_core_hour"]),
            step_ppm=case["step_ppm"],
            posted_ms=case["posted_ms"],
            now_ms=case["now_ms"],
            min_interval_ms=case["min_interval_ms"],
        )
        assert moved is case["repost"]


def check_tape(case):
    wire = bytes.fromhex(case["wire"])
    tape = Tape()
    if case["valid"]:
        signed = tape.admit(wire, now_ms=case["now_ms"])
        assert signed.trade == from_value(TradePrint, from_json(case["trade"]))
        assert encode(to_value(signed.trade)).hex() == case["print_hex"]
        return
    if case.get("replay"):
        tape.admit(wire, now_ms=case["now_ms"])
    assert _reason(lambda w: tape.admit(w, now_ms=case["now_ms"]), wire) == case["error"]


def check_work(case):
    if case["op"] == "score":
        assert score_of(case["bytes"], case["cpu_us"]) == case["work_score"]
        return
    offer = Offer(
        capacity=Resources(cpu_milli=case["cpu_milli"], memory_bytes=1 << 30),
        prices=Prices(cpu_core_hour=case["cpu_core_hour"]),
        arch=Arch.AMD64,
        work_score=case["work_score"],
        watts=case["watts"],
    )
    assert work_price(offer) == case["work_price"]
    assert work_per_kwh(offer) == case["work_per_kwh"]
    assert work_fits(offer, case["max_work_price"]) is case["fits"]


def check_exit_reasons(case):
    assert classify(Observation(**case["observed"])).value == case["exit_reason"]


def check_limits(case):
    job = from_value(JobSpec, from_json(case["job"]))
    resources = from_value(Resources, from_json(case["resources"]))
    checkpoint = case["checkpoint"] and from_value(Checkpoint, from_json(case["checkpoint"]))
    if case["valid"]:
        limits_of(job, resources, checkpoint)
    else:
        with pytest.raises(OutOfBounds) as info:
            limits_of(job, resources, checkpoint)
        assert info.value.reason.value == case["error"]
        assert info.value.field == case["field"]


def check_estimate(case):
    if "label" in case:
        if not case["valid"]:
            with pytest.raises(BadEstimateLabel) as info:
                parse_estimate_label(case["label"])
            assert (info.value.reason, info.value.key) == (case["error"], case["key"])
            return
        rule = parse_estimate_label(case["label"])
        command = None if rule.command is None else list(rule.command)
        assert command == case["command"]
        assert (rule.sample_bytes, rule.memory_scales) == (
            case["sample_bytes"],
            case["memory_scales"],
        )
        return
    rec = recommend(
        Observed(**case["observed"]),
        full_input_bytes=case["full_input_bytes"],
        sampled_input_bytes=case["sampled_input_bytes"],
        memory_scales=case["memory_scales"],
    )
    assert rec.resources == from_value(Resources, from_json(case["resources"]))
    assert rec.wall_ms == case["wall_ms"]
    assert rec.expected == from_value(Usage, from_json(case["expected"]))


def check_elastic(case):
    name = case["name"]
    if name.startswith("memory: "):
        step = memory_step(limit=case["limit"], used=case["used"], top=case["top"],
                           free=case["free"])  # fmt: skip
        assert (step.limit, step.exhausted) == (case["new_limit"], case["exhausted"])
    elif name.startswith("cpu: "):
        got = cpu_grant(asked=case["asked"], current=case["current"], top=case["top"],
                        free=case["free"])  # fmt: skip
        assert got == case["granted"]
    else:
        prices = from_value(Prices, from_json(case["prices"]))
        reserved = from_value(Resources, from_json(case["reserved"]))
        assert cost(prices, reserved, from_value(Usage, from_json(case["usage"]))) == case["cost"]


def check_sealed_secrets(case):
    recipient = bytes.fromhex(case["recipient"])
    assert bytes(nacl.public.PrivateKey(recipient).public_key).hex() == case["seal_key"]
    box, agreement = bytes.fromhex(case["box"]), bytes.fromhex(case["agreement_id"])
    if not case["valid"]:
        with pytest.raises(InvalidMessage) as info:
            open_secrets(box, recipient, agreement_id=agreement)
        assert info.value.reason.value == case["error"]
        return
    plain = open_secrets(box, recipient, agreement_id=agreement)
    assert to_value(plain) == from_json(case["plaintext"])
    assert encode_secrets(plain) == encode(from_json(case["plaintext"]))


def _open_record(opener, record):
    size = Opener.record_size(record[:4])
    assert len(record) == 4 + size
    return opener.open(record[4:])


def check_direct_channel(case):
    if not case["valid"]:
        data = bytes.fromhex(case["data"])
        if case["check"] == "record":
            opener = Opener(bytes.fromhex(case["key"]))
            for record in case["before"]:
                _open_record(opener, bytes.fromhex(record))
            with pytest.raises(InvalidMessage) as info:
                _open_record(opener, data)
        else:
            parse = (
                decode_offer
                if case["check"] == "offer"
                else lambda b: parse_direct_request(decode(b))
            )
            with pytest.raises((DecodeError, InvalidMessage)) as info:
                parse(data)
        assert info.value.reason.value == case["error"]
        return
    nonce_c, nonce_s = bytes.fromhex(case["requester_nonce"]), bytes.fromhex(case["server_nonce"])
    assert encode(direct_request(nonce_c)).hex() == case["request"]
    assert parse_direct_request(decode(bytes.fromhex(case["request"]))) == nonce_c
    offer = decode_offer(bytes.fromhex(case["offer"]))
    assert (offer.nonce, offer.port) == (nonce_s, case["port"])
    ours = derive_keys(nonce_c, nonce_s, case["requester"], case["server"], we_request=True)
    theirs = derive_keys(nonce_c, nonce_s, case["requester"], case["server"], we_request=False)
    assert (ours.send.hex(), ours.receive.hex()) == (case["c2s_key"], case["s2c_key"])
    assert (theirs.send, theirs.receive) == (ours.receive, ours.send)
    for direction, key in (("c2s", ours.send), ("s2c", ours.receive)):
        sealer, opener = Sealer(key), Opener(key)
        for item in case[direction]:
            plain, record = bytes.fromhex(item["plaintext"]), bytes.fromhex(item["record"])
            assert bytes(sealer.seal(plain)) == record
            assert _open_record(opener, record) == plain


@pytest.mark.parametrize(("kind", "case"), list(_cases()))
def test_vector(kind, case):
    globals()[f"check_{kind.replace('-', '_')}"](case)
