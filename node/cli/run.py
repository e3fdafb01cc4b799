"""``cx run``: submit a job to the market through the running node and follow it, as
``docker run`` does for a local container.

The request goes to the node's control API (node/api/server.py); the node bids, negotiates,
transfers and collects. Progress (each state the job enters) goes to stderr, the job's own
stdout to stdout once it has ended. Exit status: see ``_EPILOG``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import trio

from node.api.client import ApiClient, ClientError
from node.api.common import ApiError
from node.cli.common import (
    EXIT_NO_NODE,
    add_common,
    client,
    cpu,
    credits,
    duration_ms,
    parse_credits,
    print_json,
    short_peer,
    size_bytes,
    talk,
)
from node.cli.data_site import add_data_flags, data_fields
from node.cli.estimate import (
    DEFAULT_DISK,
    DEFAULT_MEMORY,
    DEFAULT_TIMEOUT_MS,
    EstimateFailed,
    flags,
    measure,
)
from node.cli.exec import progress_printer
from node.cli.image import resolve_image
from node.market.buyer import FINAL_STATES
from node.market.request import JobRequest, RequestError, build_request
from node.storage.fetching import FetchError
from node.storage.image import ImageError, image_command, image_config, import_image
from node.storage.objects import S3Keys, hash_object
from node.storage.registry import Login, RegistryError, looks_like_registry_ref
from node.storage.store import BlobStore
from protocol.estimate import BadEstimateLabel
from protocol.limits import OutOfBounds
from protocol.messages import Resources

__all__ = ["Unusable", "exit_status", "register", "request_image"]

EXIT_NEVER_RAN = 2
EXIT_CX = EXIT_NO_NODE  # and every other failure of cx's own, as docker run
_POLL_S = 30.0
_HINT_S = 5.0
_UNMATCHED = ("waiting", "negotiating")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")

_EPILOG = """\
examples:
  cx run --max-price 1.5 busybox -- echo hello
  cx run --cpu 0.5 --memory 128Mi --timeout 10m --max-price 2 \\
         --input data.csv:/in/data.csv --output ./out \\
         busybox -- sh -c 'wc -l < /in/data.csv > /out/count'
  cx run --detach --name train --preemptible --checkpoint-path /ckpt \\
         --gpus 1 --max-price 1 --max-gpu-price 40 ./trainer-oci -- python train.py
  cx run --wait-match 2m --region eu-west --trust sev-snp --max-price 5 sha256:4f1c... -- true
  cx run --max-price 1 --input s3://data/run1/:/in --output-to s3://data/out/ \\
         registry.example:5000/team/app@sha256:0315... -- sh -c 'wc -l /in/* > /out/n'
  cx run --estimate --max-price 1 --input data.csv:/in/data.csv busybox -- sort /in/data.csv
  cx run --memory 1G --elastic-memory 8G --elastic-cpu 16 --max-price 1 app -- ./train

IMAGE is a manifest digest (sha256:...), a name or digest prefix from `cx image ls` in the
node's store, the path of an OCI layout directory or archive, which cx run imports into the
node's store, or a registry image pinned by digest, HOST[:PORT]/REPO@sha256:..., which the
provider pulls. Without COMMAND the image's CMD runs; its ENTRYPOINT comes first either way,
as with docker run (a registry image needs COMMAND: only the provider reads its config).
A private registry's login comes from CX_REGISTRY_USERNAME and CX_REGISTRY_PASSWORD, S3
keys from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN); they go sealed to
the provider that runs the job, and nowhere else.
Put options before IMAGE; everything after it (and after an optional --) is the command.

Prices are credits. --max-price caps the price per core-hour of CPU time; memory and disk
are priced per GiB-hour of the reservation and their caps default to the --max-price
figure; --max-gpu-price (per GPU-hour) is required with --gpus. See `cx market` for what
offers ask.

exit status:
  0    the job succeeded (with --detach: it was submitted; its id is printed)
  N    the job exited with code N of its own
  1    it failed otherwise (out of memory, timed out, too many processes, output too
       large, bad input, provider fault), whatever signal ended it
  2    it never ran: not matched within --wait-match (it is then cancelled), or cancelled
       (2 is also argparse's status for a malformed command line)
  125  cx could not submit or follow it: no node running, request refused, bad option
Interrupting cx run (Ctrl-C) leaves the job to the node: `cx cancel JOB` stops it.
"""


_DEFAULTS = {"cpu": 1000, "memory": 256 << 20, "disk": 0, "timeout": 3_600_000}
# The measured run of --estimate: limits that should not cut it short (as cx estimate's).
_ESTIMATE_DEFAULTS = {
    "cpu": (os.cpu_count() or 1) * 1000,
    "memory": DEFAULT_MEMORY,
    "disk": DEFAULT_DISK,
    "timeout": DEFAULT_TIMEOUT_MS,
}


class Unusable(Exception):
    """An option value cx cannot turn into a request; the message says what to do."""


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    p = commands.add_parser(
        "run",
        help="run a job on the market: bid, match, run remotely, fetch the result",
        description="Submit COMMAND in IMAGE to the market through the running node (`cx node`),\n"
        "follow it until it ends, then print its output.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("image", metavar="IMAGE", help="digest, name in the store, or OCI path")
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ...",
        help="what to run in it; default the image's CMD, after its ENTRYPOINT (docker's rule)",
    )
    need = p.add_argument_group("resources")
    need.add_argument("--cpu", "--cpus", type=cpu, help="cores (0.5, 2) or 500m; default 1")
    need.add_argument(
        "-m",
        "--memory",
        type=size_bytes,
        help="memory, e.g. 512Mi or 1G (SI or binary suffixes); default 256Mi",
    )
    need.add_argument(
        "--disk", type=size_bytes, help="scratch disk (the job's /tmp), e.g. 1Gi; default 0"
    )
    need.add_argument("--gpus", type=int, default=0, help="number of GPUs; default 0")
    need.add_argument(
        "--elastic-memory",
        type=size_bytes,
        default=0,
        metavar="CEILING",
        help="let the provider raise the memory limit while it runs, up to CEILING (e.g. 4G)",
    )
    need.add_argument(
        "--elastic-cpu",
        type=cpu,
        default=0,
        metavar="CEILING",
        help="let the job ask for more CPU while it runs (writing `cpu N` to /cx/request), "
        "up to CEILING cores",
    )
    need.add_argument(
        "--timeout",
        type=duration_ms,
        metavar="DURATION",
        help="wall-clock limit of the job, e.g. 30s, 10m, 1.5h (a bare number is seconds); "
        "default 1h",
    )
    money = p.add_argument_group("prices (credits)")
    money.add_argument(
        "--max-price",
        type=parse_credits,
        metavar="CREDITS",
        help="required: the most you pay per core-hour of CPU time",
    )
    money.add_argument(
        "--max-memory-price",
        type=parse_credits,
        metavar="CREDITS",
        help="per GiB-hour of memory; default: the --max-price figure",
    )
    money.add_argument(
        "--max-disk-price",
        type=parse_credits,
        metavar="CREDITS",
        help="per GiB-hour of disk; default: the --max-price figure",
    )
    money.add_argument(
        "--max-gpu-price",
        type=parse_credits,
        metavar="CREDITS",
        help="per GPU-hour; required with --gpus",
    )
    money.add_argument(
        "--per-work",
        type=parse_credits,
        metavar="CREDITS",
        help="also the most you pay per unit of work (a GiB hashed on one core: offers "
        "state their cores' score, `cx market` shows the price per unit); only offers "
        "with a score fit",
    )
    money.add_argument(
        "--deadline",
        type=duration_ms,
        metavar="DURATION",
        help="trade within this long, e.g. 10m: the bid starts at half the maximum prices "
        "and rises in four steps to them by the deadline; `cx why` shows the limit now",
    )
    where = p.add_argument_group("where it may run")
    where.add_argument("--arch", help="CPU architecture, e.g. amd64 or arm64; default any")
    where.add_argument(
        "--provider", metavar="PEER", help="only this provider's offers (its peer id); default any"
    )
    where.add_argument(
        "--region", action="append", default=[], help="acceptable region (repeatable)"
    )
    where.add_argument("--cpu-model", metavar="TEXT", help="a CPU model containing TEXT, e.g. EPYC")
    where.add_argument(
        "--cpu-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="a CPU feature flag the machine must have, as /proc/cpuinfo spells it, e.g. "
        "avx512f (repeatable)",
    )
    where.add_argument("--min-kernel", metavar="VERSION", help="the least kernel release, e.g. 6.1")
    where.add_argument(
        "--trust",
        choices=("none", "tpm", "sev-snp"),
        default="none",
        help="attestation the provider must give; default none",
    )
    where.add_argument(
        "--min-reputation",
        type=int,
        default=0,
        metavar="PPM",
        help="the least reputation the provider must have with this node, in parts per million"
        " of its trust (see `cx peers`); default 0: any provider",
    )
    add_data_flags(p)
    job = p.add_argument_group("the job")
    job.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="SOURCE:/PATH",
        help="make SOURCE readable at /PATH in the job (repeatable): a local file, or a URL "
        "(https://..., s3://bucket/key, or s3://bucket/prefix/ for every object under it, "
        "placed under /PATH); the node pins each by its sha256",
    )
    job.add_argument(
        "--output-to",
        metavar="s3://BUCKET/PREFIX/",
        help="upload the job's outputs under this prefix (the node's [s3] endpoint)",
    )
    job.add_argument(
        "-e",
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="set a variable in the job (repeatable)",
    )
    job.add_argument(
        "--preemptible", action="store_true", help="accept cheaper capacity that may be reclaimed"
    )
    job.add_argument(
        "--checkpoint-path",
        metavar="/PATH",
        help="directory in the job that it checkpoints to, for resuming elsewhere",
    )
    job.add_argument("--name", help="a name to recognise the job by in `cx jobs`")
    job.add_argument(
        "--estimate",
        action="store_true",
        help="first run it once here, as `cx estimate` does, and bid for the resources it "
        "recommends (--cpu, --memory, --disk and --timeout are then the limits of that run, "
        "by default as generous as cx estimate's)",
    )
    follow = p.add_argument_group("following it")
    follow.add_argument(
        "--output",
        type=Path,
        metavar="DIR",
        help="when it has ended, fetch its output files into DIR",
    )
    follow.add_argument(
        "-d", "--detach", action="store_true", help="print the job id and return at once"
    )
    follow.add_argument(
        "--wait-match",
        type=duration_ms,
        metavar="DURATION",
        help="cancel the job if no provider takes it within DURATION; default: wait",
    )
    add_common(
        p,
        json_help="print the job as JSON on stdout when it has ended (with --detach: as "
        "submitted) instead of its output; progress stays on stderr",
    )
    p.set_defaults(run=_run)

    wait = commands.add_parser(
        "wait",
        aliases=["attach"],
        help="follow a job until it ends, as cx run does (after --detach or Ctrl-C)",
        description="Follow JOB's progress until it ends, then print its output and exit with "
        "its status, as cx run does: the way back to a job left with --detach or Ctrl-C.",
        epilog="exit status: as cx run's (`cx run --help`)",
    )
    wait.add_argument(
        "job", metavar="JOB", help="a job id, or a prefix of one that names one job (see cx jobs)"
    )
    wait.add_argument(
        "--output",
        type=Path,
        metavar="DIR",
        help="when it has ended, fetch its output files into DIR",
    )
    add_common(wait, json_help="print the job as JSON when it has ended instead of its output")
    wait.set_defaults(run=talk("cx wait", _wait, refused=EXIT_CX, no_node=EXIT_CX))


def _wait(args: argparse.Namespace) -> int:
    api = client(args)
    return _follow(api, api.job(args.job), args)


def _run(args: argparse.Namespace) -> int:
    try:
        api = client(args)  # first: no node (or no home) is the first thing to say
        request = _request(args)
        job = api.submit(request)
    except Unusable as exc:
        print(f"cx run: {exc}", file=sys.stderr)
        return EXIT_CX
    except ApiError as exc:
        print(f"cx run: the node refused the job: {exc.message}", file=sys.stderr)
        return EXIT_CX
    except ClientError as exc:
        print(f"cx run: {exc}", file=sys.stderr)
        return EXIT_CX
    if args.detach:
        if args.json:
            print_json(job)
        else:
            print(job["id"])
        return 0
    try:
        return _follow(api, job, args)
    except KeyboardInterrupt:
        print(
            f"\ncx run: job {job['id']} goes on at the node; `cx cancel {job['id']}` stops it",
            file=sys.stderr,
        )
        return 130
    except (ApiError, ClientError) as exc:
        print(f"cx run: lost track of job {job['id']}: {exc}", file=sys.stderr)
        return EXIT_CX


def _request(args: argparse.Namespace) -> JobRequest:
    """The job request for the API from the command line, checked as the node checks it.

    Raises:
        Unusable: an option cannot be used as given.
    """
    if args.max_price is None:
        raise Unusable(
            "give --max-price, the most you pay per core-hour in credits (e.g. --max-price "
            "1.5); `cx market` shows what offers ask"
        )
    if args.gpus and args.max_gpu_price is None:
        raise Unusable("give --max-gpu-price (credits per GPU-hour) with --gpus")
    if args.gpus < 0:
        raise Unusable("--gpus cannot be negative")
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise Unusable(f"--env {item!r}: use NAME=VALUE")
        env[key] = value
    if args.checkpoint_path is not None and not args.checkpoint_path.startswith("/"):
        raise Unusable("--checkpoint-path must be an absolute path in the container")
    same = args.max_price
    inputs = [_input(item) for item in args.input]
    image = request_image(args.image, args.home)
    given = args.command[1:] if args.command[:1] == ["--"] else args.command
    command = _command(image, given, args.home)
    defaults = _ESTIMATE_DEFAULTS if args.estimate else _DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.estimate:
        _estimate(args, command, inputs, env)
    fields = {
        "image": image,
        "command": command,
        "env": env,
        "cpu_milli": args.cpu,
        "memory_bytes": args.memory,
        "disk_bytes": args.disk,
        "gpus": args.gpus,
        "elastic_memory_bytes": args.elastic_memory,
        "elastic_cpu_milli": args.elastic_cpu,
        "wall_ms": args.timeout,
        "max_prices": {
            "cpu_core_hour": args.max_price,
            "memory_gib_hour": same if args.max_memory_price is None else args.max_memory_price,
            "disk_gib_hour": same if args.max_disk_price is None else args.max_disk_price,
            "gpu_hour": args.max_gpu_price or 0,
        },
        "arch": args.arch,
        "regions": args.region,
        "trust": args.trust,
        "min_reputation": args.min_reputation,
        "cpu_model": args.cpu_model,
        "cpu_flags": args.cpu_flag,
        "min_kernel": args.min_kernel,
        "inputs": inputs,
        "preemptible": args.preemptible,
        "checkpoint_path": args.checkpoint_path,
        "name": args.name,
        "deadline_ms": args.deadline,
        "max_work_price": args.per_work,
        "provider": args.provider,
        "output_to": args.output_to,
        "credentials": _credentials(args.image, inputs, args.output_to),
        **data_fields(args),
    }
    try:
        return build_request(**fields)
    except RequestError as exc:
        raise Unusable(str(exc)) from None


def _estimate(
    args: argparse.Namespace,
    command: list[str],
    inputs: list[dict[str, Any]],
    env: dict[str, str],
) -> None:
    """Measure the job here and put the recommended resources into ``args``.

    Raises:
        Unusable: a URL input (estimation reads local files only), or the run failed.
    """
    urls = [i["url"] for i in inputs if "url" in i]
    if urls:
        raise Unusable(
            f"--estimate runs the job here on local --input files only, not {urls[0]}; "
            "estimate with a local sample (cx estimate) and give --cpu and --memory"
        )
    files = [(Path(i["file"]), i["path"]) for i in inputs]
    limits = Resources(cpu_milli=args.cpu, memory_bytes=args.memory, disk_bytes=args.disk)
    try:
        found = trio.run(
            partial(
                measure,
                args.home,
                args.image,
                command,
                files,
                limits=limits,
                wall_ms=args.timeout,
                env=env,
                progress=progress_printer(),
            )
        )
    except (EstimateFailed, BadEstimateLabel, OutOfBounds, ImageError, RegistryError,
            ValueError, OSError) as exc:  # fmt: skip
        raise Unusable(f"--estimate: {exc}") from None
    rec = found.recommendation
    args.cpu, args.memory = rec.resources.cpu_milli, rec.resources.memory_bytes
    args.disk, args.timeout = rec.resources.disk_bytes, rec.wall_ms
    print(f"cx run: estimated {flags(rec)}", file=sys.stderr)


def _command(image: str, given: list[str], home: Path) -> list[str]:
    """What the job runs, as ``docker run`` decides it: the image's ENTRYPOINT, then the
    command given or else the image's CMD. A registry image's config is known only to the
    provider that pulls it: there, the command given is all of it.

    Raises:
        Unusable: nothing to run.
    """
    store = BlobStore(home / "store")
    if not _DIGEST.fullmatch(image) or not store.has(image):
        if not given:
            raise Unusable(
                "give a command after IMAGE, e.g. cx run busybox -- echo hello (the "
                "image's CMD is known only for an image in the node's store or a path)"
            )
        return given
    try:
        return list(image_command(image_config(store, image), given))
    except ImageError as exc:
        raise Unusable(str(exc)) from None


def _credentials(
    image: str, inputs: list[dict[str, Any]], output_to: str | None
) -> dict[str, Any] | None:
    """The registry login and S3 keys the job needs, from the environment (never argv)."""
    found: dict[str, Any] = {}
    login = Login.from_env(os.environ)
    if login is not None and looks_like_registry_ref(image):
        found["registry"] = dataclasses.asdict(login)
    keys = S3Keys.from_env(os.environ)
    uses_s3 = output_to is not None or any(i.get("url", "").startswith("s3://") for i in inputs)
    if keys is not None and uses_s3:
        found["s3"] = {k: v for k, v in dataclasses.asdict(keys).items() if v is not None}
    return found or None


def _input(item: str) -> dict[str, Any]:
    local, sep, dest = item.rpartition(":")
    if not sep or not local or not dest.startswith("/"):
        raise Unusable(f"--input {item!r}: use LOCAL_FILE:/path/in/job or URL:/path/in/job")
    if local.startswith(("http://", "https://")):
        # The node reads only its own S3 endpoint: pin a web URL here, on the user's machine.
        try:
            digest, size = trio.run(partial(hash_object, local, now=datetime.now(UTC)))
        except FetchError as exc:
            raise Unusable(f"--input {item!r}: {exc}") from None
        return {"path": dest, "url": local, "digest": digest, "size": size}
    if "://" in local:
        return {"path": dest, "url": local}
    path = Path(local)
    if not path.is_file():
        raise Unusable(f"--input {item!r}: {local} is not a file")
    return {"path": dest, "file": str(path.resolve())}


def request_image(name: str, home: Path) -> str:
    """A digest or absolute path the node can use for ``name``.

    Raises:
        Unusable: ``name`` is none of a digest, a path, or an image in the node's store.
    """
    if _DIGEST.fullmatch(name) or looks_like_registry_ref(name):
        return name  # a registry image is checked with the request, and pulled by the provider
    path = Path(name)
    if path.exists():
        # Imported here, as the node would, so that its CMD and ENTRYPOINT are known.
        try:
            return import_image(BlobStore(home / "store"), path).manifest
        except ImageError as exc:
            raise Unusable(str(exc)) from None
    store = home / "store"
    if (store / "images").is_dir():
        try:
            return resolve_image(BlobStore(store), name)
        except ImageError as exc:
            raise Unusable(str(exc)) from None
        except OSError as exc:
            raise Unusable(f"cannot read the image store {store} ({exc}); give IMAGE as "
                            "sha256:... or a path") from None  # fmt: skip
    raise Unusable(
        f"{name!r} is not a digest, a path, or an image in {store}; import it with "
        "`cx image import` or give sha256:..."
    )


def _follow(api: ApiClient, job: dict[str, Any], args: argparse.Namespace) -> int:
    """Show the job's states until it ends; print its logs, fetch outputs; its status."""
    job_id = job["id"]
    if job["state"] == "waiting" and not job.get("attempts"):
        print(f"cx run: job {job_id} submitted", file=sys.stderr)
    wait_match = getattr(args, "wait_match", None)
    deadline = None if wait_match is None else time.monotonic() + wait_match / 1000
    state, after, since = job["state"], 0, time.monotonic()
    while state not in FINAL_STATES:
        # While it waits for a match, a line every _HINT_S says how long and why.
        wait_s = _HINT_S if state in _UNMATCHED else _POLL_S
        if deadline is not None and state in _UNMATCHED:
            left = deadline - time.monotonic()
            if left > 0:
                wait_s = min(wait_s, left)
            elif _give_up(api, job_id):
                return EXIT_NEVER_RAN
            else:
                deadline = None  # it matched meanwhile: follow it to the end
        events = api.events(job_id, after, wait_s)
        for event in events:
            after = max(after, event["seq"])
            state = event["state"]
            _show(event)
        if not events and state in _UNMATCHED and wait_s >= _HINT_S:  # a whole quiet spell
            _hint(api, job_id, time.monotonic() - since)
    job = api.job(job_id)
    if getattr(args, "json", False):
        print_json(job)
    elif job.get("exit_reason") is not None:
        _print_logs(api, job_id)
    if args.output is not None and job.get("outputs"):
        args.output.mkdir(parents=True, exist_ok=True)
        files = api.outputs(job_id, args.output)
        here = [f for f in files if "file" in f]
        print(f"cx run: {len(here)} output file(s) in {args.output}", file=sys.stderr)
        if uploaded := len(files) - len(here):
            where = getattr(args, "output_to", None) or "the job's output prefix"
            print(f"cx run: {uploaded} output(s) uploaded under {where}", file=sys.stderr)
    print(f"cx run: {_summary(job)}", file=sys.stderr)
    return exit_status(job)


def _give_up(api: ApiClient, job_id: str) -> bool:
    """Cancel an unmatched job, saying why nothing took it; False when it matched
    meanwhile (409) and runs on."""
    why = api.why(job_id).get("explanation")  # asked first: the bid is withdrawn after
    try:
        api.cancel(job_id, waiting_only=True)  # one that matched meanwhile runs on
    except ApiError as exc:
        if exc.status == 409:
            return False
        raise
    print(f"cx run: no provider took job {job_id} in time; cancelled it", file=sys.stderr)
    if why:
        print(f"cx run: {why}", file=sys.stderr)
    return True


def _hint(api: ApiClient, job_id: str, waited_s: float) -> None:
    """How long the job has waited, and why nothing has taken it (cx why's sentence)."""
    why = api.why(job_id)
    clock = time.strftime("%H:%M:%S")
    said = why.get("explanation") or f"{why.get('offers_seen', 0)} offer(s) seen"
    print(f"  {clock} {'waiting':<14} {waited_s:.0f}s so far: {said}", file=sys.stderr)


def _show(event: dict[str, Any]) -> None:
    clock = time.strftime("%H:%M:%S", time.localtime(event["at_ms"] / 1000))
    detail = event.get("detail") or ""
    print(f"  {clock} {event['state']:<14} {detail}".rstrip(), file=sys.stderr)


def _print_logs(api: ApiClient, job_id: str) -> None:
    try:
        logs = api.logs(job_id)
    except ApiError as exc:
        print(f"cx run: no logs: {exc.message}", file=sys.stderr)
        return
    sys.stderr.write(logs.get("stderr", ""))
    sys.stderr.flush()
    sys.stdout.write(logs.get("stdout", ""))
    sys.stdout.flush()


def _summary(job: dict[str, Any]) -> str:
    exit_part = job.get("exit_reason") or "-"
    if job.get("exit_code") is not None:
        exit_part += f" (exit code {job['exit_code']})"
    if job.get("cost") is not None:
        money = f"cost {credits(job['cost'])} credits"
    elif job.get("max_cost") is not None:
        money = f"at most {credits(job['max_cost'])} credits, receipt pending"
    else:
        money = "nothing charged"
    return (
        f"job {job['id']} {job['state']}: {exit_part}; provider "
        f"{short_peer(job.get('provider'))}, attempt(s) {job.get('attempts', 0)}; {money}"
    )


def exit_status(job: dict[str, Any]) -> int:
    """``cx run``'s exit status for an ended job (see ``_EPILOG``)."""
    if job["state"] == "succeeded" or job.get("exit_reason") == "success":
        return 0
    if job.get("exit_reason") is None and job["state"] in ("cancelled", *_UNMATCHED):
        return EXIT_NEVER_RAN
    code = job.get("exit_code")
    if job.get("exit_reason") == "nonzero-exit" and isinstance(code, int) and 0 < code < 256:
        return code  # the job's own status; a kill (137 after OOM or timeout) is 1
    return 1
