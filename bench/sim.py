"""Simulator benchmark: how run time and memory grow with the number of nodes.

Run: .venv/bin/python bench/sim.py [--nodes 1000,10000,50000] [--minutes M]

The workload is the same at every size: 100 providers (one offer each), buyers bidding 5
jobs a minute for ``--minutes`` simulated minutes, on the steady scenario's network (mesh
degree 8, 1 % loss), every node subscribed to one global topic. So the orders are the same
and every added node is one more relay that admits every order: the run's work grows with
nodes x orders, which is the question (issue 18: every node seeing every order).

Each size runs in its own process (so its peak memory is its own). Measured per size:
wall seconds, gossip deliveries (transmissions between mesh peers), admissions (first
copies, each running the receiving node's admission and book), both per second,
node-seconds simulated per wall second, and peak RSS. The baseline, measured in the same
run: the real node's validator path, ``Trader.receive_order`` on the same kind of order
(decode, Ed25519, admission, book) per second; the simulator admits with the signature
verdict shared (``--verify once``), so the ratio says what that buys. The run is repeated
at the smallest size to check the digest is the same. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from factories import HOUR_MS, T0, Nonces, bid, key, offer

from node.sim import parse_scenario, simulate
from protocol.trader import Trader

SCENARIOS = ROOT / "spec" / "scenarios"
PROVIDERS = 100


def scenario_text(nodes: int, minutes: int) -> str:
    return (
        f'extends = "steady.toml"\nname = "bench"\nminutes = {minutes}\n'
        f"providers = {PROVIDERS / nodes!r}\n"
    )


def one(nodes: int, minutes: int, seed: int) -> dict[str, object]:
    scenario = parse_scenario(
        scenario_text(nodes, minutes), nodes=nodes, read=lambda f: (SCENARIOS / f).read_text()
    )
    start = time.perf_counter()
    doc = simulate(scenario, seed=seed)
    wall = time.perf_counter() - start
    traffic = doc["traffic"]
    return {
        "nodes": nodes,
        "wall_s": round(wall, 2),
        "published": traffic["published"],
        "deliveries": traffic["gossip_deliveries"],
        "admissions": traffic["admissions"],
        "deliveries_per_s": round(traffic["gossip_deliveries"] / wall),
        "admissions_per_s": round(traffic["admissions"] / wall),
        "node_s_per_wall_s": round(nodes * minutes * 60 / wall),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "book_orders_p50": traffic["per_node"]["book_orders"]["p50"],
        "digest": doc["digest"],
    }


def real_admissions_per_s(count: int = 2000) -> float:
    """The real validator path on fresh orders: decode, verify, admit, book."""
    nonces = Nonces("bench-sim")
    signer = Trader(key("bench-signer"))
    wires = [
        signer.post(
            bid(cpu_limit=40_000 + i) if i % 2 else offer(cpu_price=50_000 + i),
            nonce=nonces(),
            now_ms=T0,
            ttl_ms=HOUR_MS,
        )[0].wire
        for i in range(count)
    ]
    receiver = Trader(key("bench-receiver"))
    start = time.perf_counter()
    for wire in wires:
        receiver.receive_order(wire, now_ms=T0)
    return count / (time.perf_counter() - start)


def child(nodes: int, minutes: int, seed: int) -> dict[str, object]:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--one",
            str(nodes),
            "--minutes",
            str(minutes),
            "--seed",
            str(seed),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,10000,50000")
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.minutes, args.seed)))
        return 0

    sizes = [int(n) for n in args.nodes.split(",")]
    baseline = real_admissions_per_s()
    rows = [child(n, args.minutes, args.seed) for n in sizes]
    again = child(sizes[0], args.minutes, args.seed)
    deterministic = again["digest"] == rows[0]["digest"]
    baseline_after = real_admissions_per_s()
    base = max(baseline, baseline_after)

    print(f"real validator path (Trader.receive_order): {base:,.0f} orders/s")
    print(
        f"{'nodes':>7} {'wall s':>8} {'deliveries':>12} {'deliv/s':>9} {'admissions':>11} "
        f"{'admit/s':>8} {'x real':>6} {'node-s/s':>9} {'RSS MiB':>8} {'growth':>7}"
    )
    first = rows[0]
    for row in rows:
        growth = float(row["wall_s"]) / float(first["wall_s"])  # type: ignore[arg-type]
        print(
            f"{row['nodes']:>7} {row['wall_s']:>8} {row['deliveries']:>12,} "
            f"{row['deliveries_per_s']:>9,} {row['admissions']:>11,} {row['admissions_per_s']:>8,} "
            f"{float(row['admissions_per_s']) / base:>6.2f} {row['node_s_per_wall_s']:>9,} "  # type: ignore[arg-type]
            f"{row['peak_rss_mib']:>8,} {growth:>6.1f}x"
        )
    biggest = rows[-1]
    hours = 1e8 / float(biggest["deliveries_per_s"]) / 3600  # type: ignore[arg-type]
    print(f"same seed, same digest: {deterministic}")
    print(f"10^8 deliveries at the largest size's rate: {hours:.2f} h (goal: 10 min)")
    print(
        json.dumps(
            {
                "bench": "sim",
                "real_admissions_per_s": round(base),
                "sizes": rows,
                "deterministic": deterministic,
                "hours_for_1e8_deliveries": round(hours, 3),
                "load_average": os.getloadavg(),
                "python": platform.python_version(),
            }
        )
    )
    return 0 if deterministic else 1


if __name__ == "__main__":
    sys.exit(main())
