"""What a testnet's nodes go through: node/testnet/schedule.py's plan, and cx testnet's
flags for it (pure: nothing is started)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.cli import main
from node.testnet import Conditions, Testnet
from node.testnet.schedule import CHURN_WINDOW_S, DOWN_S, PARTITION_AT_S, Kind, plan
from node.testnet.wan import Impairment

NAMES = [f"node-{i}" for i in range(10)]


@given(
    count=st.integers(min_value=1, max_value=10),
    churn=st.floats(min_value=0.0, max_value=1.0),
    partition_s=st.sampled_from([0.0, 0.5, 30.0]),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_every_killed_node_comes_back_and_every_partition_heals(
    count: int, churn: float, partition_s: float, seed: int
) -> None:
    names = NAMES[:count]
    events = plan(names, churn=churn, partition_s=partition_s, rng=random.Random(seed))
    assert [e.at_s for e in events] == sorted(e.at_s for e in events)
    killed = [e.nodes[0] for e in events if e.kind is Kind.KILL]
    assert len(killed) == len(set(killed)) == -(-churn * count // 1)  # ceil, each once
    for name in killed:
        [kill] = [e for e in events if e.kind is Kind.KILL and e.nodes == (name,)]
        [back] = [e for e in events if e.kind is Kind.RESTART and e.nodes == (name,)]
        assert 0 < kill.at_s <= CHURN_WINDOW_S
        assert DOWN_S[0] <= back.at_s - kill.at_s <= DOWN_S[1]
    cuts = [e for e in events if e.kind is Kind.PARTITION]
    heals = [e for e in events if e.kind is Kind.HEAL]
    if partition_s and count > 1:
        [cut], [heal] = cuts, heals
        assert cut.at_s == PARTITION_AT_S
        assert heal.at_s == PARTITION_AT_S + partition_s
        assert 0 < len(cut.nodes) < count  # two sides, neither empty
    else:
        assert cuts == heals == []


def test_the_same_seed_plans_the_same_run() -> None:
    one, two = (plan(NAMES, churn=0.3, partition_s=5, rng=random.Random(7)) for _ in range(2))
    assert one == two
    assert one != plan(NAMES, churn=0.3, partition_s=5, rng=random.Random(8))


def test_a_plan_refuses_a_churn_outside_zero_to_one() -> None:
    with pytest.raises(ValueError, match="churn is a fraction"):
        plan(NAMES, churn=1.5, partition_s=0, rng=random.Random(0))


def test_wan_conditions_need_namespaces_and_nat_spares_the_bootstrap_node() -> None:
    with pytest.raises(ValueError, match="need --netns"):
        Conditions(impairment=Impairment(latency_s=0.05))
    with pytest.raises(ValueError, match="need --netns"):
        Conditions(nat=1)
    with pytest.raises(ValueError, match="at most 2 of 3 nodes"):
        Testnet(1, 2, conditions=Conditions(netns=True, nat=3))


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--latency", "50ms"], "latency, jitter, loss, NAT and partitions need --netns"),
        (["--netns", "--nat", "5"], "--nat 5: at most 4 of 5 nodes"),
    ],
)
def test_wan_flags_that_do_not_fit_together_get_one_line_and_start_nothing(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["testnet", *argv]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"cx testnet: {says}")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--loss", "100%"], "a loss is from 0% to below 100%"),
        (["--loss", "lots"], "is not a loss like 1% or 0.01"),
        (["--churn", "2"], "a fraction of the nodes is 0 to 1"),
        (["--churn", "some"], "is not a fraction like 0.2"),
    ],
)
def test_bad_wan_values_are_refused_by_the_parser(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["testnet", "--netns", *argv]) == 2
    assert says in capsys.readouterr().err.splitlines()[-1]
