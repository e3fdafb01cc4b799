"""Every limit of a job is checked in one place (protocol.limits), and a provider refuses
terms outside it (issue 17, D4)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from factories import HOUR_MS, IMAGE, T0, Nonces, bid, key, offer

from protocol.buying import Buying
from protocol.errors import InvalidMessage, Reason
from protocol.limits import (
    LIMITS,
    OutOfBounds,
    check_limits,
    check_pids_limit,
)
from protocol.messages import Checkpoint, JobSpec, Reject, RejectReason, Resources
from protocol.selling import Selling
from protocol.trader import Trader

MIB = 1 << 20
JOB = JobSpec(image=IMAGE, command=("true",))
RES = Resources(cpu_milli=500, memory_bytes=64 * MIB)


def _field_of(exc: pytest.ExceptionInfo[OutOfBounds]) -> str:
    assert isinstance(exc.value, InvalidMessage)  # what a provider's screen catches
    assert exc.value.reason is Reason.BAD_FIELD
    assert str(exc.value) == f"bad-field: {exc.value.field}: {exc.value.why}"
    return exc.value.field


@pytest.mark.parametrize(
    ("field", "resources"),
    [
        # the careless values of issue 17, D4
        ("resources.memory_bytes", replace(RES, memory_bytes=0)),
        ("resources.memory_bytes", replace(RES, memory_bytes=1)),
        ("resources.memory_bytes", replace(RES, memory_bytes=999_999_999_999_999_999_999)),
        ("resources.cpu_milli", replace(RES, cpu_milli=1_000_000_000 * 1000)),
        ("resources.cpu_milli", replace(RES, cpu_milli=0)),
        ("resources.cpu_milli", replace(RES, cpu_milli=-1000)),
        ("resources.disk_bytes", replace(RES, disk_bytes=-1)),
        ("resources.gpus", replace(RES, gpus=10_000)),
    ],
)
def test_careless_resources_are_refused(field, resources):
    with pytest.raises(OutOfBounds) as exc:
        check_limits(JOB, resources, None)
    assert _field_of(exc) == field


@pytest.mark.parametrize("pids", [0, -1, 7, 4_194_305])
def test_careless_pids_limit_is_refused(pids):
    with pytest.raises(InvalidMessage, match="pids_limit"):
        check_pids_limit(pids)


def test_every_bound_is_inclusive():
    for field, bounds in LIMITS.items():
        for value, ok in (
            (bounds.minimum - 1, False),
            (bounds.minimum, True),
            (bounds.maximum, True),
            (bounds.maximum + 1, False),
        ):
            if field == "pids_limit":
                call = lambda v=value: check_pids_limit(v)  # noqa: E731
            else:
                call = lambda f=field, v=value: check_limits(*_with(f, v))  # noqa: E731
            if ok:
                call()
            else:
                with pytest.raises(InvalidMessage, match=field.replace(".", r"\.")):
                    call()


def _with(field: str, value: int) -> tuple[JobSpec, Resources, Checkpoint | None]:
    part, name = field.split(".")
    if part == "resources":
        return JOB, replace(RES, **{name: value}), None
    if part == "job":
        job = replace(JOB)
        object.__setattr__(job, name, value)  # past JobSpec's own wall_ms > 0 rule
        return job, RES, None
    return JOB, RES, Checkpoint(**{name: value})


@pytest.mark.parametrize(
    ("field", "job", "checkpoint"),
    [
        ("job.output_path", replace(JOB, output_path="out"), None),
        ("job.output_path", replace(JOB, output_path="/"), None),
        ("job.output_path", replace(JOB, output_path="/out/../etc"), None),
        ("checkpoint.signal", JOB, Checkpoint(signal="SIGKILL")),
        ("checkpoint.signal", JOB, Checkpoint(signal="TERM")),
        ("checkpoint.path", JOB, Checkpoint(path="/")),
        ("checkpoint.grace_ms", JOB, Checkpoint(grace_ms=24 * HOUR_MS)),
    ],
)
def test_unusable_paths_and_checkpoints_are_refused(field, job, checkpoint):
    with pytest.raises(OutOfBounds) as exc:
        check_limits(job, RES, checkpoint)
    assert _field_of(exc) == field


def test_the_message_says_what_is_allowed():
    with pytest.raises(InvalidMessage) as exc:
        check_limits(JOB, replace(RES, memory_bytes=1), None)
    assert str(exc.value) == (
        "bad-field: resources.memory_bytes: 1 bytes is outside 4194304..70368744177664 bytes"
    )


def test_provider_rejects_a_bid_outside_the_limits_as_bad_terms():
    buyer, provider = Buying(Trader(key("buyer"))), Selling(Trader(key("provider")))
    nonce = Nonces()
    posted = provider.post_offer(offer(), nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    buyer.trader.receive_order(posted.wire, now_ms=T0)
    careless = bid(memory=1)  # fits any offer's capacity, yet no runtime can start it
    _, [match] = buyer.trader.post(careless, nonce=nonce(), now_ms=T0, ttl_ms=HOUR_MS)
    proposal = buyer.propose(match, nonce=nonce(), attestation_nonce=nonce(32), now_ms=T0)
    provider.receive_proposal(proposal.wire, now_ms=T0)
    reply = provider.accept(proposal.id, evidence=None, nonce=nonce(), now_ms=T0)
    assert isinstance(reply.payload, Reject)
    assert reply.payload.reason is RejectReason.BAD_TERMS
    assert "resources.memory_bytes" in reply.payload.detail
    # nothing was held for it
    resting = provider.trader.book.offers[posted.id]
    assert resting.remaining == resting.offer.capacity
