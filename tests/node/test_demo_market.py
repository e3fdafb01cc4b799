"""The README's main command, end to end: real signed orders, real containers, receipts."""

from __future__ import annotations

import shutil

import pytest
from executor_support import searchable_dir

from node.demo import run_demo

pytestmark = pytest.mark.integration


async def test_demo_settles_every_matched_job_and_ledgers_agree():
    work = searchable_dir("cx-demo-test-")
    try:
        result = await run_demo(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    states = {job.name: job.state for job in result.jobs}
    assert states == {
        "hello": "settled",
        "checksum": "settled",
        "eu-only": "settled",
        "busy-loop": "settled",
        "fails": "settled",
        "too-cheap": "unmatched",
        "needs-arm": "unmatched",
    }
    jobs = {job.name: job for job in result.jobs}
    assert jobs["eu-only"].provider == "prov-eu"
    assert jobs["fails"].exit_reason == "nonzero-exit"
    assert jobs["hello"].outputs == 1
    assert jobs["busy-loop"].cost > 0
    assert jobs["too-cheap"].why is not None
    assert jobs["too-cheap"].why.ruled_out["price"] == 3
    assert jobs["needs-arm"].why is not None
    assert jobs["needs-arm"].why.ruled_out["arch"] == 3
    assert result.ledgers_agree
    paid = sum(job.cost for job in result.jobs)
    assert result.balances["alice"] + result.balances["bob"] == -paid
