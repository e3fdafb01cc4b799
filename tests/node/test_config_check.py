"""``cx config check``: each problem of config.toml named by its key, and every key the node
writes known to the checker."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from node.storage.config_check import check_config
from node.storage.home import Home, NodeConfig, init_home

CX = str(Path(__file__).parents[2] / ".venv" / "bin" / "cx")

EVERYTHING = """
[network]
listen = ["/ip4/127.0.0.1/tcp/0"]
bootstrap = []
dht = true
mdns = false
api_port = 4100

[buyer]
ek_roots = []

[provider]
cpu_milli = 4000
memory_bytes = 8589934592
disk_bytes = 0
cpu_core_hour = 90000000
memory_gib_hour = 9000000
arch = "arm64"
region = "eu"
tpm = false
offer_ttl_ms = 600000
max_share_ppm = 500000
benchmark = true
ingress_gib = 20000
egress_gib = 90000

[provider.pricing]
step_ppm = 20000
min_interval_ms = 60000
window_ms = 3600000

[provider.pricing.cpu_core_hour]
policy = "market"
price = 80000000
floor = 1000000
ceiling = 200000000
undercut_ppm = 10000

[provider.cost]
watts = 300
kwh_price = 250000
depreciation_per_hour = 5000

[store]
budget_bytes = 1073741824

[s3]
endpoint = "http://127.0.0.1:9000"
region = "us-east-1"
"""


def home_with(tmp_path: Path, text: str) -> Home:
    home = init_home(tmp_path / "home", NodeConfig())
    home.config_path.write_text(text)
    return home


def test_every_key_the_node_writes_is_known_to_the_checker(tmp_path: Path) -> None:
    home = home_with(tmp_path, EVERYTHING)
    assert check_config(home) == []
    home.save_config(home.config())  # as the node writes it back
    assert check_config(home) == []
    provider = home.config().provider
    assert provider is not None
    assert (provider.ingress_gib, provider.egress_gib) == (20_000, 90_000)


CASES = [  # (text in EVERYTHING, what replaces it, a line the checker must say)
    (
        "cpu_milli = 4000",
        "cpu_mili = 4",
        "[provider] cpu_mili: unknown key; did you mean cpu_milli?",
    ),
    ("cpu_milli = 4000", "cpu_mili = 4", "[provider] cpu_milli: missing; it is required"),
    ("[store]", "[stroe]", "[stroe]: unknown table; did you mean store?"),
    ("api_port = 4100", "api_port = 70000", "[network] api_port: 70000 is outside 0..65535"),
    ("api_port = 4100", "api_port = true", "[network] api_port: must be a whole number, not True"),
    ("dht = true", 'dht = "yes"', "[network] dht: must be true or false, not 'yes'"),
    ('arch = "arm64"', 'arch = "x86"', "[provider] arch: 'x86' is not one of amd64, arm64"),
    ('policy = "market"', 'policy = "bid"', "[provider.pricing.cpu_core_hour] policy: 'bid' is"),
    ("ingress_gib = 20000", "ingress_gib = -1", "[provider] ingress_gib: must be at least 0"),
    ("watts = 300", "watts = -3", "[provider.cost] watts: must be at least 0, not -3"),
    ("bootstrap = []", 'bootstrap = "/ip4/1.2.3.4"', "[network] bootstrap: must be a list of"),
    ("ek_roots = []", 'ek_roots = ["/nowhere/ca.pem"]', "ek_roots: /nowhere/ca.pem: no such file"),
    (
        "window_ms = 3600000",
        "window_ms = 1\nwindow = 1",
        "window: unknown key; did you mean window_ms?",
    ),
    ("[s3]", "[s3]\nendpont = 1", "[s3] endpont: unknown key; did you mean endpoint?"),
    ("[network]", "[network\n", "not valid TOML"),
]


@pytest.mark.parametrize(("old", "new", "expected"), CASES)
def test_a_problem_is_named_by_its_key(tmp_path: Path, old: str, new: str, expected: str) -> None:
    assert old in EVERYTHING
    home = home_with(tmp_path, EVERYTHING.replace(old, new, 1))
    said = [str(p) for p in check_config(home)]
    assert any(expected in line for line in said), said


def test_cx_config_check_exits_1_with_a_line_per_problem(tmp_path: Path) -> None:
    home = home_with(
        tmp_path, EVERYTHING.replace("cpu_milli", "cpu_mili").replace("dht = true", "dht = 1")
    )
    done = subprocess.run(
        [CX, "config", "check", "--home", str(home.root)], capture_output=True, text=True
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert "cx config check: [provider] cpu_mili: unknown key; did you mean cpu_milli?" in lines
    assert "cx config check: [network] dht: must be true or false, not 1" in lines
    assert lines[-1].endswith("3 problem(s); fix them and run this again")
    home.config_path.write_text(EVERYTHING)
    done = subprocess.run(
        [CX, "config", "check", "--home", str(home.root)], capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (0, f"{home.config_path}: usable\n")
