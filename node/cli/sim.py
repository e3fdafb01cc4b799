"""``cx sim``: run a market scenario in the deterministic simulator (node/sim/)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from node.cli.common import print_json, table
from node.sim import VERIFY_MODES, ScenarioError, parse_scenario, simulate
from node.sim.report import price_chart, render_html

EXIT_BROKEN = 1  # the run broke an invariant
EXIT_USAGE = 2


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    parser = commands.add_parser(
        "sim",
        help="simulate a market scenario of up to tens of thousands of nodes, deterministically",
        description=(
            "Run SCENARIO (a TOML file; spec/scenarios/ has examples) in a discrete-event "
            "simulator that drives the real protocol code over a simulated GossipSub network. "
            "The same scenario and seed give the same run and the same digest. Prints the "
            "metrics; exits 1 if an invariant broke (a receipt not held alike by payer and "
            "payee, balances not summing to zero, a payment for an abandoned job)."
        ),
    )
    parser.add_argument("scenario", type=Path, metavar="SCENARIO", help="scenario TOML file")
    parser.add_argument("--nodes", type=int, help="number of nodes (default: the scenario's)")
    parser.add_argument("--seed", type=int, default=1, help="the run's seed (default 1)")
    parser.add_argument(
        "--json", action="store_true", help="print the metrics as one JSON document"
    )
    parser.add_argument(
        "--out", type=Path, help="write metrics.json, report.html and prices.svg here"
    )
    parser.add_argument(
        "--verify",
        choices=VERIFY_MODES,
        default="once",
        help="open each gossiped message for real once and share the verdict (default), "
        "or at every delivery (slow; same results)",
    )
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        text = args.scenario.read_text()
    except OSError as exc:
        print(f"cx sim: cannot read {args.scenario}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    if args.nodes is not None and args.nodes < 10:
        print("cx sim: --nodes must be at least 10", file=sys.stderr)
        return EXIT_USAGE
    try:
        scenario = parse_scenario(
            text, nodes=args.nodes, read=lambda name: (args.scenario.parent / name).read_text()
        )
    except ScenarioError as exc:
        print(f"cx sim: {args.scenario}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    doc = simulate(scenario, seed=args.seed, verify=args.verify)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "metrics.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        (args.out / "report.html").write_text(render_html(doc))
        (args.out / "prices.svg").write_text(price_chart(doc) + "\n")
    if args.json:
        print_json(doc)
    else:
        print(_summary(doc))
    return 0 if doc["invariants"]["ok"] else EXIT_BROKEN


def _summary(doc: dict[str, Any]) -> str:
    jobs = doc["jobs"]
    wait = doc["time_to_match_ms"]
    per_node = doc["traffic"]["per_node"]
    rows = [
        (
            "scenario",
            f"{doc['scenario']} (seed {doc['seed']}, {doc['nodes']} nodes, {doc['minutes']:g} min)",
        ),
        (
            "jobs",
            f"{jobs['submitted']} submitted, {jobs['matched']} matched, {jobs['settled']} settled",
        ),
        ("match rate", str(doc["match_rate"])),
        ("time to match", f"p50 {wait['p50']} ms, p99 {wait['p99']} ms"),
        ("fairness", str(doc["fairness"])),
        ("work per credit", f"{doc['work_per_credit']} core-hours"),
        (
            "gossip per node",
            f"{per_node['gossip_messages']['mean']} messages, "
            f"{per_node['gossip_bytes']['mean']} bytes (mean)",
        ),
        *((f"adversary {k}", json.dumps(v, sort_keys=True)) for k, v in doc["adversaries"].items()),
        (
            "invariants",
            "ok" if doc["invariants"]["ok"] else "; ".join(doc["invariants"]["problems"]),
        ),
        ("digest", doc["digest"]),
    ]
    return table(("", ""), rows)
