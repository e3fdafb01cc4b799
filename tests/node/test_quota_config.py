"""``[[provider.quota]]`` in config.toml (node/storage/quota_config.py): read into the
provider's quotas, written back as it was, and each mistake named by its group and key, at
start-up (config_rules) and by ``cx config check`` (config_check) alike."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from node.storage.config_check import check_config
from node.storage.home import Home, HomeError, NodeConfig, init_home
from protocol.identity import PrivateKey
from protocol.quotas import Quota

ALICE = PrivateKey.from_seed(b"a" * 32).public_key
BOB = PrivateKey.from_seed(b"b" * 32).public_key

PROVIDER = """
[provider]
cpu_milli = 4000
memory_bytes = 8589934592
cpu_core_hour = 90000000
"""

QUOTAS = f"""
[[provider.quota]]
name = "students"
peers = ["{ALICE.peer_id}", "{BOB.peer_id}"]
cpu_milli = 2000
memory_bytes = 4294967296
gpus = 0
jobs = 2
credits_per_day = 5000000
priority = -1

[[provider.quota]]
name = "everyone"
jobs = 4
priority = 10
"""


def home_with(tmp_path: Path, text: str) -> Home:
    home = init_home(tmp_path / "home", NodeConfig())
    home.config_path.write_text(text)
    return home


def test_quotas_are_read_and_written_back_as_they_were(tmp_path: Path) -> None:
    home = home_with(tmp_path, PROVIDER + QUOTAS)
    assert check_config(home) == []
    config = home.config()
    assert config.provider is not None
    students, everyone = config.provider.quotas.groups
    assert students == Quota(
        name="students",
        members=frozenset({ALICE.raw, BOB.raw}),
        cpu_milli=2000,
        memory_bytes=4 * 1024**3,
        gpus=0,
        jobs=2,
        credits_per_day=5_000_000,
        priority=-1,
    )
    assert everyone == Quota(name="everyone", jobs=4, priority=10)  # the default group
    home.save_config(config)
    assert check_config(home) == []
    assert home.config() == config


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        ("jobs = 2", "jobs = -1", "'students' jobs: must be a whole number >= 0, not -1"),
        ("jobs = 2", "jobz = 2", "'students' jobz: unknown key (known: name, peers,"),
        ('name = "everyone"', 'name = "students"', "'students' name: two groups have this name"),
        (f'"{BOB.peer_id}"', '"12D3KooWnope"', "'students' peers: '12D3KooWnope' is not a peer id"),
        ('name = "everyone"', 'name = "everyone"\npeers = ["' + ALICE.peer_id + '"]',
         f"'everyone' peers: {ALICE.peer_id} is in group 'students' already"),
        ("priority = 10", "priority = true", "'everyone' priority: must be a whole number"),
    ],
)  # fmt: skip
def test_a_quota_mistake_is_named_by_group_and_key_at_start_and_by_config_check(
    tmp_path: Path, old: str, new: str, said: str
) -> None:
    assert old in QUOTAS
    home = home_with(tmp_path, PROVIDER + QUOTAS.replace(old, new, 1))
    [problem] = check_config(home)
    assert problem.where == "[provider] quota"
    assert problem.why.startswith(said), problem.why
    with pytest.raises(HomeError, match=re.escape(f"[provider] quota: {said}")):
        home.config()


def test_quota_that_is_not_an_array_of_tables_is_one_problem(tmp_path: Path) -> None:
    home = home_with(tmp_path, PROVIDER + "quota = 3\n")
    [problem] = check_config(home)
    assert "must be an array of tables" in problem.why
    with pytest.raises(HomeError, match="array of tables"):
        home.config()


def test_every_problem_is_said_at_once(tmp_path: Path) -> None:
    home = home_with(tmp_path, PROVIDER + '[[provider.quota]]\nname = "a"\njobs = -1\n'
                     '[[provider.quota]]\nname = "b"\n')  # fmt: skip
    [problem] = check_config(home)
    assert problem.why == (
        "'a' jobs: must be a whole number >= 0, not -1; "
        "more than one group names no peers (the default group)"
    )
