"""``cx testnet``: run a local testnet of node processes through a demo workload."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from node.cli.common import credits, duration_ms, print_json, table
from node.cli.market import sparkline
from node.testnet import Conditions, Testnet
from node.testnet.netns import LabError
from node.testnet.wan import Impairment
from node.workload import SCENARIOS, Verdict

EXIT_LOST = 1


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    parser = commands.add_parser(
        "testnet",
        help="run N providers and M buyers as processes through a demo workload",
        description=(
            "Start providers and buyers as separate `cx node` processes on loopback, each "
            "with its own home, key, SQLite and (for the first provider) software TPM; "
            "submit a workload of real container jobs with mixed resources, prices and "
            "trust levels; show progress and a final table of jobs, where they ran, what "
            "they cost and the ledgers. Exits 1 if anything was lost: a job that did not "
            "reach its expected outcome, a receipt missing from a ledger, or balances that "
            "do not sum to zero. With --netns every node gets a network namespace on an "
            "emulated WAN instead (latency, jitter, loss, NAT, partitions); --churn kills "
            "and restarts nodes during the run. Needs root (containers with cgroup limits, "
            "namespaces)."
        ),
    )
    add_market_arguments(parser)
    parser.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        default="demo",
        help="; ".join(f"{s.name}: {s.summary}" for s in SCENARIOS.values()) + " (default demo)",
    )
    parser.add_argument(
        "--no-tpm", action="store_true", help="no software TPM (skips the attested job)"
    )
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for the workload"
    )
    wan = parser.add_argument_group("an internet of namespaces")
    wan.add_argument(
        "--netns", action="store_true", help="each node in its own namespace on an emulated WAN"
    )
    wan.add_argument("--latency", type=duration_ms, default=0, help="one way, e.g. 80ms")
    wan.add_argument("--jitter", type=duration_ms, default=0, help="+/- on each packet, 20ms")
    wan.add_argument("--loss", type=percent, default=0.0, help="packets lost, e.g. 1%%")
    wan.add_argument(
        "--nat", type=int, default=0, metavar="N", help="the last N nodes sit behind NAT"
    )
    wan.add_argument(
        "--partition", type=duration_ms, default=0, help="cut the nodes in two for this long"
    )
    wan.add_argument(
        "--churn",
        type=fraction,
        default=0.0,
        help="kill -9 and restart this fraction of the nodes during the run, e.g. 0.2",
    )
    wan.add_argument("--seed", type=int, default=0, help="for the random choices (default 0)")
    parser.set_defaults(run=_run)


def percent(text: str) -> float:
    """1% or 0.01 as a fraction below 1; for argparse ``type=``."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a loss like 1% or 0.01") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: a loss is from 0% to below 100%")
    return value


def fraction(text: str) -> float:
    """0.2 (of the nodes); for argparse ``type=``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction like 0.2") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: a fraction of the nodes is 0 to 1")
    return value


def _conditions(args: argparse.Namespace) -> Conditions:
    """Raises ValueError naming the flag that does not fit."""
    impairment = Impairment(
        latency_s=args.latency / 1000, jitter_s=args.jitter / 1000, loss=args.loss
    )
    return Conditions(
        netns=args.netns,
        impairment=impairment,
        nat=args.nat,
        partition_s=args.partition / 1000,
        churn=args.churn,
        seed=args.seed,
    )


def add_market_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments ``cx testnet`` and ``cx demo`` share."""
    parser.add_argument("--providers", type=int, default=3, help="provider nodes (default 3)")
    parser.add_argument("--buyers", type=int, default=2, help="buyer nodes (default 2)")
    parser.add_argument("--work", type=Path, help="keep the nodes' homes and logs here")
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON")


def report(
    verdict: Verdict,
    *,
    as_json: bool,
    started: float,
    events: list[dict[str, Any]] | None = None,
    behind_nat: list[str] | None = None,
) -> int:
    """Print the outcome (a table, or JSON); the exit status it means. ``events``: the
    kills, restarts and partitions the nodes went through; ``behind_nat``: nodes' names."""
    if as_json:
        outcome = {
            "ok": verdict.ok,
            "problems": verdict.problems,
            "jobs": verdict.jobs,
            "ledgers": verdict.ledgers,
            "trades": verdict.trades,
        }
        if events is not None:
            outcome.update(events=events, behind_nat=behind_nat or [])
        print_json(outcome)
    else:
        print(render(verdict, time.monotonic() - started, behind_nat=behind_nat or []))
    return 0 if verdict.ok else EXIT_LOST


def _run(args: argparse.Namespace) -> int:
    if args.providers < 1 or args.buyers < 1:
        print("cx testnet: needs at least one provider and one buyer", file=sys.stderr)
        return 2
    started = time.monotonic()

    def say(line: str) -> None:
        if not args.json:
            print(line, file=sys.stderr, flush=True)

    try:
        net = Testnet(
            args.providers,
            args.buyers,
            work=args.work,
            tpm=False if args.no_tpm else None,
            scenario=SCENARIOS[args.scenario],
            conditions=_conditions(args),
        )
    except ValueError as exc:
        print(f"cx testnet: {exc}", file=sys.stderr)
        return 2
    progress = progress_printer(started, quiet=args.json)

    def happened(event: dict[str, Any]) -> None:
        nodes = " | ".join(", ".join(n) if isinstance(n, list) else n for n in event["nodes"])
        say(f"{time.monotonic() - started:6.1f}s  -- {event['event']} {nodes}".rstrip())

    try:
        net.start(progress=say)
        up = f"{len(net.nodes)} nodes up; every buyer sees every offer"
        if args.nat:
            up += "; the nodes behind NAT hold relay slots"
        say(f"{time.monotonic() - started:6.1f}s  {up}")
        verdict = net.run(timeout_s=args.timeout, progress=progress, happened=happened)
    except LabError as exc:
        print(f"cx testnet: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError) as exc:
        print(f"cx testnet: {exc}", file=sys.stderr)
        return EXIT_LOST
    finally:
        net.stop()
    behind_nat = [n.name for n in net.nodes if n.nat]
    return report(
        verdict, as_json=args.json, started=started, events=net.events, behind_nat=behind_nat
    )


def progress_printer(started: float, *, quiet: bool) -> Callable[[list[dict[str, Any]]], None]:
    """A progress callback that prints each job's new state to stderr, once."""
    seen: dict[str, str] = {}

    def progress(views: list[dict[str, Any]]) -> None:
        for v in views:
            if seen.get(v["plan"]) != v["state"] and not quiet:
                seen[v["plan"]] = v["state"]
                where = f" on {v['provider_name']}" if v["provider_name"] != "-" else ""
                line = f"{time.monotonic() - started:6.1f}s  {v['plan']:<10} {v['state']}{where}"
                print(line, file=sys.stderr, flush=True)

    return progress


def render(verdict: Verdict, elapsed_s: float, *, behind_nat: list[str]) -> str:
    jobs = table(
        ("JOB", "BUYER", "PROVIDER", "STATE", "EXIT", "PAID", "EXPECTED"),
        [
            (
                v["plan"],
                v["buyer"],
                v["provider_name"],
                v["state"],
                v["exit_reason"] or "-",
                credits(v["cost"]) if v["cost"] is not None else "-",
                v["expect"],
            )
            for v in verdict.jobs
        ],
        right=(5,),
    )
    ledgers = table(
        ("NODE", "RECEIPTS", "BALANCE"),
        [
            (name, str(len(ledger["entries"])), credits(ledger["balance"]))
            for name, ledger in verdict.ledgers.items()
        ],
        right=(1, 2),
    )
    total = sum(ledger["balance"] for ledger in verdict.ledgers.values())
    lines = [jobs, ""]
    if prices := [t["cpu_core_hour"] for t in verdict.trades]:
        lines += [
            f"tape: {len(prices)} trades, CPU price per core-hour from {credits(prices[0])} "
            f"to {credits(prices[-1])}, {credits(min(prices))}..{credits(max(prices))}: "
            f"{sparkline(prices)}",
            "",
        ]
    lines += [f"  {v['plan']}: {v['why']}" for v in verdict.jobs if v.get("why")]
    if behind_nat:
        lines.append(f"  behind NAT: {', '.join(behind_nat)}")
    lines += [
        "",
        ledgers,
        f"balances sum to {credits(total)} across {len(verdict.ledgers)} nodes",
        "",
    ]
    if verdict.ok:
        lines.append(
            "OK: every job reached its expected outcome and both sides of every receipt "
            f"agree ({elapsed_s:.1f} s)"
        )
    else:
        lines += ["LOST:", *(f"  - {p}" for p in verdict.problems)]
    return "\n".join(lines)
