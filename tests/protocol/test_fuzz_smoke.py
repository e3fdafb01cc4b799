"""A short run of the fuzzer in every test run; the long run is tests/fuzz/fuzz_messages.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fuzz"))

from fuzz_messages import run


def test_fuzz_inputs_raise_only_protocol_errors():
    outcomes = run(20_000, seed=7)
    assert sum(outcomes.values()) == 20_000
    assert outcomes["accepted"] > 0  # mutations that keep a value canonical do decode
    assert outcomes["bad-signature"] > 0  # and some reach the signature check
