"""``cx exec``: run one job locally from the store, exactly as a provider would, no network.

Progress goes to stderr, the result (a table, or ``--json``) to stdout. Exit status: the
job's own exit code when it ran (0 on success), 2 for unusable input (a limit outside
protocol.limits' bounds among it: refused before anything runs), 3 for a provider fault.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from node.cli.common import add_common, cpu, duration_ms, size_bytes
from node.cli.image import resolve_image
from node.exec.executor import CapacityExceeded, Executor, ExecutorConfig, JobResult
from node.storage.image import ImageError, image_command, image_config, import_image
from node.storage.registry import (
    Login,
    RegistryError,
    looks_like_registry_ref,
    parse_ref,
    pull_image,
)
from node.storage.store import BlobStore
from protocol.limits import OutOfBounds, check_limits, check_pids_limit
from protocol.messages import Checkpoint, DataRef, ExitReason, JobSpec, Resources

__all__ = ["local_image", "parse_input", "progress_printer", "register", "run_locally"]

EXIT_INPUT = 2
EXIT_FAULT = 3
# The option a user typed for each field protocol.limits names.
_OPTION = {
    "resources.cpu_milli": "--cpu",
    "resources.memory_bytes": "--memory",
    "resources.disk_bytes": "--disk",
    "job.wall_ms": "--timeout",
    "job.max_output_bytes": "--max-output",
    "job.output_path": "--output-path",
    "checkpoint.path": "--checkpoint-dir",
    "pids_limit": "--pids",
}


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    p = commands.add_parser(
        "exec",
        help="run a job locally in a container with enforced limits",
        description="Run COMMAND in IMAGE (name or digest from cx image ls, or a registry "
        "reference HOST[:PORT]/REPO@sha256:..., pulled and verified; a private registry's "
        "login comes from CX_REGISTRY_USERNAME and CX_REGISTRY_PASSWORD) with the limits "
        "given, then print the exit reason, metered usage and output digests.",
    )
    p.add_argument(
        "image",
        metavar="IMAGE",
        help="a name or digest from cx image ls, or HOST[:PORT]/REPO@sha256:...",
    )
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="command and arguments (options go before IMAGE); default the image's CMD, "
        "after its ENTRYPOINT, as docker run does",
    )
    p.add_argument("--cpu", "--cpus", type=cpu, default=1000,
                   help="cores (1.5) or millicores (500m); default 1")  # fmt: skip
    p.add_argument("-m", "--memory", type=size_bytes, default=256 << 20,
                   help="memory limit, e.g. 512Mi or 1G; default 256Mi")  # fmt: skip
    p.add_argument("--disk", type=size_bytes, default=0,
                   help="scratch disk, the job's /tmp, e.g. 1Gi; default a 64Mi tmpfs")  # fmt: skip
    p.add_argument("--max-output", type=size_bytes, default=64 << 20,
                   help="output area cap, e.g. 100M; default 64Mi")  # fmt: skip
    p.add_argument("--timeout", type=duration_ms, default=3_600_000, metavar="DURATION",
                   help="wall-clock limit, e.g. 30s, 10m, 1.5h (a bare number is seconds); "
                   "default 1h")  # fmt: skip
    p.add_argument("--network", action="store_true", help="allow the network (host's)")
    p.add_argument("-e", "--env", action="append", default=[], metavar="K=V",
                   help="set a variable in the job (repeatable)")  # fmt: skip
    p.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="FILE:/PATH",
        help="store FILE and mount it read-only at /PATH",
    )
    p.add_argument("--output-path", default="/out", help="the job's output directory")
    p.add_argument("--output-dir", type=Path, help="copy the outputs here afterwards")
    p.add_argument("--checkpoint-dir", help="enable checkpoints at this container path")
    p.add_argument("--resume", help="checkpoint digest to resume from")
    p.add_argument("--runtime", choices=["crun", "runc"], help="override the runtime choice")
    p.add_argument("--pids", type=int, default=512, help="pids limit")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_common(p)
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        return trio.run(_exec, args, tuple(command))
    except OutOfBounds as exc:  # say which option
        print(f"cx exec: {_OPTION.get(exc.field, exc.field)}: {exc.why}", file=sys.stderr)
        return EXIT_INPUT
    except (ImageError, RegistryError, CapacityExceeded, ValueError, OSError) as exc:
        print(f"cx exec: {exc}", file=sys.stderr)
        return EXIT_INPUT


async def _exec(args: argparse.Namespace, command: tuple[str, ...]) -> int:
    resources = Resources(cpu_milli=args.cpu, memory_bytes=args.memory, disk_bytes=args.disk)
    store = BlobStore(args.home / "store")
    image = await local_image(args.image, store)
    command = image_command(image_config(store, image), command)  # as docker run does
    spec = _job(args, store, command, image)
    checkpoint = None
    if args.checkpoint_dir or args.resume:
        checkpoint = Checkpoint(path=args.checkpoint_dir or "/checkpoint", resume_from=args.resume)
    check_limits(spec, resources, checkpoint)  # before anything is mounted or started
    check_pids_limit(args.pids)
    executor, result = await run_locally(
        args.home,
        spec,
        resources,
        checkpoint=checkpoint,
        pids_limit=args.pids,
        runtime=args.runtime,
        progress=progress_printer(),
    )
    if args.output_dir is not None:
        _export(executor, result, args.output_path, args.output_dir)
    print(json.dumps(_as_json(result)) if args.json else _table(executor, result))
    if result.exit_reason is ExitReason.PROVIDER_FAULT:
        return EXIT_FAULT
    return 0 if result.exit_reason is ExitReason.SUCCESS else max(1, result.exit_code & 0xFF)


async def local_image(name: str, store: BlobStore) -> str:
    """The manifest digest of IMAGE: pulled from its registry (``HOST/REPO@sha256:...``),
    imported from an OCI layout or archive at that path, or found in the store.

    Raises:
        ImageError, RegistryError: none of those has it.
    """
    if looks_like_registry_ref(name):
        pulled = await pull_image(store, parse_ref(name), login=Login.from_env(os.environ))
        return pulled.manifest
    path = trio.Path(name)
    if not name.startswith("sha256:") and await path.exists():
        imported = await trio.to_thread.run_sync(import_image, store, Path(name))
        return imported.manifest
    return resolve_image(store, name)


def progress_printer() -> Callable[[str], None]:
    """Prints each step of a local job to stderr with the seconds since it began."""
    t0 = time.monotonic()

    def progress(step: str) -> None:
        print(f"[{time.monotonic() - t0:7.3f}s] {step}", file=sys.stderr)

    return progress


async def run_locally(
    home: Path,
    spec: JobSpec,
    resources: Resources,
    *,
    checkpoint: Checkpoint | None = None,
    pids_limit: int = 512,
    runtime: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[Executor, JobResult]:
    """Run one job in an executor of its own over ``home``'s store, as a provider would;
    the executor (closed) is returned for its store.

    Raises:
        OutOfBounds: a limit outside protocol.limits' bounds (nothing ran).
    """
    executor = Executor(
        ExecutorConfig(
            store_root=home / "store",
            work_root=home / "work",
            capacity=resources,
            pids_limit=pids_limit,
            runtime=runtime,
        )
    )
    say = progress or (lambda _step: None)
    try:
        say(f"cgroup {executor.mode.value}, runtime {executor.runtime.describe()}")
        result = await executor.run_job(spec, resources, checkpoint=checkpoint, progress=say)
        say(f"done: {result.exit_reason.value}")
    finally:
        executor.close()
    return executor, result


def parse_input(item: str) -> tuple[Path, str]:
    """``FILE:/PATH`` as (file, container path).

    Raises:
        ValueError: not that form, or FILE is not a file.
    """
    src, sep, dest = item.rpartition(":")
    if not sep or not src or not dest.startswith("/"):
        raise ValueError(f"--input {item!r}: use FILE:/container/path")
    if not Path(src).is_file():
        raise ValueError(f"--input {item!r}: {src} is not a file")
    return Path(src), dest


def _job(
    args: argparse.Namespace, store: BlobStore, command: tuple[str, ...], image: str
) -> JobSpec:
    """The job the flags describe; its inputs are stored."""
    inputs = []
    for item in args.input:
        src, dest = parse_input(item)
        digest = store.put_file(src)
        inputs.append(DataRef(digest=digest, path=dest, size=store.size(digest)))
    return JobSpec(
        image=image,
        command=command,
        env=dict(e.split("=", 1) for e in args.env if "=" in e),
        inputs=tuple(inputs),
        output_path=args.output_path,
        max_output_bytes=args.max_output,
        wall_ms=args.timeout,
        network=args.network,
    )


def _export(executor: Executor, result: JobResult, output_path: str, dest: Path) -> None:
    for ref in result.outputs:
        rel = os.path.relpath(ref.path, output_path)
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(executor.store.path(ref.digest), target)


def _as_json(r: JobResult) -> dict[str, Any]:
    u = r.usage
    return {
        "job_id": r.job_id,
        "exit_reason": r.exit_reason.value,
        "exit_code": r.exit_code,
        "usage": {
            "wall_ms": u.wall_ms,
            "cpu_us": u.cpu_us,
            "memory_peak_bytes": u.memory_peak_bytes,
            "io_read_bytes": u.io_read_bytes,
            "io_write_bytes": u.io_write_bytes,
            "pids_peak": u.pids_peak,
            "oom_kills": u.oom_kills,
            "checkpoint_ms": u.checkpoint_ms,
        },
        "outputs": [{"path": o.path, "digest": o.digest, "size": o.size} for o in r.outputs],
        "checkpoint": r.checkpoint,
        "stdout": r.stdout,
        "stderr": r.stderr,
        "truncated_logs": list(r.truncated_logs),
        "scratch_bytes": r.scratch_bytes,
        "detail": r.detail,
    }


def _table(executor: Executor, r: JobResult) -> str:
    u = r.usage
    rows = [
        ("exit reason", r.exit_reason.value),
        ("exit code", str(r.exit_code)),
        ("wall", f"{u.wall_ms} ms"),
        ("cpu", f"{u.cpu_us / 1000:.1f} ms"),
        ("memory peak", f"{u.memory_peak_bytes / (1 << 20):.1f} MiB"),
        ("io read/write", f"{u.io_read_bytes} / {u.io_write_bytes} bytes"),
        ("pids peak", str(u.pids_peak)),
        ("oom kills", str(u.oom_kills)),
        ("scratch used", f"{r.scratch_bytes / (1 << 20):.1f} MiB"),
    ]
    if r.checkpoint:
        rows.append(("checkpoint", r.checkpoint))
    if r.truncated_logs:
        rows.append(("logs cut at 8 MiB", ", ".join(r.truncated_logs)))
    if r.detail:
        rows.append(("detail", r.detail))
    rows += [(f"output {o.path}", f"{o.digest} ({o.size} bytes)") for o in r.outputs]
    lines = [f"{k:<16} {v}" for k, v in rows]
    for name, digest in (("stdout", r.stdout), ("stderr", r.stderr)):
        if digest:
            text = executor.store.read_bytes(digest).decode(errors="replace")
            tail = text[-2000:]
            lines.append(f"--- {name} ---\n{tail.rstrip()}")
    return "\n".join(lines)
