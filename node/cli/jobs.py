"""``cx jobs``, ``cx logs``, ``cx get``, ``cx why``, ``cx cancel``: this node's jobs, through
its control API. JOB is a job id or an unambiguous prefix of one (as ``cx jobs`` shows).

Exit status: 0 done, 1 the node refused (e.g. unknown job), 3 no node answered.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from node.api.client import ApiClient
from node.cli.common import add_common, age, client, credits, print_json, short_peer, table, talk
from node.cli.live import follow
from protocol.units import cores, size

__all__ = ["register"]

Json = dict[str, Any]
_JOB_HELP = "a job id, or a prefix of one that names one job (see cx jobs)"
_FOLLOW_S = 0.5  # how often cx logs -f asks again when nothing new has come
_PRICE_UNITS = (
    ("cpu_core_hour", "core-h"),
    ("memory_gib_hour", "GiB-h memory"),
    ("disk_gib_hour", "GiB-h disk"),
    ("gpu_hour", "GPU-h"),
)


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    jobs = commands.add_parser(
        "jobs",
        help="list this node's jobs, or show one",
        description="List the jobs this node submitted, newest first, or show JOB in full.",
    )
    jobs.add_argument("job", nargs="?", metavar="JOB", help="show this job in full")
    jobs.add_argument(
        "--watch", action="store_true", help="keep the list on screen, redrawn at every change"
    )
    jobs.add_argument(
        "--sold",
        action="store_true",
        help="the jobs this node runs or ran for others as provider, and what each earned",
    )
    add_common(jobs, json_help="print the JobView(s) as JSON")
    jobs.set_defaults(run=talk("cx jobs", _jobs))

    logs = commands.add_parser(
        "logs",
        help="print a job's stdout (and its stderr to stderr)",
        description="Print JOB's stdout to stdout and its stderr to stderr: once it has "
        "ended, all of it; with -f, as it is written, from its provider while it runs.",
    )
    logs.add_argument("job", metavar="JOB", help=_JOB_HELP)
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="print the output as the job writes it, until it ends",
    )
    add_common(logs, json_help="print {stdout, stderr} as JSON")
    logs.set_defaults(run=talk("cx logs", _logs))

    get = commands.add_parser(
        "get",
        help="fetch a job's output files",
        description="Fetch the files JOB wrote to its output directory into DEST.",
    )
    get.add_argument("job", metavar="JOB", help=_JOB_HELP)
    get.add_argument("dest", nargs="?", type=Path, default=Path(), metavar="DEST",
                     help="directory to write them under (default: the current one)")  # fmt: skip
    add_common(get, json_help="print [{path, file, size}] as JSON")
    get.set_defaults(run=talk("cx get", _get))

    why = commands.add_parser(
        "why",
        help="explain why a job's bid has not matched",
        description="Explain how the market sees JOB's bid: the offers seen, the constraints "
        "that ruled them out, and the best price against your limit.",
    )
    why.add_argument("job", metavar="JOB", help=_JOB_HELP)
    add_common(why, json_help="print the explanation as JSON")
    why.set_defaults(run=talk("cx why", _why))

    cancel = commands.add_parser(
        "cancel",
        aliases=["stop"],
        help="cancel a waiting job, or stop a running one",
        description="Cancel JOB: while it waits for a match its bid is withdrawn everywhere, "
        "and nothing is paid; once a provider has it, the provider stops the container "
        "(SIGTERM, then SIGKILL) and its receipt, exit reason `stopped`, charges the time "
        "used. `cx wait JOB` follows it to that end.",
    )
    cancel.add_argument("job", metavar="JOB", help=_JOB_HELP)
    add_common(cancel, json_help="print the JobView as JSON")
    cancel.set_defaults(run=talk("cx cancel", _cancel))


def _jobs(args: argparse.Namespace) -> int:
    if args.watch:
        return follow(
            args, "cx jobs", lambda snapshot: render_jobs(snapshot["jobs"], snapshot["at_ms"])
        )
    api = client(args)
    if args.sold:
        sold = api.sold()
        if args.json:
            print_json(sold)
        else:
            print(render_sold(sold))
        return 0
    if args.job is not None:
        job = api.job(args.job)
        if args.json:
            print_json(job)
        else:
            print(render_job(job))
        return 0
    jobs = api.jobs()
    if args.json:
        print_json(jobs)
        return 0
    print(render_jobs(jobs))
    return 0


def render_jobs(jobs: list[Json], now_ms: int | None = None) -> str:
    rows = [
        (
            j["id"],
            j.get("name") or "-",
            j["state"],
            _short_image(j.get("image", "")),
            _short_command(j.get("command") or []),
            _resources(j),
            short_peer(j.get("provider")),
            j.get("attempts", 0),
            credits(j.get("cost")),
            age(j.get("created_ms"), now_ms),
        )
        for j in jobs
    ]
    headers = (
        "ID", "NAME", "STATE", "IMAGE", "COMMAND", "CPU/MEMORY", "PROVIDER", "ATTEMPTS", "COST",
        "AGE",
    )  # fmt: skip
    return table(headers, rows, right=(7, 8, 9))


def render_sold(sold: list[Json], now_ms: int | None = None) -> str:
    """A provider's work, newest first: ID is the name its log gives each job."""
    rows = [
        (
            s["id"],
            s["state"],
            short_peer(s.get("buyer")),
            _short_image(s.get("image", "")),
            _short_command(s.get("command") or []),
            _resources(s),
            credits(s.get("earned")),
            age(s.get("created_ms"), now_ms),
        )
        for s in sold
    ]
    headers = ("ID", "STATE", "BUYER", "IMAGE", "COMMAND", "CPU/MEMORY", "EARNED", "AGE")
    earned = sum(s.get("earned") or 0 for s in sold)
    return "\n".join(
        [
            f"earned: {credits(earned)} credits from {len(sold)} job(s) sold",
            "",
            table(headers, rows, right=(6, 7)),
        ]
    )


def _short_image(image: str) -> str:
    """A digest as its first 12 hex digits (as docker shows image ids); a registry
    reference as its repository."""
    if image.startswith("sha256:"):
        return image[7:19]
    return image.split("@")[0].rsplit("/", 1)[-1] or "-"


def _short_command(command: list[str], width: int = 24) -> str:
    text = " ".join(command) or "-"
    return text if len(text) <= width else text[: width - 2] + ".."


def _resources(job: Json) -> str:
    cpu = cores(job.get("cpu_milli", 0)).split()[0]
    return f"{cpu}/{size(job.get('memory_bytes', 0)).replace(' ', '')}"


def render_job(job: Json, now_ms: int | None = None) -> str:
    price = job.get("price")
    exit_part = job.get("exit_reason") or "-"
    if job.get("exit_code") is not None:
        exit_part += f" (exit code {job['exit_code']})"
    fields = [
        ("id", job["id"]),
        ("name", job.get("name") or "-"),
        ("image", job.get("image") or "-"),
        ("command", " ".join(job.get("command") or []) or "-"),
        ("resources", _resources(job)),
        ("state", " - ".join(x for x in (job["state"], job.get("detail")) if x)),
        ("provider", job.get("provider") or "-"),
        ("attempts", job.get("attempts", 0)),
        ("price", _prices(price) if price else "-"),
        ("max cost", credits(job.get("max_cost"))),
        ("cost", credits(job.get("cost"))),
        ("exit", exit_part),
        ("created", f"{age(job.get('created_ms'), now_ms)} ago"),
        ("updated", f"{age(job.get('updated_ms'), now_ms)} ago"),
    ]
    lines = [f"{k + ':':<10} {v}" for k, v in fields]
    for kind in ("outputs", "logs"):
        files = job.get(kind) or []
        lines.append(f"{kind + ':':<10} {len(files)} file(s)")
        lines += [f"  {f['path']}  {f['size']} B  {f['digest']}" for f in files]
    return "\n".join(lines)


def _prices(price: Json) -> str:
    return ", ".join(
        f"{credits(price[k])}/{unit}" for k, unit in _PRICE_UNITS if price.get(k) is not None
    )


def _logs(args: argparse.Namespace) -> int:
    if args.follow:
        return _follow_logs(client(args), args.job)
    logs = client(args).logs(args.job)
    if args.json:
        print_json(logs)
        return 0
    sys.stderr.write(logs.get("stderr", ""))
    sys.stderr.flush()
    sys.stdout.write(logs.get("stdout", ""))
    return 0


def _follow_logs(api: ApiClient, job: str) -> int:
    """Print what the job writes as it writes it (its provider is asked every
    ``_FOLLOW_S``), until it has ended and its last output is out."""
    offsets = (0, 0)
    while True:
        got = api.live_logs(job, *offsets)
        sys.stderr.write(got["stderr"])
        sys.stderr.flush()
        sys.stdout.write(got["stdout"])
        sys.stdout.flush()
        offsets = (got["stdout_next"], got["stderr_next"])
        if got["ended"]:
            return 0
        if not (got["stdout"] or got["stderr"]):
            time.sleep(_FOLLOW_S)


def _get(args: argparse.Namespace) -> int:
    dest = args.dest.absolute()
    dest.mkdir(parents=True, exist_ok=True)
    files = client(args).outputs(args.job, dest)
    if args.json:
        print_json(files)
        return 0
    print(f"{len(files)} file(s) under {dest}", file=sys.stderr)
    if files:
        rows = [(f["path"], f.get("file") or f["url"], f["size"]) for f in files]
        print(table(("PATH", "FILE", "SIZE"), rows, right=(2,)))
    return 0


def _why(args: argparse.Namespace) -> int:
    why = client(args).why(args.job)
    if args.json:
        print_json(why)
    else:
        print(render_why(args.job, why))
    return 0


def render_why(job: str, why: Json) -> str:
    """The node's explanation (protocol/explain.py: counts per constraint, then what to
    change, prices compared per unit as matching does), said once. Before: a second list
    of the same counts, and a sentence comparing a whole-job total with a unit limit."""
    seen = why.get("offers_seen", 0)
    lines = [f"job {job} is {why.get('state', '?')}; its bid has seen {seen} offer(s)."]
    if why.get("explanation"):
        lines.append(why["explanation"])
    return "\n".join(lines)


def _cancel(args: argparse.Namespace) -> int:
    job = client(args).cancel(args.job)
    if args.json:
        print_json(job)
    elif job["state"] == "cancelled":
        print(f"job {job['id']}: cancelled")
    else:
        print(f"job {job['id']}: {job['state']}; its provider is stopping it (see cx wait)")
    return 0
