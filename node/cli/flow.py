"""``cx flow run FILE.toml`` and ``cx flow status``: a graph of jobs whose inputs are other
jobs' outputs, run through the node; the graph's rules are protocol/flow.py's.

The flow file::

    name = "words"                      # default: the file's name without .toml
    [defaults]                          # any step key, for every step
    image = "busybox"
    max_price = "1.5"
    [steps.split]
    command = ["sh", "-c", "split -l 100 /in/words /out/part-"]
    inputs = { "/in/words" = "words.txt" }          # a file, relative to the flow file
    [steps.count]
    command = ["sh", "-c", "cat /in/parts/* | wc -l > /out/n"]
    inputs = { "/in/parts/" = "split:/out/" }       # every output of split under /out/
    retries = 1

Step keys: ``image``, ``command``, ``inputs``, ``after`` (steps to wait for without taking
their outputs), ``retries``, ``env``, ``cpu``, ``memory``, ``disk``, ``gpus``, ``timeout``,
``max_price``, ``max_memory_price``, ``max_disk_price``, ``max_gpu_price``, ``arch``,
``regions``, ``trust``, ``preemptible``: the values ``cx run`` takes for its options.

Progress is kept in ``<home>/flows/<name>.json`` after every submission and every end, so
``cx flow run`` of the same file after an interruption (of this command, or of the node)
follows the jobs already submitted and runs only what is left. Exit status: 0 every step
succeeded, 1 a step failed (its dependants are skipped, naming it), 2 an unusable flow
file, 3 no node answered (run it again to resume).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    table,
)
from node.cli.run import Unusable, request_image
from node.market.buyer import FINAL_STATES
from node.market.request import RequestError, build_request
from protocol.flow import (
    FlowError,
    Output,
    Step,
    StepInput,
    StepState,
    check_flow,
    flow_over,
    order,
    ready,
    resolve_inputs,
    skipped,
)

__all__ = ["register"]

Json = dict[str, Any]
EXIT_FAILED = 1
EXIT_INPUT = 2
_WAIT_S = 1.0  # long-poll on one running job; the others are checked when it returns
_PARSERS: dict[str, Any] = {
    "cpu": cpu,
    "memory": size_bytes,
    "disk": size_bytes,
    "timeout": duration_ms,
    "max_price": parse_credits,
    "max_memory_price": parse_credits,
    "max_disk_price": parse_credits,
    "max_gpu_price": parse_credits,
}
_KEYS = frozenset(
    {
        *_PARSERS,
        "image",
        "command",
        "inputs",
        "after",
        "retries",
        "env",
        "gpus",
        "arch",
        "regions",
        "trust",
        "preemptible",
    }
)


class FlowFileError(Exception):
    """The flow file cannot be used; the message names the step and key."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    name: str
    file: Path
    steps: dict[str, Step]
    fields: dict[str, Json]  # step -> build_request fields, but for its step inputs
    files: dict[str, dict[str, str]]  # step -> container path -> local file


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    group = commands.add_parser(
        "flow",
        help="run a graph of jobs whose inputs are other jobs' outputs",
        description="Workflows: jobs whose inputs name other jobs' outputs, run in parallel "
        "where they are independent, outputs passed by digest.",
    )
    sub = group.add_subparsers(dest="flow_command", metavar="ACTION", required=True)
    run = sub.add_parser(
        "run",
        help="run (or resume) the flow in FILE.toml and follow it to its end",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("file", type=Path, metavar="FILE.toml", help="the flow: its steps, inputs")
    run.add_argument("--restart", action="store_true", help="forget earlier progress")
    add_common(run, json_help="print the final status as JSON")
    run.set_defaults(run=_run)
    status = sub.add_parser(
        "status",
        help="each step of a flow: state, job, provider, cost; or every flow",
        description="Without NAME, every flow of this node's home; with it, its steps in "
        "order with their state, job, provider, cost and what they wait on.",
    )
    status.add_argument("name", nargs="?", metavar="NAME", help="one flow (default: every flow)")
    add_common(status, json_help="print as JSON")
    status.set_defaults(run=_status)


# -- the flow file ----------------------------------------------------------------------


def load_plan(path: Path, home: Path) -> Plan:
    """The flow in ``path``, checked.

    Raises:
        FlowFileError: unreadable, unknown keys or values, unknown steps, a cycle.
    """
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise FlowFileError(f"{path}: {exc}") from None
    unknown = sorted(set(doc) - {"name", "defaults", "steps"})
    if unknown:
        raise FlowFileError(f"{path}: unknown top-level key {unknown[0]!r}")
    name = str(doc.get("name") or path.stem)
    if not name.replace("-", "").replace("_", "").isalnum():
        raise FlowFileError(f"{path}: name {name!r}: letters, digits, - and _ only")
    defaults = doc.get("defaults") or {}
    raw_steps = doc.get("steps") or {}
    if not isinstance(raw_steps, dict) or not raw_steps:
        raise FlowFileError(f"{path}: no [steps.NAME] tables")
    steps, fields, files = {}, {}, {}
    for step_name, table_ in raw_steps.items():
        if not isinstance(table_, dict):
            raise FlowFileError(f"step {step_name!r}: must be a table")
        merged = {**defaults, **table_}
        steps[step_name], fields[step_name], files[step_name] = _step(
            step_name, merged, raw_steps, path.parent, home, name
        )
    try:
        check_flow(steps)
    except FlowError as exc:
        raise FlowFileError(str(exc)) from None
    return Plan(name=name, file=path.resolve(), steps=steps, fields=fields, files=files)


def _step(
    name: str, raw: Json, all_steps: Json, here: Path, home: Path, flow: str
) -> tuple[Step, Json, dict[str, str]]:
    bad = sorted(set(raw) - _KEYS)
    if bad:
        raise FlowFileError(f"step {name!r}: unknown key {bad[0]!r}")
    for key in ("image", "command", "max_price"):
        if key not in raw:
            raise FlowFileError(f"step {name!r}: give {key!r} (in the step or [defaults])")
    step_inputs, files = [], {}
    for dest, source in (raw.get("inputs") or {}).items():
        src_step, sep, output = str(source).partition(":")
        if sep and src_step in all_steps and output.startswith("/"):
            if output.endswith("/") != dest.endswith("/"):
                raise FlowFileError(
                    f"step {name!r}: input {dest!r}: a directory (ending in /) takes a "
                    "directory of outputs, a file one output"
                )
            step_inputs.append(StepInput(path=dest, source=src_step, output=output))
            continue
        local = (here / source).resolve()
        if not local.is_file():
            raise FlowFileError(f"step {name!r}: input {dest!r}: {source} is no file or step")
        files[dest] = str(local)
    values: Json = {}
    for key, parse in _PARSERS.items():
        if key in raw:
            try:
                values[key] = parse(str(raw[key]))
            except argparse.ArgumentTypeError as exc:
                raise FlowFileError(f"step {name!r}: {key}: {exc}") from None
    try:
        image = request_image(str(raw["image"]), home)
    except Unusable as exc:
        raise FlowFileError(f"step {name!r}: image: {exc}") from None
    same = values["max_price"]
    fields: Json = {
        "image": image,
        "command": raw["command"],
        "env": raw.get("env") or {},
        "cpu_milli": values.get("cpu", 1000),
        "memory_bytes": values.get("memory", 256 << 20),
        "disk_bytes": values.get("disk", 0),
        "gpus": raw.get("gpus", 0),
        "wall_ms": values.get("timeout", 3_600_000),
        "max_prices": {
            "cpu_core_hour": same,
            "memory_gib_hour": values.get("max_memory_price", same),
            "disk_gib_hour": values.get("max_disk_price", same),
            "gpu_hour": values.get("max_gpu_price", 0),
        },
        "arch": raw.get("arch"),
        "regions": raw.get("regions") or [],
        "trust": raw.get("trust", "none"),
        "preemptible": bool(raw.get("preemptible", False)),
    }
    try:  # checked now, as the node will check it, so a bad step fails before any runs
        build_request(**fields, inputs=[{"path": d, "file": f} for d, f in files.items()])
    except RequestError as exc:
        raise FlowFileError(f"step {name!r}: {exc}") from None
    retries = raw.get("retries", 0)
    if type(retries) is not int or not 0 <= retries <= 10:
        raise FlowFileError(f"step {name!r}: retries must be an integer 0..10")
    after = raw.get("after") or []
    if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
        raise FlowFileError(f"step {name!r}: after must be a list of step names")
    step = Step(name=name, inputs=tuple(step_inputs), after=tuple(after), retries=retries)
    return step, fields, files


# -- progress, kept in the home ----------------------------------------------------------


def _state_path(home: Path, name: str) -> Path:
    return home / "flows" / f"{name}.json"


def _load_state(home: Path, plan: Plan, restart: bool) -> Json:
    path = _state_path(home, plan.name)
    fresh: Json = {
        "name": plan.name,
        "file": str(plan.file),
        "run": os.urandom(3).hex(),  # marks this run's jobs in the node (see _submit)
        "steps": {},
    }
    state: Json = fresh if restart or not path.exists() else json.loads(path.read_text())
    for name in plan.steps:
        state["steps"].setdefault(name, {"state": StepState.PENDING.value, "attempts": 0})
    state["needs"] = {n: sorted(s.needs) for n, s in plan.steps.items()}
    state["order"] = order(plan.steps)
    return state


def _save(home: Path, state: Json) -> None:
    path = _state_path(home, state["name"])
    path.parent.mkdir(mode=0o700, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _states(state: Json) -> dict[str, StepState]:
    return {n: StepState(s["state"]) for n, s in state["steps"].items()}


# -- running ------------------------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    try:
        plan = load_plan(args.file, args.home)
    except FlowFileError as exc:
        print(f"cx flow: {exc}", file=sys.stderr)
        return EXIT_INPUT
    state = _load_state(args.home, plan, args.restart)
    try:
        api = client(args)
        _drive(api, plan, state, args.home)
    except (ApiError, ClientError) as exc:
        _save(args.home, state)
        print(
            f"cx flow: {exc}; progress is kept: `cx flow run {args.file}` resumes it",
            file=sys.stderr,
        )
        return EXIT_NO_NODE
    if args.json:
        print_json(state)
    else:
        print(render_status(state))
    ok = all(s is StepState.SUCCEEDED for s in _states(state).values())
    return 0 if ok else EXIT_FAILED


def _drive(api: ApiClient, plan: Plan, state: Json, home: Path) -> None:
    """Submit ready steps, follow running ones, until every step has ended."""
    steps = state["steps"]
    while not flow_over(_states(state).values()):
        for name, failed in skipped(plan.steps, _states(state)).items():
            _end(steps[name], StepState.SKIPPED, f"{failed} failed")
            _say(name, "skipped", f"because {failed} failed")
        for name in ready(plan.steps, _states(state)):
            _submit(api, plan, name, state, home)
        running = [n for n in state["order"] if steps[n]["state"] == StepState.RUNNING.value]
        if running:
            _wait(api, plan, running, steps)
            _save(home, state)


def _submit(api: ApiClient, plan: Plan, name: str, state: Json, home: Path) -> None:
    """Submit the step's next attempt. Its job's name marks the attempt, and the attempt is
    saved before it is submitted: a run cut off between the two finds the job by its name
    when it resumes, and never submits it twice."""
    steps, entry = state["steps"], state["steps"][name]
    attempt = entry["attempts"] + 1
    marker = f"{state['name']}/{name}#{state['run']}.{attempt}"
    if entry.get("submitting") == marker:
        known = [j for j in api.jobs() if j.get("name") == marker]
        if known:
            _submitted(entry, known[0]["id"], attempt, name)
            return
    outputs = {
        n: [Output(**o) for o in s.get("outputs") or []]
        for n, s in steps.items()
        if s["state"] == StepState.SUCCEEDED.value
    }
    try:
        blobs = resolve_inputs(plan.steps[name], outputs)
    except FlowError as exc:
        _end(entry, StepState.FAILED, f"{exc.reason}: {exc}")
        _say(name, "failed", str(exc))
        return
    inputs: list[Json] = [{"path": d, "file": f} for d, f in plan.files[name].items()]
    inputs += [{"path": b.path, "digest": b.digest, "size": b.size} for b in blobs]
    request = build_request(**{**plan.fields[name], "name": marker}, inputs=inputs)
    entry["submitting"] = marker
    _save(home, state)
    job = api.submit(request)
    _submitted(entry, job["id"], attempt, name)
    _save(home, state)


def _submitted(entry: Json, job_id: str, attempt: int, name: str) -> None:
    entry.update(state=StepState.RUNNING.value, job=job_id, attempts=attempt)
    entry.pop("reason", None)
    entry.pop("submitting", None)
    _say(name, "submitted", f"job {job_id} (attempt {attempt})")


def _wait(api: ApiClient, plan: Plan, running: list[str], steps: Json) -> None:
    """Wait a little for the first running job to change; then take every ended one."""
    first = steps[running[0]]
    seen = api.events(first["job"], first.get("seq", 0), _WAIT_S)
    if seen:
        first["seq"] = max(e["seq"] for e in seen)
    for name in running:
        entry = steps[name]
        try:
            job = api.job(entry["job"])
        except ApiError as exc:
            if exc.status != 404:
                raise
            job = {"state": "error", "detail": "the node no longer knows this job"}
        if job["state"] in FINAL_STATES:
            _ended(plan.steps[name], entry, job)


def _ended(step: Step, entry: Json, job: Json) -> None:
    entry.update(
        provider=job.get("provider"), cost=(entry.get("cost") or 0) + (job.get("cost") or 0)
    )
    entry.pop("seq", None)
    if job["state"] == "succeeded":
        entry["outputs"] = [
            {"path": o["path"], "digest": o["digest"], "size": o["size"]}
            for o in job.get("outputs") or []
        ]
        _end(entry, StepState.SUCCEEDED, "")
        _say(step.name, "succeeded", f"job {job.get('id', entry['job'])}")
        return
    why = f"job {entry['job']} {job['state']}"
    if job.get("exit_reason"):
        why += f": {job['exit_reason']}"
    if job.get("exit_code") is not None:
        why += f" (exit code {job['exit_code']})"
    if entry["attempts"] <= step.retries:
        entry.update(state=StepState.PENDING.value, reason=f"retrying after {why}")
        _say(step.name, "retrying", why)
        return
    _end(entry, StepState.FAILED, why)
    _say(step.name, "failed", why)


def _end(entry: Json, state: StepState, reason: str) -> None:
    entry["state"] = state.value
    if reason:
        entry["reason"] = reason
    else:
        entry.pop("reason", None)


def _say(step: str, what: str, detail: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {step:<14} {what:<10} {detail}", file=sys.stderr)


# -- status -------------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    folder = args.home / "flows"
    if args.name is None:
        flows = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
        if args.json:
            print_json(flows)
        else:
            print(render_flows(flows))
        return 0
    path = _state_path(args.home, args.name)
    if not path.exists():
        print(f"cx flow status: no flow {args.name!r}; see cx flow status", file=sys.stderr)
        return EXIT_FAILED
    state = json.loads(path.read_text())
    _refresh(args, state)
    if args.json:
        print_json(state)
    else:
        print(render_status(state))
    return 0


def _refresh(args: argparse.Namespace, state: Json) -> None:
    """Running steps' jobs as the node sees them now, if it answers."""
    try:
        api = client(args)
        for entry in state["steps"].values():
            if entry["state"] == StepState.RUNNING.value:
                job = api.job(entry["job"])
                entry["job_state"] = job["state"]
                entry["provider"] = job.get("provider")
    except (ApiError, ClientError):
        return


def render_flows(flows: list[Json]) -> str:
    rows = []
    for f in flows:
        states = [s["state"] for s in f["steps"].values()]
        done = sum(1 for s in states if s == StepState.SUCCEEDED.value)
        rows.append(
            (
                f["name"],
                _overall(states),
                f"{done}/{len(states)}",
                credits(sum(s.get("cost") or 0 for s in f["steps"].values())),
                f["file"],
            )
        )
    return table(("FLOW", "STATE", "DONE", "COST", "FILE"), rows, right=(2, 3))


def _overall(states: list[str]) -> str:
    if any(s in ("pending", "running") for s in states):
        return "running"
    return "succeeded" if all(s == "succeeded" for s in states) else "failed"


def render_status(state: Json) -> str:
    rows = []
    for name in state["order"]:
        s = state["steps"][name]
        shown = s["state"] + (f" ({s['job_state']})" if s.get("job_state") else "")
        rows.append(
            (
                name,
                shown,
                s.get("job") or "-",
                short_peer(s.get("provider")),
                credits(s.get("cost")) if s.get("cost") is not None else "-",
                ", ".join(state["needs"].get(name) or []) or "-",
                s.get("reason") or "",
            )
        )
    states = [s["state"] for s in state["steps"].values()]
    head = f"flow {state['name']}: {_overall(states)}"
    body = table(("STEP", "STATE", "JOB", "PROVIDER", "COST", "AFTER", "REASON"), rows, right=(4,))
    return f"{head}\n{body}"
