"""``cx estimate`` and ``cx run --estimate``: a real container run measured, scaled from a
sample when the image's label says so, and turned into a bid's resources."""

from __future__ import annotations

import json
import shutil
from functools import partial

import pytest
import trio
from api_support import TOKEN, FakeController
from executor_support import MiB, searchable_dir

from node.api.common import write_api_info
from node.api.server import serve_api
from node.cli import main
from node.storage.image import busybox_entries, write_layout
from protocol.estimate import ESTIMATE_LABEL

pytestmark = pytest.mark.integration

# The label's command proves it ran (its output is the size of what it read) and writes
# 3 MB of scratch; the job's own command would do neither.
LABEL = {
    "command": ["sh", "-c", "wc -c < /in/data > /out/n; head -c 3000000 /dev/zero > /tmp/s"],
    "sample_bytes": 1024,
}


@pytest.fixture(scope="module")
def world():
    root = searchable_dir("cx-estimate-")
    config = {"Env": ["PATH=/bin"], "Labels": {ESTIMATE_LABEL: json.dumps(LABEL)}}
    write_layout(root / "labelled", [busybox_entries()], config=config)
    write_layout(root / "plain", [busybox_entries()])
    (root / "data").write_bytes(b"x" * 4096)
    (root / "home").mkdir(mode=0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _cx(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_estimate_runs_the_labels_command_on_a_sample_and_scales(world, capsys):
    home = str(world / "home")
    data = f"{world / 'data'}:/in/data"
    code, out, err = _cx(
        capsys, "estimate", "--home", home, "--json", "--input", data, str(world / "labelled"),
        "--", "echo", "not me",
    )  # fmt: skip
    assert code == 0, err
    got = json.loads(out)
    assert got["from_label"] is True
    assert got["command"] == LABEL["command"]
    assert (got["input_bytes"], got["sampled_input_bytes"], got["scale"]) == (4096, 1024, "4")
    seen, rec = got["observed"], got["recommended"]
    assert 3_000_000 <= seen["scratch_bytes"] < 3_200_000
    assert rec["disk_bytes"] >= seen["scratch_bytes"] * 5 // 4
    assert rec["memory_bytes"] >= seen["memory_peak_bytes"] * 5 // 4
    assert got["expected"]["cpu_us"] >= seen["cpu_us"] * 4
    assert rec["wall_ms"] > got["expected"]["wall_ms"]
    assert got["market"] is None  # no node is running in this home
    assert rec["flags"].startswith("--cpu ")


def test_estimate_without_a_label_runs_the_command_and_says_why_a_run_failed(world, capsys):
    home = str(world / "home")
    code, out, err = _cx(
        capsys, "estimate", "--home", home, str(world / "plain"), "--", "sh", "-c", "echo hi",
    )  # fmt: skip
    assert code == 0, err
    assert "measured with  the job's own command" in out
    assert "recommended    --cpu " in out
    assert "no node running" in out

    code, _, err = _cx(
        capsys, "estimate", "--home", home, "--memory", "8M", str(world / "plain"), "--",
        "sh", "-c", "head -c 64000000 /dev/zero | sort > /dev/null",
    )  # fmt: skip
    assert code == 2
    assert "the measured run ended oom" in err
    assert "give it more --memory" in err


async def test_estimate_prices_and_run_estimate_bids_the_recommendation(world, capsys, nursery):
    fake = FakeController()
    port = await nursery.start(partial(serve_api, fake, token=TOKEN))
    home = searchable_dir("cx-estimate-node-")
    write_api_info(home, f"http://127.0.0.1:{port}", TOKEN)
    data = f"{world / 'data'}:/in/data"

    def cx(*argv: str) -> tuple[int, str, str]:
        return _cx(capsys, *argv[:1], "--home", str(home), *argv[1:])

    code, out, err = await trio.to_thread.run_sync(
        lambda: cx("estimate", "--json", "--input", data, str(world / "labelled"))
    )
    assert code == 0, err
    market = json.loads(out)["market"]
    # the fake market: best CPU 0.90/core-h (amd64-small), last trade 0.10/GiB-h memory
    assert (market["cpu_core_hour"], market["memory_gib_hour"]) == (900_000, 100_000)
    assert 0 < market["expected_cost"] <= market["max_cost"]

    code, _, err = await trio.to_thread.run_sync(
        lambda: cx(
            "run",
            "--estimate",
            "--detach",
            "--max-price",
            "1",
            "--input",
            data,
            str(world / "labelled"),
            "--",
            "sh",
            "-c",
            "wc -c < /in/data > /out/n",
        )
    )
    assert code == 0, err
    (request,) = fake.submitted
    flags = err.split("cx run: estimated ")[1].splitlines()[0].split()
    assert flags[flags.index("--memory") + 1] == f"{request.memory_bytes // MiB}M"
    assert request.memory_bytes >= 16 * MiB
    assert request.disk_bytes > 3_000_000
    assert request.wall_ms == int(flags[flags.index("--timeout") + 1].removesuffix("s")) * 1000
    assert list(request.command) == ["sh", "-c", "wc -c < /in/data > /out/n"]

    code, _, err = await trio.to_thread.run_sync(
        lambda: cx(
            "run",
            "--estimate",
            "--max-price",
            "1",
            "--input",
            "s3://data/x:/in/x",
            str(world / "plain"),
            "--",
            "true",
        )
    )
    assert code == 125
    assert "--estimate runs the job here on local --input files only" in err
    assert len(fake.submitted) == 1
    shutil.rmtree(home, ignore_errors=True)
