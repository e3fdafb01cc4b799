"""Starting `cx node` (a real process) on a home that cannot be used: each refusal is one
line per problem and exit status 1, before anything listens. Before: a second node on one
home ran beside the first (one key, one node.db, api.json overwritten); a busy API port
gave a 60-line traceback after libp2p was up; a misspelt key was ignored and
`cpu_milli = -4000` accepted."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from process_support import free_port

from node.storage.home import Home, HomeError, NodeConfig, ProviderConfig, init_home
from protocol.messages import Arch, Prices, Resources

pytestmark = pytest.mark.integration

CX_NODE = [sys.executable, "-m", "node.cli", "node", "--home"]


def cx_node(home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CX_NODE, str(home)], capture_output=True, text=True, timeout=60, check=False
    )


def refusal(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert all(line.startswith("cx node: ") for line in lines), done.stderr
    return [line.removeprefix("cx node: ") for line in lines]


def provider_config(**network: object) -> NodeConfig:
    return NodeConfig(
        provider=ProviderConfig(
            capacity=Resources(cpu_milli=1000, memory_bytes=256 << 20),
            prices=Prices(cpu_core_hour=1_000_000),
            arch=Arch.AMD64,
        ),
        **network,  # type: ignore[arg-type]
    )


@contextlib.contextmanager
def running_node(home: Home) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, Any]]]:
    """`cx node --json` on ``home``, once it has said it started (api.json is written by
    then); stopped with SIGTERM after the block."""
    proc = subprocess.Popen(
        [*CX_NODE, str(home.root), "--json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None
        yield proc, json.loads(proc.stdout.readline())
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_home_runs_one_node(tmp_path):
    home = init_home(tmp_path / "home", NodeConfig())
    with running_node(home) as (first, _):
        published = (home.root / "api.json").read_text()
        (line,) = refusal(cx_node(home.root))
        assert line == (
            f"{home.root} is in use by another node (pid {first.pid}); stop that one first, "
            "or give this one another --home"
        )
        assert (home.root / "api.json").read_text() == published  # the first one's, untouched
        assert first.poll() is None
    assert not (home.root / "api.json").exists()
    with running_node(home) as (again, started):  # the lock went with the process
        assert started["peer_id"] == home.key().peer_id
        assert again.poll() is None


def test_a_home_this_process_released_is_free_at_once_while_a_spawn_holds_its_lock(tmp_path):
    """A process being spawned holds a copy of every descriptor until it execs, and a flock
    lives as long as any copy: a node restarted in the same process (an embedding tool, a
    test) must still find the home its stopped node released free at once. A node of this
    process that still runs keeps the home to itself."""
    home = init_home(tmp_path / "home", NodeConfig())
    held = home.lock()
    with pytest.raises(HomeError, match=f"in use by another node \\(pid {os.getpid()}\\)"):
        home.lock()
    # The child stands for a spawn caught between fork and exec: it holds the lock's copy.
    spawn = subprocess.Popen(["cat"], stdin=subprocess.PIPE, pass_fds=[held.fd or -1])
    try:
        held.release()
        again = home.lock()
        assert spawn.poll() is None  # its copy still open, and the home taken all the same
        again.release()
    finally:
        assert spawn.stdin is not None
        spawn.stdin.close()
        spawn.wait(timeout=30)


def test_node_json_says_where_it_is_in_one_line(tmp_path):
    # Before: cx node had no --json; a supervisor parsed the human line.
    home = init_home(tmp_path / "home", NodeConfig())
    with running_node(home) as (_, started):
        assert started["peer_id"] == home.key().peer_id
        assert started["role"] == "buyer"
        assert started["api"] == json.loads((home.root / "api.json").read_text())["url"]
        assert started["listen"][0].endswith(f"/p2p/{started['peer_id']}")


def test_ports_another_program_holds_are_named_before_anything_starts(tmp_path):
    with socket.socket() as p2p, socket.socket() as api:
        p2p.bind(("127.0.0.1", 0))
        p2p.listen()
        api.bind(("127.0.0.1", 0))
        api.listen()
        p2p_port, api_port = p2p.getsockname()[1], api.getsockname()[1]
        listen = f"/ip4/127.0.0.1/tcp/{p2p_port}"
        home = init_home(tmp_path / "home", NodeConfig(listen=(listen,), api_port=api_port))
        assert refusal(cx_node(home.root)) == [
            f"port {p2p_port} ([network] listen {listen}) is in use by another program; "
            "stop it, or choose another port in config.toml",
            f"port {api_port} ([network] api_port) is in use by another program; "
            "stop it, or choose another port in config.toml",
        ]
    assert free_port()  # nothing of ours is left holding a port


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (
            lambda t: t.replace("cpu_milli = 1000", "cpu_milli = -4000"),
            ["[provider] cpu_milli: must be at least 1, not -4000"],
        ),
        (
            lambda t: t.replace("cpu_core_hour", "cpu_core_hr"),
            [
                "[provider] cpu_core_hr: unknown key; did you mean cpu_core_hour?",
                "[provider] cpu_core_hour: missing; it is required",
            ],
        ),
        (lambda t: t + "\n[netwrk]\n", ["[netwrk]: unknown table; did you mean network?"]),
        (
            lambda t: t.replace("dht = false", 'dht = "no"'),
            ["[network] dht: must be true or false, not 'no'"],
        ),
        (
            lambda t: t.replace("api_port = 0", "api_port = 70000"),
            ["[network] api_port: 70000 is outside 0..65535"],
        ),
        (lambda t: t + "\nnot toml\n", ["Expected '=' after a key"]),
    ],
)
def test_a_bad_config_is_named_one_line_per_problem(tmp_path, edit, says):
    home = init_home(tmp_path / "home", provider_config())
    home.config_path.write_text(edit(home.config_path.read_text()))
    lines = refusal(cx_node(home.root))
    assert len(lines) == len(says), lines
    for line, expected in zip(lines, says, strict=True):
        assert line.startswith(f"{home.config_path}: ")
        assert expected in line


def test_an_uninitialised_home_says_to_run_cx_init(tmp_path):
    (line,) = refusal(cx_node(tmp_path / "nothing"))
    assert "with `cx init --home" in line


def test_selling_more_than_the_host_has_is_warned_about(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "node.cli", "init", "--home", str(tmp_path / "h"), "--provider",
         "--cpu", "100000", "--memory", "64Ti", "--json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    warnings = done.stderr.splitlines()
    assert warnings[0].startswith("cx init: warning: this provider sells 100000 cores; ")
    assert warnings[1].startswith("cx init: warning: this provider sells 64 TiB of memory; ")
    assert json.loads(done.stdout)["provider"] is True
