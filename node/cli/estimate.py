"""``cx estimate``: run a job once locally with generous limits, measure it, and recommend
the resources to bid for, with the expected cost on the market the node sees.

The image may say how to run itself in estimation mode (the ``org.computeexchange.estimate``
label, protocol/estimate.py): another command, and a sample of each input to run on; the
measured run is then scaled to the full inputs. ``cx run --estimate`` calls :func:`measure`
and bids with the recommendation. Exit status: 0 a recommendation, 2 unusable input or a
run that did not succeed (its reason is printed), 3 a provider fault on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from node.api.client import ApiClient, ClientError
from node.api.common import ApiError
from node.cli.common import add_common, cpu, credits, duration_ms, size_bytes
from node.cli.exec import local_image, parse_input, progress_printer, run_locally
from node.exec.executor import CapacityExceeded, JobResult
from node.storage.image import ImageError, image_config
from node.storage.registry import RegistryError
from node.storage.store import BlobStore
from protocol.estimate import (
    ESTIMATE_LABEL,
    BadEstimateLabel,
    EstimateRule,
    Observed,
    Recommendation,
    parse_estimate_label,
    recommend,
)
from protocol.limits import OutOfBounds
from protocol.messages import DataRef, ExitReason, JobSpec, Prices, Resources
from protocol.units import size as format_bytes

__all__ = ["Estimate", "EstimateFailed", "MarketPrices", "market_prices", "measure", "register"]

EXIT_INPUT = 2
EXIT_FAULT = 3
GIB = 1 << 30
# Generous limits for the measured run: the run must not be cut short by them.
DEFAULT_MEMORY = 4 * GIB
DEFAULT_DISK = 1 * GIB
DEFAULT_TIMEOUT_MS = 600_000


class EstimateFailed(Exception):
    """The measured run did not succeed, so it says nothing about what the job needs."""

    def __init__(self, result: JobResult, hint: str) -> None:
        detail = f" ({result.detail})" if result.detail else ""
        super().__init__(
            f"the measured run ended {result.exit_reason.value} (exit code "
            f"{result.exit_code}){detail}: {hint}"
        )
        self.result = result


@dataclass(frozen=True, slots=True, kw_only=True)
class MarketPrices:
    """The prices an estimate is costed at: the best CPU price on offer (``where``, its
    resource class) and the memory price of the latest trade (0 when none was seen)."""

    prices: Prices
    where: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    image: str
    command: tuple[str, ...]  # what ran
    rule: EstimateRule
    from_label: bool
    observed: Observed
    full_input_bytes: int
    sampled_input_bytes: int
    recommendation: Recommendation


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    p = commands.add_parser(
        "estimate",
        help="measure a job locally and recommend the resources to bid for",
        description="Run COMMAND in IMAGE once on this machine with generous limits (or the "
        f"image's own estimation command, from its {ESTIMATE_LABEL} label, on a sample of "
        "the inputs), measure peak memory, CPU time, I/O, scratch and wall time, and "
        "recommend --cpu, --memory, --disk and --timeout with headroom, with the expected "
        "cost at the best prices the running node sees (if one is running).",
        epilog="example: cx estimate --input data.csv:/in/data.csv busybox -- "
        "sh -c 'sort /in/data.csv > /out/sorted'",
    )
    p.add_argument("image", metavar="IMAGE", help="name or digest in the store, OCI path, or "
                   "HOST[:PORT]/REPO@sha256:...")  # fmt: skip
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="what to run in IMAGE (default the image's CMD)")  # fmt: skip
    p.add_argument("--input", action="append", default=[], metavar="FILE:/PATH",
                   help="make FILE readable at /PATH in the job (repeatable)")  # fmt: skip
    p.add_argument("-e", "--env", action="append", default=[], metavar="K=V",
                   help="set a variable in the job (repeatable)")  # fmt: skip
    p.add_argument("--cpu", type=cpu, default=(os.cpu_count() or 1) * 1000,
                   help="the run's CPU limit; default every core")  # fmt: skip
    p.add_argument("--memory", type=size_bytes, default=DEFAULT_MEMORY,
                   help="the run's memory limit; default 4G")  # fmt: skip
    p.add_argument("--disk", type=size_bytes, default=DEFAULT_DISK,
                   help="the run's scratch /tmp; default 1G")  # fmt: skip
    p.add_argument("--timeout", type=duration_ms, default=DEFAULT_TIMEOUT_MS,
                   help="the run's wall-clock limit; default 10m")  # fmt: skip
    add_common(p, json_help="print the estimate as JSON (bytes, ms, micro-credits)")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    command = tuple(args.command[1:] if args.command[:1] == ["--"] else args.command)
    try:
        inputs = [parse_input(item) for item in args.input]
        env = dict(e.split("=", 1) for e in args.env if "=" in e)
        limits = Resources(cpu_milli=args.cpu, memory_bytes=args.memory, disk_bytes=args.disk)
        estimate = trio.run(
            lambda: measure(
                args.home,
                args.image,
                command,
                inputs,
                limits=limits,
                wall_ms=args.timeout,
                env=env,
                progress=progress_printer(),
            )
        )
    except OutOfBounds as exc:
        print(f"cx estimate: --{exc.field.rpartition('_')[0].rpartition('.')[2]}: {exc.why}",
              file=sys.stderr)  # fmt: skip
        return EXIT_INPUT
    except EstimateFailed as exc:
        print(f"cx estimate: {exc}", file=sys.stderr)
        reason = exc.result.exit_reason
        return EXIT_FAULT if reason is ExitReason.PROVIDER_FAULT else EXIT_INPUT
    except (BadEstimateLabel, ImageError, RegistryError, CapacityExceeded, ValueError,
            OSError) as exc:  # fmt: skip
        print(f"cx estimate: {exc}", file=sys.stderr)
        return EXIT_INPUT
    market = market_prices(args.home)
    if args.json:
        print(json.dumps(as_json(estimate, market), indent=2, sort_keys=True))
    else:
        print(render(estimate, market))
    return 0


async def measure(
    home: Path,
    image: str,
    command: Sequence[str],
    inputs: Sequence[tuple[Path, str]],
    *,
    limits: Resources,
    wall_ms: int = DEFAULT_TIMEOUT_MS,
    env: dict[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Estimate:
    """Run the job (or its image's estimation command on a sample of ``inputs``) within
    ``limits`` and recommend resources from what it used.

    Raises:
        BadEstimateLabel: the image's label is unusable.
        ValueError: no command to run (none given, none in the label).
        EstimateFailed: the run did not succeed.
        ImageError, RegistryError, OutOfBounds, OSError: as ``cx exec``.
    """
    store = BlobStore(home / "store")
    digest = await local_image(image, store)
    labels = image_config(store, digest).get("Labels") or {}
    label = labels.get(ESTIMATE_LABEL) if isinstance(labels, dict) else None
    rule = parse_estimate_label(label) if isinstance(label, str) else EstimateRule()
    run = rule.command or tuple(command)
    if not run:
        raise ValueError("give a command after IMAGE, e.g. cx estimate busybox -- echo hi")
    refs, full, sampled = await trio.to_thread.run_sync(
        _store_inputs, store, inputs, rule.sample_bytes
    )
    spec = JobSpec(image=digest, command=run, env=env or {}, inputs=refs, wall_ms=wall_ms)
    _, result = await run_locally(home, spec, limits, progress=progress)
    if result.exit_reason is not ExitReason.SUCCESS:
        raise EstimateFailed(result, _hint(result.exit_reason))
    usage = result.usage
    observed = Observed(
        wall_ms=usage.wall_ms,
        cpu_us=usage.cpu_us,
        memory_peak_bytes=usage.memory_peak_bytes,
        io_read_bytes=usage.io_read_bytes,
        io_write_bytes=usage.io_write_bytes,
        scratch_bytes=result.scratch_bytes,
    )
    return Estimate(
        image=digest,
        command=run,
        rule=rule,
        from_label=label is not None,
        observed=observed,
        full_input_bytes=full,
        sampled_input_bytes=sampled,
        recommendation=recommend(
            observed,
            full_input_bytes=full,
            sampled_input_bytes=sampled,
            memory_scales=rule.memory_scales,
        ),
    )


def _hint(reason: ExitReason) -> str:
    return {
        ExitReason.OOM: "give it more --memory",
        ExitReason.TIMEOUT: "give it a longer --timeout",
        ExitReason.OUTPUT_TOO_LARGE: "it wrote more output than allowed",
        ExitReason.PIDS_EXHAUSTED: "it started more processes than allowed",
        ExitReason.PROVIDER_FAULT: "this machine could not run it",
    }.get(reason, "fix the job first (see cx exec)")


def _store_inputs(
    store: BlobStore, inputs: Sequence[tuple[Path, str]], sample_bytes: int | None
) -> tuple[tuple[DataRef, ...], int, int]:
    """Each input stored whole, or its first ``sample_bytes``; (refs, full, sampled bytes)."""
    refs, full, sampled = [], 0, 0
    for src, dest in inputs:
        size = src.stat().st_size
        with src.open("rb") as f:
            data = f.read(sample_bytes) if sample_bytes is not None else None
        digest = store.put_file(src) if data is None else store.put_bytes(data)
        part = store.size(digest)
        refs.append(DataRef(digest=digest, path=dest, size=part))
        full, sampled = full + size, sampled + part
    return tuple(refs), full, sampled


def market_prices(home: Path) -> MarketPrices | None:
    """The best prices the node at ``home`` sees; None when no node answers or nothing is
    on offer."""
    try:
        market = ApiClient.from_home(home).market()
    except (ClientError, ApiError):
        return None
    offered = [c for c in market.get("classes") or [] if c.get("best_cpu_core_hour") is not None]
    if not offered:
        return None
    best = min(offered, key=lambda c: int(c["best_cpu_core_hour"]))
    trades = market.get("recent_trades") or []
    memory = int(trades[-1].get("memory_gib_hour") or 0) if trades else 0
    prices = Prices(cpu_core_hour=int(best["best_cpu_core_hour"]), memory_gib_hour=memory)
    return MarketPrices(prices=prices, where=str(best["class"]))


def flags(rec: Recommendation) -> str:
    """The recommendation as ``cx run`` options."""
    r = rec.resources
    cores = f"{r.cpu_milli // 1000}" if r.cpu_milli % 1000 == 0 else f"{r.cpu_milli}m"
    out = f"--cpu {cores} --memory {r.memory_bytes >> 20}M --timeout {rec.wall_ms // 1000}s"
    return out + (f" --disk {r.disk_bytes >> 20}M" if r.disk_bytes else "")


def as_json(e: Estimate, market: MarketPrices | None) -> dict[str, Any]:
    rec = e.recommendation
    return {
        "image": e.image,
        "command": list(e.command),
        "from_label": e.from_label,
        "sample_bytes": e.rule.sample_bytes,
        "input_bytes": e.full_input_bytes,
        "sampled_input_bytes": e.sampled_input_bytes,
        "scale": str(rec.scale),
        "observed": {
            "wall_ms": e.observed.wall_ms,
            "cpu_us": e.observed.cpu_us,
            "memory_peak_bytes": e.observed.memory_peak_bytes,
            "io_read_bytes": e.observed.io_read_bytes,
            "io_write_bytes": e.observed.io_write_bytes,
            "scratch_bytes": e.observed.scratch_bytes,
        },
        "expected": {
            "wall_ms": rec.expected.wall_ms,
            "cpu_us": rec.expected.cpu_us,
            "memory_peak_bytes": rec.expected.memory_peak_bytes,
        },
        "recommended": {
            "cpu_milli": rec.resources.cpu_milli,
            "memory_bytes": rec.resources.memory_bytes,
            "disk_bytes": rec.resources.disk_bytes,
            "wall_ms": rec.wall_ms,
            "flags": flags(rec),
        },
        "market": None
        if market is None
        else {
            "class": market.where,
            "cpu_core_hour": market.prices.cpu_core_hour,
            "memory_gib_hour": market.prices.memory_gib_hour,
            "expected_cost": rec.expected_cost(market.prices),
            "max_cost": rec.worst_cost(market.prices),
        },
    }


def render(e: Estimate, market: MarketPrices | None) -> str:
    rec, seen = e.recommendation, e.observed
    how = f"the image's {ESTIMATE_LABEL} label" if e.from_label else "the job's own command"
    if rec.scale != 1:
        how += (
            f", on {format_bytes(e.sampled_input_bytes)} of {format_bytes(e.full_input_bytes)}"
            f" of input (x{float(rec.scale):.3g})"
        )
    rows = [
        ("measured with", how),
        ("ran", shlex.join(e.command)),
        (
            "measured",
            f"wall {seen.wall_ms / 1000:.2f} s, cpu {seen.cpu_us / 1e6:.2f} s, memory peak "
            f"{format_bytes(seen.memory_peak_bytes)}, scratch "
            f"{format_bytes(seen.scratch_bytes)}, io {format_bytes(seen.io_read_bytes)} "
            f"read / {format_bytes(seen.io_write_bytes)} written",
        ),
        (
            "expected",
            f"wall {rec.expected.wall_ms / 1000:.2f} s, cpu {rec.expected.cpu_us / 1e6:.2f} s, "
            f"memory peak {format_bytes(rec.expected.memory_peak_bytes)}",
        ),
        ("recommended", flags(rec)),
    ]
    if market is None:
        rows.append(("market", "no node running or nothing on offer: no expected cost"))
    else:
        p = market.prices
        rows += [
            (
                "market",
                f"{credits(p.cpu_core_hour)}/core-h ({market.where}), "
                f"{credits(p.memory_gib_hour)}/GiB-h memory",
            ),
            (
                "expected cost",
                f"{credits(rec.expected_cost(p))} credits (the bid's worst case "
                f"{credits(rec.worst_cost(p))})",
            ),
        ]
    return "\n".join(f"{k:<14} {v}" for k, v in rows)
