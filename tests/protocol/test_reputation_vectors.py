"""Runs spec/vectors/reputation/ against protocol/reputation.py (spec/reputation.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from protocol.errors import DecodeError, InvalidMessage
from protocol.messages import ExitReason
from protocol.reputation import OUTCOME_OF, Outcome, open_summary, scores
from protocol.schema import to_value

VECTORS = Path(__file__).resolve().parents[2] / "spec" / "vectors"
sys.path.insert(0, str(VECTORS))

from reputation_vectors import NAMES, graph_summaries, key


def _cases(name: str) -> list[object]:
    doc = json.loads((VECTORS / "reputation" / f"{name}.json").read_text())
    return [pytest.param(case, id=case["name"]) for case in doc["cases"]]


@pytest.mark.parametrize("case", _cases("summaries"))
def test_summary(case: dict[str, object]) -> None:
    wire = bytes.fromhex(str(case["wire"]))
    known = {bytes.fromhex(k) for k in case["known"]}  # type: ignore[attr-defined]
    now = int(case["now_ms"])  # type: ignore[call-overload]
    if not case["valid"]:
        with pytest.raises((DecodeError, InvalidMessage)) as info:
            open_summary(wire, now_ms=now, known=known.__contains__)
        assert info.value.reason.value == case["error"]
        return
    value = to_value(open_summary(wire, now_ms=now, known=known.__contains__).summary)
    assert {k: v.hex() if isinstance(v, bytes) else v for k, v in value.items()} == case["summary"]


@pytest.mark.parametrize("case", _cases("outcomes"))
def test_outcome(case: dict[str, str]) -> None:
    assert OUTCOME_OF[ExitReason(case["exit_reason"])] is Outcome(case["outcome"])


@pytest.mark.parametrize("case", _cases("scores"))
def test_scores(case: dict[str, object]) -> None:
    receipts = [(p, q, a, s, Outcome(o)) for p, q, a, s, o in case["receipts"]]  # type: ignore[attr-defined]
    names = {key(n).public_key.raw: n for n in NAMES}
    result = scores(key(str(case["me"])).public_key.raw, graph_summaries(receipts))
    assert {names[k]: v for k, v in result.items()} == case["scores"]
