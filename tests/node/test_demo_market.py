"""``cx demo`` end to end: whole nodes in one process, real containers, real receipts."""

from __future__ import annotations

import shutil

import pytest
from executor_support import searchable_dir

from node.demo import run_demo

pytestmark = pytest.mark.integration


async def test_demo_settles_every_matched_job_and_ledgers_agree():
    work = searchable_dir("cx-demo-test-")
    try:
        verdict = await run_demo(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert verdict.problems == []
    jobs = {job["plan"]: job for job in verdict.jobs}
    assert {name: job["state"] for name, job in jobs.items()} == {
        "hello": "succeeded",
        "checksum": "succeeded",
        "eu-only": "succeeded",
        "busy-loop": "succeeded",
        "fails": "failed",
        "too-cheap": "waiting",
        "needs-arm": "waiting",
    }
    assert jobs["eu-only"]["provider_name"] == "prov-eu"
    assert jobs["fails"]["exit_reason"] == "nonzero-exit"
    assert [o["path"] for o in jobs["hello"]["outputs"]] == ["/out/hello.txt"]
    assert jobs["busy-loop"]["cost"] > 0
    assert jobs["too-cheap"]["why"].startswith("none of 3 offers fits (price rules out 3)")
    assert jobs["needs-arm"]["why"].startswith("none of 3 offers fits (arch rules out 3)")
    paid = sum(job["cost"] or 0 for job in verdict.jobs)
    buyers = {name: ledger for name, ledger in verdict.ledgers.items() if name.startswith("buyer")}
    assert sum(ledger["balance"] for ledger in buyers.values()) == -paid
    assert sum(ledger["balance"] for ledger in verdict.ledgers.values()) == 0
