"""The market simulator (node/sim/): determinism, verdicts, adversaries, scenarios, CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from node.cli import main
from node.sim import ScenarioError, parse_scenario, simulate
from node.sim.network import Mesh

SCENARIOS = Path(__file__).parents[2] / "spec" / "scenarios"


def small(name: str, *, nodes: int = 60, minutes: int = 8, extra: str = "") -> object:
    """A shipped scenario, shrunk so a test runs it in about a second."""
    text = f'extends = "{name}.toml"\nminutes = {minutes}\n{extra}'
    return parse_scenario(text, nodes=nodes, read=lambda f: (SCENARIOS / f).read_text())


# -- determinism ----------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_document_byte_for_byte():
    scenario = small("steady")
    first = json.dumps(simulate(scenario, seed=7), sort_keys=True)
    second = json.dumps(simulate(scenario, seed=7), sort_keys=True)
    assert first == second
    assert json.loads(first)["jobs"]["settled"] > 0


def test_another_seed_gives_another_run():
    scenario = small("steady")
    assert simulate(scenario, seed=7)["digest"] != simulate(scenario, seed=8)["digest"]


def test_sharing_signature_verdicts_decides_exactly_as_verifying_at_every_hop():
    scenario = small("spam", nodes=30, minutes=3)
    once = simulate(scenario, seed=3, verify="once")
    every = simulate(scenario, seed=3, verify="every")
    assert once["digest"] == every["digest"]
    assert once["traffic"]["rejected"] == every["traffic"]["rejected"]
    assert every["run"]["signatures_opened"] > 5 * once["run"]["signatures_opened"]


# -- what the market and its adversaries do ------------------------------------------------


@pytest.mark.parametrize("name", sorted(p.stem for p in SCENARIOS.glob("*.toml")))
def test_every_shipped_scenario_keeps_the_ledger_invariants(name):
    doc = simulate(small(name, nodes=40, minutes=6), seed=1)
    assert doc["invariants"]["ok"], doc["invariants"]["problems"]
    assert doc["jobs"]["matched"] > 0


def test_invalid_spam_is_admitted_nowhere_and_stops_at_the_first_hop():
    doc = simulate(small("spam"), seed=2)
    spam = doc["adversaries"]["spammer"]
    assert spam["sent"] > 100
    rejected = doc["traffic"]["rejected"]
    assert {"bad-signature", "expired", "ttl-too-long"} <= set(rejected)
    # each spam order reaches the spammer's mesh peers only, never the whole network
    assert sum(rejected.values()) < spam["sent"] * 20
    assert spam["agreements"] == spam["paid"] == 0


def test_a_provider_that_never_runs_is_paid_nothing_and_dropped():
    doc = simulate(small("lying-provider", nodes=40, minutes=15), seed=4)
    liar = doc["adversaries"]["no-show-provider"]
    assert liar["agreements"] > 0
    assert liar["paid"] == 0
    assert 0 < liar["excluded_by"] <= liar["agreements"]
    assert liar["reputation_at_honest_nodes"] == -liar["excluded_by"]
    assert doc["jobs"]["provider_faults"] == liar["agreements"]


def test_a_sybil_ring_trades_with_itself_and_gains_no_reputation_elsewhere():
    doc = simulate(small("sybil-reputation", minutes=15), seed=5)
    ring = doc["adversaries"]["sybil-ring"]
    assert ring["ring_trades"] > 0
    assert ring["reputation_at_honest_nodes"] == 0


def test_churn_and_a_partition_cost_jobs_but_never_the_ledgers():
    doc = simulate(small("unreliable", minutes=15), seed=7)
    assert doc["traffic"]["lost_direct"] > 0
    assert doc["jobs"]["provider_faults"] > 0
    assert doc["invariants"]["ok"], doc["invariants"]["problems"]


def test_providers_pricing_by_utilization_and_the_tape_repost_their_offers():
    doc = simulate(small("surge", nodes=60, minutes=15), seed=3)
    jobs = doc["jobs"]
    # one offer per provider, one bid per job, a cancel and a bid per escalation: the rest
    # are offers re-posted at new prices and the cancels of the ones they replaced
    plain = doc["providers"] + jobs["submitted"] + 2 * jobs["escalations"]
    assert doc["traffic"]["published"] > plain + 10
    assert doc["invariants"]["ok"]


def test_sharding_topics_by_region_cuts_what_each_node_carries():
    everyone = simulate(small("steady"), seed=6)
    sharded = simulate(small("sharded"), seed=6)
    per_node = "traffic", "per_node", "gossip_bytes", "mean"

    def carried(doc):
        value = doc
        for key in per_node:
            value = value[key]
        return value

    assert carried(sharded) < carried(everyone) / 2


# -- the network model ---------------------------------------------------------------------


def _mesh(count: int) -> Mesh:
    return Mesh.build(range(count), degree=8, rng=random.Random(1), latency_ms=40, spread=0.5)


def _spread(mesh: Mesh, count: int, **overrides):
    received, received_bytes = [0] * count, [0] * count
    args = {
        "size": 100,
        "valid": True,
        "down": [False] * count,
        "side": None,
        "loss": 0.0,
        "recovery_ms": 1000,
        "rng": random.Random(2),
        "received": received,
        "received_bytes": received_bytes,
    }
    return mesh.spread(0, **(args | overrides)), received


def test_a_valid_message_reaches_every_node_once_with_every_transmission_counted():
    mesh = _mesh(300)
    spread, received = _spread(mesh, 300)
    assert sorted(spread.nodes) == list(range(1, 300))
    assert spread.times == sorted(spread.times)
    assert sum(received) == spread.deliveries > 299


def test_an_invalid_message_reaches_only_the_origins_mesh_peers():
    mesh = _mesh(300)
    spread, _ = _spread(mesh, 300, valid=False)
    assert sorted(spread.nodes) == sorted(peer for peer, _ in mesh.neighbours[0])


def test_a_partition_keeps_a_message_on_its_side_and_down_nodes_get_nothing():
    mesh = _mesh(100)
    side = [0 if n < 50 else 1 for n in range(100)]
    down = [n == 7 for n in range(100)]
    spread, received = _spread(mesh, 100, side=side, down=down)
    assert set(spread.nodes) <= set(range(1, 50)) - {7}
    assert received[7] == 0


def test_loss_delays_copies_but_loses_none():
    mesh = _mesh(200)
    clean, _ = _spread(mesh, 200)
    lossy, _ = _spread(mesh, 200, loss=0.3)
    assert sorted(lossy.nodes) == sorted(clean.nodes)
    assert max(lossy.times) > max(clean.times)


# -- scenarios and the command line --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('name = "x"\nnodez = 5', "scenario.nodez"),
        ('name = "x"\nnodes = "many"', "scenario.nodes"),
        ('extends = "steady.toml"\n[network]\ndegree = 1', "network.degree"),
        ('extends = "steady.toml"\n[[adversaries]]\nkind = "dragon"', "adversaries[0].kind"),
        ('extends = "steady.toml"\n[demand]\nshape = "flat"', "demand.shape"),
        ('extends = "nowhere.toml"', "extends"),
        ("name = ", "toml"),
    ],
)
def test_a_bad_scenario_names_the_key_at_fault(text, key):
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text, read=lambda f: (SCENARIOS / f).read_text())
    assert caught.value.key == key


def test_cx_sim_prints_json_with_a_digest_and_writes_a_report(tmp_path, capsys):
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(f'extends = "{SCENARIOS / "steady.toml"}"\nminutes = 4\n')
    out = tmp_path / "out"
    argv = ["sim", "--nodes", "30", "--seed", "7", "--json", "--out", str(out), str(scenario)]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["digest"]) == 64
    assert json.loads((out / "metrics.json").read_text())["digest"] == doc["digest"]
    assert "<svg" in (out / "report.html").read_text()
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out) == doc


def test_cx_sim_refuses_a_bad_scenario_in_one_line(tmp_path, capsys):
    scenario = tmp_path / "bad.toml"
    scenario.write_text('name = "x"\nminutes = -1\n')
    assert main(["sim", str(scenario)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "minutes" in err


def test_a_provider_lying_about_its_benchmark_wins_work_and_overcharges():
    doc = simulate(small("benchmark-liar", nodes=100, minutes=15), seed=7)
    liar = doc["adversaries"]["benchmark-liar"]
    assert liar["honest_trades"] > 0
    # a doubled score: half of every payment bought work never done (each rounded up)
    assert liar["overcharged"] == pytest.approx(liar["paid"] / 2, abs=liar["agreements"])
    assert doc["invariants"]["ok"]
