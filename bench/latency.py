"""Latency benchmark: submit-to-result of a trivial job on a 2-node testnet, beside bare crun.

Measures, in one run on this host, one provider and one buyer node (``node.peer.open_peer``)
in one process, talking real libp2p (Noise + yamux) over loopback, each with its own home
(key, SQLite in WAL mode, blob store):
- first job: the same trivial job once, cold: the provider fetches the image from the
  buyer over ``/cx/blob/1`` and unpacks it (a one-time cost per image and provider);
- then a few warm-up jobs, then ``--jobs`` jobs one after another, each submitted only when
  the one before has ended: ``Peer.submit`` to the end of ``Peer.wait``, that is the receipt
  countersigned, its outputs and logs fetched into the buyer's store, the ledger written;
- per phase, medians: bid (request resolved, job and bid written, bid signed, matched
  locally), negotiation (proposal, accept, co-signed agreement), transfer (the provider's
  agreement ack, status, image and inputs present, marked started), run (the provider's
  ``Executor.run_job``: overlay, limits, container, metering, outputs), receipt/settle
  (receipt signed and delivered, outputs and logs fetched, checked, countersigned, settled);
- baseline: the bare runtime lifecycle (run --detach/wait/delete by hand, the same
  confinement, ``bench/executor.py``'s ``bare_lifecycle``) of the same command, one run
  after every few jobs so that both see the same load on this shared machine; median.

- throughput: ``--throughput-jobs`` short jobs submitted with 1, 4 and 16 in flight, jobs per
  second until the last one's result, beside the provider's executor alone running the same
  number of jobs as many at a time (``bench/executor.py``'s ``throughput``), same run.
- the same sequential jobs (``--split-jobs``) with the provider in a process of its own, as
  users run nodes (one ``cx node`` each): latency, and the CPU each process spent per job
  (the one-process figures above share one core's event loop between the two nodes).

Goal (issue 6): submit-to-result p50 < 250 ms (Bacalhau reports about 630 ms for a no-op
executor and 1.3 s end to end). Prints a table, then one JSON line.
Usage: .venv/bin/python bench/latency.py [--jobs 100] [--warmup 5] [--bare-runs 20]
       [--throughput-jobs 48] [--split-jobs 60]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

from bench.executor import bare_lifecycle
from bench.executor import throughput as executor_throughput
from bench.transfer import cpu_seconds
from node.exec.executor import Executor
from node.market.request import JobRequest, build_request
from node.peer import Peer, open_peer
from node.storage.db import JobRow
from node.storage.home import NodeConfig, ProviderConfig, init_home
from node.storage.image import build_rootfs, import_image
from node.storage.store import BlobStore
from protocol.messages import Arch, Prices, Resources

COMMAND = ["/bin/true"]  # what bare_lifecycle runs, so the two rows compare the same job
PHASES = ("bid", "negotiation", "transfer", "run", "receipt/settle")
CONCURRENCY = (1, 4, 16)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class RunClock:
    """Wall-clock ms at which the provider's executor started and ended each job."""

    def __init__(self, peer: Peer) -> None:
        assert peer.provider is not None
        executor = peer.provider.executor
        inner = executor.run_job
        self.spans: list[tuple[float, float]] = []

        async def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.time() * 1000
            try:
                return await inner(*args, **kwargs)
            finally:
                self.spans.append((start, time.time() * 1000))

        executor.run_job = timed  # type: ignore[method-assign]


async def succeeded(buyer: Peer, request: JobRequest, timeout_s: float = 60) -> JobRow:
    """Submit a job and wait until it ends; the job. Raises RuntimeError unless it succeeded."""
    job = await buyer.submit(request)
    with trio.fail_after(timeout_s):
        done = await buyer.wait(job.id)
    if done.state != "succeeded":
        raise RuntimeError(f"job {job.id} ended {done.state}: {done.detail}")
    return done


async def one_job(buyer: Peer, request: JobRequest, clock: RunClock) -> dict[str, float]:
    """Submit one job and wait for it; its latency and phases in ms."""
    spans = len(clock.spans)
    t0, wall0 = time.perf_counter(), time.time() * 1000
    job = await succeeded(buyer, request)
    total = (time.perf_counter() - t0) * 1000
    wall1 = time.time() * 1000
    at = {e["state"]: e["at_ms"] for e in buyer.db.events(job.id)}
    run_start, run_end = clock.spans[spans]
    return {
        "total": total,
        "bid": at["negotiating"] - wall0,
        "negotiation": at["agreed"] - at["negotiating"],
        "transfer": run_start - at["agreed"],
        "run": run_end - run_start,
        "receipt/settle": wall1 - run_end,
    }


async def market_throughput(buyer: Peer, request: JobRequest, concurrency: int, jobs: int) -> float:
    """Jobs per second through the market with ``concurrency`` in flight, until the last
    result (receipt countersigned, outputs fetched)."""

    async def worker(n: int) -> None:
        for _ in range(n):
            await succeeded(buyer, request, timeout_s=120)

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(concurrency):
            nursery.start_soon(worker, jobs // concurrency + (i < jobs % concurrency))
    return jobs / (time.perf_counter() - t0)


def provider_config() -> NodeConfig:
    # Room for 16 of the small throughput jobs at once (the latency job asks for 1 core).
    capacity = Resources(cpu_milli=2000, memory_bytes=2 << 30, disk_bytes=4 << 30)
    prices = Prices(cpu_core_hour=90_000_000, memory_gib_hour=9_000_000)
    return NodeConfig(provider=ProviderConfig(capacity=capacity, prices=prices, arch=Arch.AMD64))


async def bench(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    provider_home = init_home(work / "provider", provider_config())
    out: dict[str, Any] = {}
    async with open_peer(provider_home) as provider:
        buyer_home = init_home(
            work / "buyer", NodeConfig(bootstrap=(provider.net.listen_addrs[0],))
        )
        layout = work / "image"
        build_rootfs(layout)
        image = import_image(BlobStore(buyer_home.store_root), layout).manifest
        request = build_request(
            image=image,
            command=COMMAND,
            max_prices={"cpu_core_hour": 100_000_000, "memory_gib_hour": 10_000_000},
        )
        clock = RunClock(provider)
        assert provider.provider is not None
        executor = provider.provider.executor
        out["runtime"] = executor.runtime.name
        out["cgroup_mode"] = executor.mode.value
        out["jobs"], out["bare"] = [], []
        async with open_peer(buyer_home) as buyer:
            out["first"] = await one_job(buyer, request, clock)
            for _ in range(args.warmup):
                await one_job(buyer, request, clock)
            rootfs = executor.rootfs.path(image)  # unpacked by the first job
            assert rootfs is not None
            # The baseline is sampled between the jobs, so both see the same machine load.
            every = max(1, args.jobs // max(1, args.bare_runs))
            cpu0 = time.process_time()
            for n in range(args.jobs):
                out["jobs"].append(await one_job(buyer, request, clock))
                if n % every == every - 1 and len(out["bare"]) < args.bare_runs:
                    out["bare"].append(await bare(executor, rootfs, work / "bare"))
            # CPU of this process (both nodes, not crun's) per job; the bare runs between
            # the jobs run in a worker thread and count too, as a small overestimate.
            out["cpu_ms"] = (time.process_time() - cpu0) * 1000 / args.jobs
            while len(out["bare"]) < args.bare_runs:
                out["bare"].append(await bare(executor, rootfs, work / "bare"))
            small = build_request(
                image=image,
                command=COMMAND,
                cpu_milli=100,
                memory_bytes=32 << 20,
                max_prices={"cpu_core_hour": 100_000_000, "memory_gib_hour": 10_000_000},
            )
            out["throughput"] = {}
            for c in CONCURRENCY:
                ours = await market_throughput(buyer, small, c, args.throughput_jobs)
                alone = await executor_throughput(executor, image, c, args.throughput_jobs)
                out["throughput"][c] = (ours, alone)
    if args.split_jobs:
        out["split"] = await split(args, work, request)
    return out


async def split(args: argparse.Namespace, work: Path, request: JobRequest) -> dict[str, Any]:
    """The sequential jobs again, the provider in a process of its own."""
    provider_home = init_home(work / "provider2", provider_config())
    child = await trio.lowlevel.open_process(
        [sys.executable, __file__, "--serve-provider", str(provider_home.root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        said = b""
        while not said.endswith(b"\n"):
            more = await child.stdout.receive_some()
            if not more:
                raise RuntimeError("the provider process ended before it listened")
            said += more
        buyer_home = init_home(work / "buyer2", NodeConfig(bootstrap=(said.decode().strip(),)))
        image = import_image(BlobStore(buyer_home.store_root), work / "image").manifest
        assert image == request.image
        async with open_peer(buyer_home) as buyer:
            for _ in range(1 + args.warmup):
                await total_ms(buyer, request)
            cpu0, child0 = time.process_time(), cpu_seconds(child.pid)
            totals = [await total_ms(buyer, request) for _ in range(args.split_jobs)]
            cpu1, child1 = time.process_time(), cpu_seconds(child.pid)
    finally:
        if child.stdin is not None:
            await child.stdin.aclose()  # the provider process stops when its stdin closes
        await child.wait()
    n = args.split_jobs
    return {
        "totals": totals,
        "buyer_cpu_ms": (cpu1 - cpu0) * 1000 / n,
        "provider_cpu_ms": (child1 - child0) * 1000 / n,
    }


async def total_ms(buyer: Peer, request: JobRequest) -> float:
    t0 = time.perf_counter()
    await succeeded(buyer, request)
    return (time.perf_counter() - t0) * 1000


async def serve_provider(home: Path) -> None:
    """The provider process of ``split``: say where it listens, serve until stdin closes."""
    async with open_peer(home) as provider:
        print(provider.net.listen_addrs[0], flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)


async def bare(executor: Executor, rootfs: Path, where: Path) -> float:
    """One bare run --detach/wait/delete of ``COMMAND`` with the executor's runtime, in ms."""

    def once() -> float:
        where.mkdir(mode=0o711)
        try:
            return bare_lifecycle(executor, rootfs, where, executor.runtime.name, 1)
        finally:
            shutil.rmtree(where)

    return await trio.to_thread.run_sync(once)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--bare-runs", type=int, default=20)
    parser.add_argument("--throughput-jobs", type=int, default=48)
    parser.add_argument("--split-jobs", type=int, default=60)
    parser.add_argument("--serve-provider", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.serve_provider is not None:
        trio.run(serve_provider, args.serve_provider)
        return 0
    load_before = os.getloadavg()[0]  # this machine is shared: say how busy it was
    work = Path(tempfile.mkdtemp(prefix="cx-latency-"))
    work.chmod(0o711)  # containers run under a mapped uid: every directory above must be o+x
    try:
        r = trio.run(bench, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load = (load_before, os.getloadavg()[0])
    totals = [j["total"] for j in r["jobs"]]
    p50, p90, p99 = (pct(totals, q) for q in (0.5, 0.9, 0.99))
    mean = statistics.fmean(totals)
    phases = {p: statistics.median(j[p] for j in r["jobs"]) for p in PHASES}
    bare = statistics.median(r["bare"])
    print(
        f"latency benchmark: 1 provider + 1 buyer in one process, libp2p loopback; "
        f"{args.jobs} sequential `{' '.join(COMMAND)}` jobs; cgroup {r['cgroup_mode']}, "
        f"runtime {r['runtime']}; load average {load[0]:.1f} before, {load[1]:.1f} after "
        f"({os.cpu_count()} CPUs)"
    )
    verdict = "met" if p50 < 250 else "NOT met"
    rows = [
        ("first job (image fetch + unpack)", r["first"]["total"], ""),
        ("submit -> result, p50", p50, f"{p50 / bare:.1f}x bare; goal < 250 ms: {verdict}"),
        ("submit -> result, p90", p90, ""),
        ("submit -> result, p99", p99, ""),
        ("submit -> result, mean", mean, ""),
        *((f"  phase {p}, median", phases[p], f"{phases[p] / p50:.0%} of p50") for p in PHASES),
        (
            f"bare {r['runtime']} run -d/wait/delete, median of {len(r['bare'])}",
            bare,
            "baseline, sampled between the jobs",
        ),
    ]
    for name, ms, note in rows:
        print(f"  {name:<50} {ms:8.1f} ms  {note}")
    print(f"  CPU of the one process (both nodes) per job: {r['cpu_ms']:.1f} ms")
    print(f"  throughput, {args.throughput_jobs} jobs: in flight, market jobs/s, executor alone")
    for c, (ours, alone) in r["throughput"].items():
        print(f"  {c:>4} {ours:8.1f} {alone:8.1f}  ({ours / alone:.2f}x)")
    split_figures: dict[str, float] = {}
    if "split" in r:
        sp = r["split"]
        s50, s90, s99 = (pct(sp["totals"], q) for q in (0.5, 0.9, 0.99))
        split_figures = {
            "p50_ms": round(s50, 1),
            "p90_ms": round(s90, 1),
            "p99_ms": round(s99, 1),
            "p50_over_bare": round(s50 / bare, 2),
            "p99_over_bare": round(s99 / bare, 2),
            "buyer_cpu_ms_per_job": round(sp["buyer_cpu_ms"], 1),
            "provider_cpu_ms_per_job": round(sp["provider_cpu_ms"], 1),
        }
        print(f"  provider in a process of its own, {len(sp['totals'])} sequential jobs:")
        print(f"    p50 {s50:.1f} ms ({s50 / bare:.1f}x bare), p90 {s90:.1f}, p99 {s99:.1f} ms "
              f"({s99 / bare:.1f}x bare); CPU per job: buyer {sp['buyer_cpu_ms']:.1f} ms, "
              f"provider {sp['provider_cpu_ms']:.1f} ms")  # fmt: skip
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "runtime": r["runtime"],
                "cgroup_mode": r["cgroup_mode"],
                "first_job_ms": round(r["first"]["total"], 1),
                "p50_ms": round(p50, 1),
                "p90_ms": round(p90, 1),
                "p99_ms": round(p99, 1),
                "mean_ms": round(mean, 1),
                "phase_median_ms": {p: round(v, 1) for p, v in phases.items()},
                "bare_ms": round(bare, 1),
                "p50_over_bare": round(p50 / bare, 2),
                "p99_over_bare": round(p99 / bare, 2),
                "cpu_ms_per_job": round(r["cpu_ms"], 1),
                "split_processes": split_figures,
                "goal_p50_ms": 250,
                "throughput_jobs_per_s": {
                    str(c): {"market": round(ours, 1), "executor": round(alone, 1)}
                    for c, (ours, alone) in r["throughput"].items()
                },
                "load_avg": [round(x, 2) for x in load],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
