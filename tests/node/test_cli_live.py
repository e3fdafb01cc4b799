"""``cx jobs --watch`` and ``cx top`` as processes against a trading provider and buyer: each
redraws from the node's live stream, so a job started after the view opened shows up in
it. Into a pipe every snapshot is printed after the last; the test reads the lines as they
come (bounded), never sleeps."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from live_support import Market, market_fixture  # noqa: F401 - the fixture `market`

from node.cli.top import render_top

pytestmark = pytest.mark.integration

CX = str(Path(__file__).parents[2] / ".venv" / "bin" / "cx")
WAIT_S = 30


class Lines:
    """The stdout lines of a running process, read on a thread of their own."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.seen: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def until(self, wanted: Callable[[str], bool]) -> str:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("never printed it; saw:\n" + "\n".join(self.seen)) from None
            if line is None:
                raise AssertionError("it exited; it printed:\n" + "\n".join(self.seen))
            self.seen.append(line)
            if wanted(line):
                return line


@contextmanager
def running(*argv: str) -> Iterator[Lines]:
    proc = subprocess.Popen([CX, *argv], stdout=subprocess.PIPE, text=True)
    try:
        yield Lines(proc)
    finally:
        proc.terminate()
        proc.wait(30)


def test_cx_jobs_watch_shows_a_job_start_and_end_without_being_asked_again(
    market: Market,
) -> None:
    with running("jobs", "--watch", "--home", str(market.buyer.home)) as out:
        out.until(lambda line: line.startswith("cx jobs · live"))
        job_id = market.submit("echo watched")
        out.until(lambda line: line.startswith(job_id) and "succeeded" in line)


def test_cx_top_shows_the_providers_machine_and_a_job_holding_it(market: Market) -> None:
    with running("top", "--home", str(market.provider.home)) as out:
        out.until(lambda line: line.startswith("cpu    [") and "of 2 cores" in line)
        market.submit("sleep 5")
        bar = out.until(lambda line: line.startswith("cpu    [") and "0.5 core of 2" in line)
        assert bar.startswith("cpu    [########......")
        row = out.until(lambda line: "running" in line)
        assert market.buyer.peer_id[-8:] in row
        assert "0.5 core  64 MiB" in row
        assert " - " not in row  # its CPU time and peak memory, measured from its cgroup


def test_cx_top_on_a_buyer_says_it_sells_nothing(market: Market) -> None:
    done = subprocess.run(
        [CX, "top", "--home", str(market.buyer.home)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert done.stderr.startswith("cx top: this node sells no capacity")


def test_render_top_draws_capacity_bars_and_a_row_per_job() -> None:
    snapshot = {
        "at_ms": 10_000,
        "provider": {
            "class": "amd64/cpu/eu",
            "cpu_milli": 4000,
            "memory_bytes": 8 << 30,
            "gpus": 0,
            "running": [
                {
                    "agreement_id": "ab" * 16,
                    "buyer": "12D3KooWBuyerBuyerXYZ",
                    "state": "running",
                    "started_ms": 4_000,
                    "cpu_milli": 1000,
                    "memory_bytes": 1 << 30,
                    "gpus": 0,
                    "cpu_us": 2_500_000,
                    "memory_peak_bytes": 3 << 20,
                },
            ],
        },
    }
    lines = render_top(snapshot).splitlines()
    assert lines[0] == "offering amd64/cpu/eu"
    assert lines[1] == "cpu    [" + "#" * 8 + "." * 22 + "] 1 core of 4 cores"
    assert lines[2] == "memory [" + "#" * 4 + "." * 26 + "] 1 GiB of 8 GiB"
    assert not any(line.startswith("gpus") for line in lines)  # no GPUs to show
    assert lines[-1].split() == [
        "abababababababab",
        "..BuyerXYZ",
        "running",
        "1",
        "core",
        "1",
        "GiB",
        "0",
        "2.5s",
        "3",
        "MiB",
        "6s",
    ]
