"""The cx commands that talk to a node, against a real control API server on loopback.

The CLI and its client are synchronous, so each command runs in a worker thread while the
server (with a fake Controller) runs in the test's trio loop.
"""

from __future__ import annotations

import hashlib
import json
import socket
from functools import partial

import pytest
import trio
from api_support import NOW_MS, PEER_A, PEER_B, TOKEN, FakeController
from process_support import serving_directory

from node.api.client import ApiClient, NodeNotRunning
from node.api.common import ApiError, write_api_info
from node.api.server import serve_api
from node.cli import main
from node.cli.common import credits, parse_credits, table
from node.market.request import build_request
from node.storage.image import build_rootfs
from protocol.identity import PrivateKey

DIGEST = "sha256:" + "cd" * 32


class Cx:
    def __init__(self, home, capsys) -> None:
        self.home = home
        self.capsys = capsys

    async def __call__(self, command: str, *argv: str) -> tuple[int, str, str]:
        """``cx COMMAND --home HOME ARGV...``: its exit status, stdout and stderr."""
        self.capsys.readouterr()
        code = await trio.to_thread.run_sync(main, [command, "--home", str(self.home), *argv])
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture
async def node(nursery, tmp_path):
    fake = FakeController()
    fake.add_job("aaaa0001", name="first", created_ms=NOW_MS - 5000)
    fake.add_job(
        "bbbb0002",
        state="settled",
        provider=PEER_A,
        attempts=1,
        cost=1_500_000,
        max_cost=4_000_000,
        price={"cpu_core_hour": 950_000, "memory_gib_hour": 100_000},
        exit_reason="success",
        exit_code=0,
        outputs=[{"path": "/out/result.txt", "digest": DIGEST, "size": 3}],
        stdout="the answer is 42\n",
    )
    port = await nursery.start(partial(serve_api, fake, token=TOKEN))
    home = tmp_path / "home"
    write_api_info(home, f"http://127.0.0.1:{port}", TOKEN)
    return fake, home


@pytest.fixture
def cx(node, capsys):
    return Cx(node[1], capsys)


async def test_jobs_table_json_and_detail(node, cx):
    code, out, _ = await cx("jobs")
    assert code == 0
    header, first, second = out.splitlines()
    assert header.split() == [
        "ID", "NAME", "STATE", "IMAGE", "COMMAND", "CPU/MEMORY", "PROVIDER", "ATTEMPTS", "COST",
        "AGE",
    ]  # fmt: skip
    # What ran where, as docker ps shows it. Before: no image, command or resources.
    assert first.split()[:10] == [
        "bbbb0002", "-", "settled", "abababababab", "echo", "hi", "0.5/128MiB", f"..{PEER_A[-8:]}",
        "1", "1.50",
    ]  # fmt: skip
    assert second.split()[:9] == [
        "aaaa0001",
        "first",
        "waiting",
        "abababababab",
        "echo",
        "hi",
        "0.5/128MiB",
        "-",
        "0",
    ]
    # Columns line up: every row's STATE starts where the header's does.
    rows = zip(out.splitlines(), ("STATE", "settled", "waiting"), strict=True)
    assert {line.index(state) for line, state in rows} == {header.index("STATE")}

    code, out, _ = await cx("jobs", "--json")
    assert code == 0
    assert json.loads(out) == node[0].jobs()

    code, out, _ = await cx("jobs", "bbbb")
    assert code == 0
    assert "price:     0.95/core-h, 0.10/GiB-h memory" in out
    assert "/out/result.txt  3 B" in out

    code, _, err = await cx("jobs", "ffff")
    assert code == 1
    assert err == "cx jobs: no job ffff; see cx jobs\n"


async def test_logs_get_why_cancel(node, cx, tmp_path):
    code, out, err = await cx("logs", "bbbb0002")
    assert (code, out, err) == (0, "the answer is 42\n", "a warning\n")
    code, out, _ = await cx("logs", "--json", "bbbb")
    assert json.loads(out) == {"stdout": "the answer is 42\n", "stderr": "a warning\n"}

    dest = tmp_path / "got"
    code, out, err = await cx("get", "bbbb0002", str(dest))
    assert code == 0
    assert (dest / "out/result.txt").read_bytes() == b"xxx"
    assert out.splitlines()[1].split() == ["/out/result.txt", str(dest / "out/result.txt"), "3"]
    assert err == f"1 file(s) under {dest}\n"
    code, out, _ = await cx("get", "--json", "bbbb0002", str(dest))
    assert json.loads(out)[0]["size"] == 3

    code, out, _ = await cx("why", "aaaa0001")
    assert code == 0
    assert out.splitlines() == [
        "job aaaa0001 is waiting; its bid has seen 4 offer(s).",
        "none of 4 offers fits (price rules out 3, region rules out 1): "
        "CPU costs at least 1.25 credits per core-hour, your limit is 1.00",
    ]
    code, out, _ = await cx("why", "--json", "aaaa0001")
    assert json.loads(out)["ruled_out"] == {"price": 3, "region": 1, "arch": 0}

    code, out, _ = await cx("cancel", "aaaa")
    assert (code, out) == (0, "job aaaa0001: cancelled\n")
    code, _, err = await cx("cancel", "aaaa")
    assert (code, err) == (1, "cx cancel: job aaaa0001 has already ended\n")


async def test_market_ledger_peers(node, cx):
    code, out, _ = await cx("market")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("book: 5 offer(s), 2 bid(s); CPU prices per core-hour")
    # class, offers, bids, best bid, best offer, last, memory offer, trades, per work,
    # work per kWh, chart
    assert lines[3].split() == [
        "amd64-small", "4", "2", "1.20", "0.90", "0.95", "0.10", "3", "0.003", "2400", "▁█▄",
    ]  # fmt: skip
    assert lines[4].split() == ["arm64-gpu", "1", "0", "-", "-", "-", "-", "0", "-", "-", "-"]
    assert lines[-1].split()[1:] == ["amd64-small", "0.95", "0.10"]
    code, out, _ = await cx("market", "--json")
    assert json.loads(out) == node[0].market()

    code, out, _ = await cx("market", "history", "--interval", "5m", "--json")
    assert code == 0
    history = json.loads(out)
    assert history["interval_ms"] == 300_000
    assert history["classes"][0]["candles"][0]["close"] == 950_000
    code, out, _ = await cx("market", "history")
    assert out.splitlines()[1].split()[2:] == ["0.90", "1.00", "0.90", "0.95", "3"]

    code, out, _ = await cx("ledger")
    assert code == 0
    assert out.splitlines()[0] == "balance: -1.50 credits"
    # Newest first, as cx jobs. Before: oldest first.
    assert out.splitlines()[-1].split()[1] == "ag9999999999ffff"
    assert out.splitlines()[-2].split()[1:] == [
        "ag0123456789abcd",
        "buyer",
        "..ooWBuyer",
        f"..{PEER_A[-8:]}",
        "1.50",
    ]
    code, out, _ = await cx("ledger", "--json")
    assert json.loads(out)["balance"] == -1_500_000

    code, out, _ = await cx("peers")
    assert code == 0
    assert out.splitlines()[0].split() == ["PEER", "SCORE", "REPUTATION", "ADDRESS"]
    # Peer ids as every table shows them (whole in --json). Before: whole here, cut elsewhere.
    assert out.splitlines()[1].split() == [
        f"..{PEER_A[-8:]}", "12.5", "439320", "/ip4/10.0.0.2/tcp/4001"
    ]  # fmt: skip
    assert out.splitlines()[2].split() == ["..ooWOther", "-3", "0", "-"]
    code, out, _ = await cx("peers", "--json")
    assert len(json.loads(out)) == 2


async def test_offers_lists_every_offer_and_filters(node, cx):
    code, out, _ = await cx("offers")
    assert code == 0
    header, first, second = out.splitlines()
    assert header.split()[:5] == ["PROVIDER", "REGION", "ARCH", "GPUS", "CPU/CORE-H"]
    assert header.split()[8:10] == ["IN/GIB", "OUT/GIB"]
    assert first.split()[1:] == [
        "eu", "amd64", "-", "0.90", "0.10", "0.01", "-", "-", "-", "4", "4", "GiB", "900",
        "250000",
    ]  # fmt: skip
    assert second.split()[1:10] == ["us", "amd64", "-", "1.50", "0.10", "0.01", "-", "0.02", "0.09"]
    code, out, _ = await cx("offers", "--holding", DIGEST, "--holding", "sha256:" + "ef" * 32)
    assert [line.split()[-1] for line in out.splitlines()] == ["HOLDS", "0/2", "1/2"]
    code, _, err = await cx("offers", "--holding", "cdcd")
    assert code == 2
    assert "is not a sha256:<hex> digest" in err
    code, out, _ = await cx("offers", "--region", "us", "--json")
    assert [o["provider"] for o in json.loads(out)] == [PEER_B]
    code, out, _ = await cx("offers", "--cpu", "1", "--max-price", "1")
    assert len(out.splitlines()) == 2  # only the first: enough free CPU, cheap enough
    code, out, _ = await cx("offers", "--gpu-model", "H100")
    assert out.strip() == "no offers"


async def test_check_score_prints_the_verdict_and_exits_by_it(node, cx):
    code, out, _ = await cx("check-score", PEER_B)
    assert code == 0
    assert out.splitlines() == [
        f"{PEER_B}: believed",
        "  stated 900, measured 880: within tolerance (job cccc0003)",
    ]
    code, _, err = await cx("check-score", PrivateKey.from_seed(b"\x01" * 32).peer_id)
    assert code == 1
    assert "cannot check" in err


async def test_quota_shows_each_groups_use_against_its_limits(node, cx):
    code, out, _ = await cx("quota")
    assert (code, out) == (0, "this node sells nothing: it has no quotas\n")
    code, _, err = await cx("quota", "--reload")
    assert code == 1, err
    assert "this node sells nothing, so it has no quotas" in err
    fake, _ = node
    fake.quotas = [
        {
            "name": "students",
            "peers": [PEER_A, PEER_B],
            "priority": 10,
            "limits": {"cpu_milli": 2000, "memory_bytes": None, "gpus": None, "jobs": 2,
                       "credits_per_day": 5_000_000},
            "used": {"cpu_milli": 1500, "memory_bytes": 512 << 20, "gpus": 0, "jobs": 1,
                     "credits_per_day": 500_000},
        }
    ]  # fmt: skip
    for argv in (["quota"], ["quota", "--reload"], ["status"]):
        code, out, _ = await cx(*argv)
        assert code == 0
        assert (
            "quota:    students (2 peers, priority 10): cores 1.5/2, memory 512MiB/-, "
            "gpus 0/-, jobs 1/2, credits today 0.50/5.00"
        ) in out.splitlines()
    code, out, _ = await cx("quota", "--reload", "--json")
    assert json.loads(out) == fake.quotas


async def test_run_detach_sends_the_request_and_prints_the_id(node, cx, tmp_path):
    fake, _ = node
    data = tmp_path / "data.csv"
    data.write_text("a,b\n")
    code, out, err = await cx(
        "run", "--detach", "--cpus", "0.5", "-m", "128Mi", "--disk", "1G",
        "--timeout", "10m", "--max-price", "1.5", "--max-memory-price", "0.25",
        "--region", "eu", "--region", "us", "--trust", "tpm", "--arch", "arm64",
        "--input", f"{data}:/in/data.csv", "-e", "A=1", "--env", "B=x=y",
        "--preemptible", "--checkpoint-path", "/ckpt", "--name", "nightly",
        DIGEST, "--", "sh", "-c", "wc -l /in/data.csv",
    )  # fmt: skip
    assert (code, err) == (0, "")
    (request,) = fake.submitted
    assert out == f"{fake.jobs()[0]['id']}\n"
    assert request == build_request(
        **{
            "image": DIGEST,
            "command": ["sh", "-c", "wc -l /in/data.csv"],
            "env": {"A": "1", "B": "x=y"},
            "cpu_milli": 500,
            "memory_bytes": 128 << 20,
            "disk_bytes": 10**9,
            "gpus": 0,
            "wall_ms": 600_000,
            "max_prices": {
                "cpu_core_hour": 1_500_000,
                "memory_gib_hour": 250_000,
                "disk_gib_hour": 1_500_000,
                "gpu_hour": 0,
            },
            "arch": "arm64",
            "regions": ["eu", "us"],
            "trust": "tpm",
            "inputs": [{"path": "/in/data.csv", "file": str(data)}],
            "preemptible": True,
            "checkpoint_path": "/ckpt",
            "name": "nightly",
        }
    )
    # An OCI layout is imported into the node's store (so that its CMD and ENTRYPOINT are
    # known) and travels as its digest.
    digest = build_rootfs(tmp_path / "layout")
    code, _, err = await cx("run", "-d", "--max-price", "1", str(tmp_path / "layout"), "true")
    assert code == 0, err
    assert (fake.submitted[1].image, fake.submitted[1].command) == (digest, ("true",))


async def test_run_follows_the_job_to_success_and_prints_its_stdout(node, cx, tmp_path):
    fake, _ = node
    fake.script = [
        ("negotiating", {"detail": "offer from a provider"}),
        ("agreed", {"provider": PEER_A, "attempts": 1, "max_cost": 2_000_000}),
        ("transferring", {}),
        ("running", {}),
        (
            "succeeded",
            {
                "exit_reason": "success",
                "exit_code": 0,
                "outputs": [{"path": "/out/count", "digest": DIGEST, "size": 2}],
            },
        ),
    ]
    out_dir = tmp_path / "out"
    code, out, err = await cx(
        "run", "--max-price", "2", "--output", str(out_dir), "busybox.tar", "--", "true"
    )
    assert "busybox.tar" in err  # not a digest, path or stored image: said so, not sent
    assert code == 125
    assert fake.submitted == []

    code, out, err = await cx("run", "--max-price", "2", "--output", str(out_dir), DIGEST, "true")
    assert code == 0
    assert out == "hello from the job\n"
    states = [line.split()[1] for line in err.splitlines() if line.startswith("  ")]
    assert states == ["waiting", "negotiating", "agreed", "transferring", "running", "succeeded"]
    assert "a warning" in err
    assert (out_dir / "out/count").read_bytes() == b"xx"
    assert err.splitlines()[-1].startswith("cx run: job ")
    assert "at most 2.00 credits" in err.splitlines()[-1]


async def test_run_states_where_the_data_lives(node, cx):
    fake, _ = node
    code, _, err = await cx(
        "run", "-d", "--max-price", "1", "--data-region", "eu", "--data-size", "50Gi",
        "--data-egress-price", "0.09", "--output-size", "1Gi", "--egress-budget", "2",
        DIGEST, "true",
    )  # fmt: skip
    assert code == 0, err
    request = fake.submitted[-1]
    assert (request.data_region, request.data_bytes, request.data_egress_gib) == (
        "eu", 50 << 30, 90_000
    )  # fmt: skip
    assert (request.output_bytes, request.egress_budget) == (1 << 30, 2_000_000)
    code, _, err = await cx("run", "-d", "--max-price", "1", "--data-size", "1G", DIGEST, "true")
    assert code != 0
    assert "data_bytes needs data_region" in err


async def test_run_json_prints_the_job(node, cx):
    # Before: cx run had no --json.
    fake, _ = node
    code, out, _ = await cx("run", "--detach", "--json", "--max-price", "2", DIGEST, "true")
    assert code == 0
    assert json.loads(out)["id"] == fake.jobs()[0]["id"]
    fake.script = [("running", {}), ("succeeded", {"exit_reason": "success", "exit_code": 0})]
    code, out, err = await cx("run", "--json", "--max-price", "2", DIGEST, "true")
    assert code == 0, err
    ended = json.loads(out)  # the job, not its output
    assert (ended["state"], ended["exit_reason"]) == ("succeeded", "success")


async def test_run_exit_status_follows_the_job(node, cx):
    fake, _ = node
    fake.script = [
        ("running", {}),
        ("failed", {"exit_reason": "nonzero-exit", "exit_code": 3}),
    ]
    code, _, err = await cx("run", "--max-price", "2", DIGEST, "--", "sh", "-c", "exit 3")
    assert code == 3
    assert "nonzero-exit (exit code 3)" in err

    # Killed (137 after OOM or a timeout): 1, as the help says, not the signal's status.
    for reason, exit_code in (("oom", None), ("oom", 137), ("timeout", 137)):
        fake.script = [("running", {}), ("failed", {"exit_reason": reason, "exit_code": exit_code})]
        code, _, _ = await cx("run", "--max-price", "2", DIGEST, "--", "true")
        assert code == 1

    # Nothing takes it: --wait-match gives up, cancels the job, and exits 2.
    code, _, err = await cx("run", "--max-price", "2", "--wait-match", "0s", DIGEST, "true")
    assert code == 2
    assert "no provider took job" in err
    assert fake.jobs()[0]["state"] == "cancelled"


async def test_run_refuses_unusable_options_before_submitting(node, cx):
    fake, _ = node
    code, _, err = await cx("run", DIGEST, "--", "true")
    assert code == 125
    assert "give --max-price" in err
    code, _, err = await cx("run", "--max-price", "1", DIGEST)
    assert (code, "give a command" in err) == (125, True)
    code, _, err = await cx("run", "--max-price", "1", "--gpus", "1", DIGEST, "true")
    assert (code, "--max-gpu-price" in err) == (125, True)
    code, _, err = await cx("run", "--max-price", "1", "--input", "nofile:/in/x", DIGEST, "true")
    assert (code, "nofile is not a file" in err) == (125, True)
    code, _, err = await cx("run", "--max-price", "1", "--env", "NOEQUALS", DIGEST, "true")
    assert (code, "NAME=VALUE" in err) == (125, True)
    assert fake.submitted == []


async def test_no_node_running_says_how_to_start_one(tmp_path, capsys):
    home = tmp_path / "nothing-here"
    cx = Cx(home, capsys)
    # Not even initialised: say so first (not "no image in .../store"), with the --home given.
    uninitialised = f"{home} is not a node's home yet; make one with `cx init --home {home}`"
    code, _, err = await cx("jobs")
    assert (code, err) == (125, f"cx jobs: {uninitialised}\n")
    code, _, err = await cx("run", "--max-price", "1", "busybox", "true")
    assert (code, err) == (125, f"cx run: {uninitialised}\n")

    home.mkdir()
    (home / "config.toml").write_text("")
    expected = f"no node is running for home {home}; start one with `cx node --home {home}`"
    # One exit status for "no node running", whatever the command (before: 3, and 125 for
    # cx run and cx wait).
    for command in (["jobs"], ["wait", "abc"], ["market"], ["status"], ["offers"]):
        code, _, err = await cx(*command)
        assert (code, err) == (125, f"cx {command[0]}: {expected}\n")

    # A stale api.json: the node is gone and its port refuses.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    write_api_info(home, f"http://127.0.0.1:{port}", TOKEN)
    code, _, err = await cx("peers")
    assert (code, err) == (125, f"cx peers: {expected}\n")
    with pytest.raises(NodeNotRunning):
        ApiClient.from_home(tmp_path / "elsewhere")


async def test_client_raises_the_servers_error(node):
    _, home = node
    client = ApiClient.from_home(home)
    with pytest.raises(ApiError) as err:
        await trio.to_thread.run_sync(client.job, "nope")
    assert (err.value.status, err.value.code) == (404, "unknown-job")
    bad = ApiClient(client.base_url, "wrong-token")
    with pytest.raises(ApiError) as err:
        await trio.to_thread.run_sync(bad.node_info)
    assert err.value.status == 401
    # Ids travel quoted: a slash cannot reach another route.
    with pytest.raises(ApiError) as err:
        await trio.to_thread.run_sync(client.why, "aaaa0001/../../node")
    assert (err.value.status, err.value.code) == (404, "not-found")


def test_credit_formatting_and_tables():
    assert [credits(m) for m in (0, 1, 1_500_000, -2_000_000, 123_456_789, None)] == [
        "0.00",
        "0.000001",
        "1.50",
        "-2.00",
        "123.456789",
        "-",
    ]
    assert parse_credits("1.5") == 1_500_000
    assert parse_credits("0.000001") == 1
    for bad in ("1.0000001", "-1", "x", "nan", "inf"):
        with pytest.raises(Exception, match="credits"):
            parse_credits(bad)
    assert table(("A", "NUM"), [("xyz", 5), ("q", 123)], right=(1,)).splitlines() == [
        "A    NUM",
        "xyz    5",
        "q    123",
    ]


async def test_run_pins_a_web_input_on_the_users_machine_and_sends_keys_for_s3(
    node, cx, tmp_path, monkeypatch
):
    """The node reads only its own S3 endpoint; a web URL is hashed by cx run itself. S3
    keys come from the environment and travel in the request, never on the command line."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "data.csv").write_bytes(b"a,b\n")

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-on-argv")
    with serving_directory(tmp_path / "site") as base:
        url = f"{base}/data.csv"
        code, _, err = await cx(
            "run", "-d", "--max-price", "1", "--input", f"{url}:/in/data.csv",
            "--input", "s3://bucket/more/:/in/more", "--output-to", "s3://bucket/out/",
            DIGEST, "true",
        )  # fmt: skip
    assert code == 0, err
    request = node[0].submitted[-1]
    web, prefix = request.inputs
    assert (web.url, web.digest, web.size) == (
        url,
        "sha256:" + hashlib.sha256(b"a,b\n").hexdigest(),
        4,
    )
    assert (prefix.url, prefix.digest) == ("s3://bucket/more/", None)
    assert request.output_to == "s3://bucket/out/"
    assert request.credentials is not None
    assert request.credentials.s3.secret_key.get_secret_value() == "not-on-argv"
    assert "not-on-argv" not in request.to_json()
