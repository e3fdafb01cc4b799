"""The cx commands as a user types them, against a real node: a buyer (serve_peer with its
control API on loopback) and a provider running real containers, on the in-memory network
(tests/node/market_support.py). The CLI runs in a worker thread, as it would in a shell."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import trio
from market_support import Cluster, Node, cluster, market, until

from node.api.controller import serve_control
from node.cli import main
from node.cli.common import short_peer
from node.storage.image import busybox_entries, write_layout
from protocol.units import credits

pytestmark = pytest.mark.integration

ASK = 1_000_000  # the provider's price per core-hour: 1 credit


class Cx:
    def __init__(self, node: Node, capsys: pytest.CaptureFixture[str]) -> None:
        self.node = node
        self.capsys = capsys

    async def __call__(self, command: str, *argv: str) -> tuple[int, str, str]:
        """``cx COMMAND --home HOME ARGV...``: its exit status, stdout and stderr."""
        self.capsys.readouterr()
        home = ["--home", str(self.node.home.root)]
        code = await trio.to_thread.run_sync(main, [command, *home, *argv])
        out, err = self.capsys.readouterr()
        return code, out, err


async def trading(c: Cluster) -> tuple[Node, Node]:
    """A provider (2 cores, 1 GiB, 1 credit/core-hour) and a buyer that sees its offer and
    serves its control API."""
    provider = await c.provider("provider", price=ASK)
    buyer = await c.buyer("buyer")
    await buyer.peer.join(provider.addr)
    await until(lambda: market(buyer)["offers"] == 1, buyer)
    await c.nursery.start(serve_control, buyer.peer)
    return provider, buyer


async def test_a_job_that_cannot_match_is_explained_per_unit_and_once(image_layout, capsys):
    async with cluster(image_layout) as c:
        _, buyer = await trading(c)
        cx = Cx(buyer, capsys)

        # --wait-match expiry says why, not only "in time". Before: nothing more.
        code, _, err = await cx(
            "run", "--max-price", "0.01", "--max-memory-price", "100", "--wait-match", "1s",
            c.image, "--", "true",
        )  # fmt: skip
        assert code == 2, err
        assert "no provider took job" in err
        assert "CPU costs at least 1.00 credits per core-hour, your limit is 0.01" in err

        # A capacity no offer has is named as such. Before: "no offer fits apart from price".
        code, _, err = await cx(
            "run", "--max-price", "100", "--cpus", "64", "--wait-match", "6s", c.image, "true"
        )
        assert code == 2, err
        assert "CPU: 64 cores asked, 2 cores free at most" in err
        # While it waited: how long, and why. Before: nothing between "bid posted" and the end.
        (hint,) = [line for line in err.splitlines() if "s so far: " in line]
        assert re.search(r"waiting +5s so far: none of 1 offers fits", hint), hint

        # cx why says it once, per unit. Before: a second list of the counts and a total
        # ("would cost 2.34 credits") compared with a per-unit limit.
        code, out, _ = await cx("run", "--detach", "--max-price", "0.01", c.image, "true")
        job = out.strip()
        code, out, _ = await cx("why", job)
        assert code == 0
        assert out.count("price rules out 1") == 1, out
        assert "would cost" not in out
        assert "your limit is 0.01" in out


async def test_progress_and_summary_speak_credits(image_layout, capsys):
    async with cluster(image_layout) as c:
        _, buyer = await trading(c)
        cx = Cx(buyer, capsys)
        code, out, err = await cx(
            "run", "--max-price", "1.5", "--max-memory-price", "10", "--wait-match", "30s",
            c.image, "--", "echo", "hi",
        )  # fmt: skip
        assert (code, out) == (0, "hi\n"), err
        # Before: "max cost 1170000" (micro-credits) in the progress.
        agreed = next(line for line in err.splitlines() if " agreed " in line)
        assert re.search(r"max cost \d+\.\d+ credits$", agreed), agreed
        assert re.search(r"cost \d+\.\d+ credits$", err.splitlines()[-1]), err


async def test_run_uses_the_images_entrypoint_and_cmd(image_layout, capsys, tmp_path):
    # Before: "give a command after IMAGE" whatever the image said.
    layout = tmp_path / "layout"  # cx run imports it into the node's store
    config = {"Env": ["PATH=/bin"], "Entrypoint": ["/bin/echo", "from"], "Cmd": ["the", "image"]}
    write_layout(layout, [busybox_entries()], config=config)
    async with cluster(image_layout) as c:
        _, buyer = await trading(c)
        cx = Cx(buyer, capsys)
        money = ["--max-price", "1.5", "--max-memory-price", "10", "--wait-match", "30s"]
        code, out, err = await cx("run", *money, str(layout))
        assert (code, out) == (0, "from the image\n"), err
        code, out, err = await cx("run", *money, str(layout), "--", "you")
        assert (code, out) == (0, "from you\n"), err


async def test_wait_and_attach_follow_a_detached_job_to_its_end(image_layout, capsys):
    # Before: no way back to a job left with --detach or Ctrl-C but polling cx jobs.
    async with cluster(image_layout) as c:
        _, buyer = await trading(c)
        cx = Cx(buyer, capsys)
        money = ["--max-price", "1.5", "--max-memory-price", "10"]
        code, out, _ = await cx("run", "--detach", *money, c.image, "--", "sh", "-c", "exit 3")
        job = out.strip()
        code, _, err = await cx("wait", job[:6])
        assert code == 3, err
        assert "running" in err  # its progress, replayed from the start
        assert "nonzero-exit (exit code 3)" in err.splitlines()[-1]
        code, _, err = await cx("attach", job)  # ended already: its summary and status
        assert code == 3, err
        code, _, err = await cx("wait", "ffffffff")
        assert (code, err) == (125, "cx wait: no job with id 'ffffffff'; see `cx jobs`\n")


async def test_cancel_stops_a_running_job_and_its_receipt_charges_the_time_used(
    image_layout, capsys
):
    # Before: "only a waiting job can be cancelled"; a running job could not be stopped.
    async with cluster(image_layout) as c:
        provider, buyer = await trading(c)
        cx = Cx(buyer, capsys)
        money = ["--max-price", "1.5", "--max-memory-price", "10"]
        code, out, _ = await cx("run", "--detach", *money, c.image, "--", "sleep", "600")
        job = out.strip()
        await until(lambda: buyer.peer.job(job).state == "running", buyer)

        code, out, err = await cx("cancel", job)
        assert code == 0, err
        assert out == f"job {job}: running; its provider is stopping it (see cx wait)\n"
        code, _, err = await cx("wait", job)
        assert code == 1, err  # it did not end by itself
        assert "failed: stopped" in err.splitlines()[-1]
        row = await until(lambda: (r := buyer.peer.job(job)).cost is not None and r, buyer)
        assert row.exit_reason == "stopped"
        # The time it ran (a few ms of an idle sleep may round to 0), not the whole
        # reservation; spec/vectors/settlement.json pins the rule.
        assert 0 <= row.cost < row.max_cost
        await until(lambda: provider.peer.db.ledger(), provider)  # the provider was paid

        # The provider sees its own work and what it earned. Before: its cx jobs was empty.
        await c.nursery.start(serve_control, provider.peer)
        code, out, err = await Cx(provider, capsys)("jobs", "--sold")
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0] == f"earned: {credits(row.cost)} credits from 1 job(s) sold"
        assert lines[3].split()[1:] == [
            "settled", short_peer(buyer.peer_id), c.image[7:19], "sleep", "600", "1/256MiB",
            credits(row.cost), lines[3].split()[-1],
        ]  # fmt: skip

        code, _, err = await cx("stop", job)  # over now: said so, nothing else happens
        assert (code, err) == (1, f"cx stop: job {job} has already ended (failed)\n")


async def test_logs_follow_prints_the_output_while_the_job_runs(image_layout, capsys):
    # Before: cx logs was empty until the job ended, and had no -f.
    async with cluster(image_layout) as c:
        _, buyer = await trading(c)
        cx = Cx(buyer, capsys)
        money = ["--max-price", "1.5", "--max-memory-price", "10"]
        script = "echo one; echo warn >&2; sleep 600"
        code, out, _ = await cx("run", "--detach", *money, c.image, "--", "sh", "-c", script)
        job = out.strip()
        await until(lambda: buyer.peer.job(job).state == "running", buyer)
        argv = [sys.executable, "-m", "node.cli", "logs", "-f", "--home", str(buyer.home.root)]
        follow = await trio.lowlevel.open_process(
            [*argv, job], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            with trio.fail_after(60):
                first = await _line(follow.stdout)
                warned = await _line(follow.stderr)
            assert (first, warned) == (b"one\n", b"warn\n")
            assert buyer.peer.job(job).state == "running"  # it came while the job ran
            code, _, err = await cx("stop", job)
            assert code == 0, err
            with trio.fail_after(60):  # the job's end ends it, with nothing more to say
                assert await follow.wait() == 0
                assert await follow.stdout.receive_some() == b""
        finally:
            follow.kill()
            await follow.wait()


async def _line(stream: trio.abc.ReceiveStream | None) -> bytes:
    """One line from ``stream`` (what is received until a newline)."""
    assert stream is not None
    got = b""
    while not got.endswith(b"\n") and (chunk := await stream.receive_some(1)):
        got += chunk
    return got
