"""``cx flow run`` and ``cx flow status`` as a user types them, against a buyer and two
providers running real containers: outputs passed by digest, parallel steps, retries, a
failure that skips only its dependants, and a flow resumed after the buyer restarts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from market_support import Cluster, Node, cluster, market, state, until

from node.api.controller import serve_control
from node.cli import main

pytestmark = pytest.mark.integration

FLOW = """
name = "words"
[defaults]
image = "{image}"
max_price = "100"
cpu = "0.25"
memory = "64M"
timeout = "1m"

[steps.split]
command = [
    "sh", "-c",
    "mkdir /out/part; head -n 2 /in/words > /out/part/a; tail -n 1 /in/words > /out/part/b",
]
inputs = {{ "/in/words" = "words.txt" }}

[steps.count-a]
command = ["sh", "-c", "wc -l < /in/a > /out/n"]
inputs = {{ "/in/a" = "split:/out/part/a" }}

[steps.count-b]
command = ["sh", "-c", "wc -l < /in/b > /out/n"]
inputs = {{ "/in/b" = "split:/out/part/b" }}

[steps.total]
command = [
    "sh", "-c",
    "cat /in/parts/* > /out/all; echo $(( $(cat /in/a) + $(cat /in/b) )) > /out/total",
]
[steps.total.inputs]
"/in/a" = "count-a:/out/n"
"/in/b" = "count-b:/out/n"
"/in/parts/" = "split:/out/part/"

[steps.broken]
command = ["sh", "-c", "exit 3"]
retries = 1

[steps.after-broken]
command = ["true"]
after = ["broken"]
"""

SLOW = """
[defaults]
image = "{image}"
max_price = "100"
cpu = "0.25"
memory = "64M"
timeout = "1m"

[steps.slow]
command = ["sh", "-c", "sleep 2; echo 5 > /out/n"]

[steps.double]
command = ["sh", "-c", "echo $(( $(cat /in/n) * 2 )) > /out/n"]
inputs = {{ "/in/n" = "slow:/out/n" }}
"""


async def _cx(capsys: Any, node: Node, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    home = str(node.home.root)
    code = await trio.to_thread.run_sync(main, [*argv[:2], "--home", home, *argv[2:]])
    out, err = capsys.readouterr()
    return code, out, err


async def _control(c: Cluster, node: Node) -> trio.CancelScope:
    """Serve the node's control API until the returned scope is cancelled."""
    scope = trio.CancelScope()

    async def run(task_status: Any) -> None:
        with scope:
            await serve_control(node.peer, task_status=task_status)

    await c.nursery.start(run)
    return scope


async def _market(c: Cluster) -> tuple[Node, list[Node]]:
    providers = [await c.provider("one"), await c.provider("two")]
    buyer = await c.buyer("buyer")
    await _join(buyer, providers)
    return buyer, providers


async def _join(buyer: Node, providers: list[Node]) -> None:
    for p in providers:
        await buyer.peer.join(p.addr)
    await until(lambda: market(buyer)["offers"] == len(providers), buyer)


async def test_a_flow_passes_outputs_by_digest_and_a_failure_skips_only_its_dependants(
    image_layout: Path, capsys: Any, tmp_path: Path
) -> None:
    (tmp_path / "words.txt").write_text("alpha\nbeta\ngamma\n")
    async with cluster(image_layout) as c:
        buyer, _ = await _market(c)
        await _control(c, buyer)
        flow = tmp_path / "words.toml"
        flow.write_text(FLOW.format(image=c.image))

        code, out, err = await _cx(capsys, buyer, "flow", "run", str(flow), "--json")
        assert code == 1, err  # broken failed
        state = json.loads(out)
        steps = state["steps"]
        assert {n: s["state"] for n, s in steps.items()} == {
            "split": "succeeded",
            "count-a": "succeeded",
            "count-b": "succeeded",
            "total": "succeeded",
            "broken": "failed",
            "after-broken": "skipped",
        }
        store = buyer.peer.market.store

        def output(step: str, path: str) -> bytes:
            (o,) = [o for o in steps[step]["outputs"] if o["path"] == path]
            return store.read_bytes(o["digest"])

        assert output("total", "/out/total") == b"3\n"
        assert output("total", "/out/all") == b"alpha\nbeta\ngamma\n"
        assert steps["broken"]["attempts"] == 2  # retried once
        assert "exit code 3" in steps["broken"]["reason"]
        assert steps["after-broken"]["reason"] == "broken failed"
        assert "after-broken   skipped    because broken failed" in err
        # Each step's job is a job of the node, named after the flow, step and attempt.
        names = sorted(str(j.name).split("#")[0] for j in buyer.peer.jobs())
        assert names == sorted(
            ["words/broken"] * 2
            + [f"words/{n}" for n in steps if n != "after-broken" and n != "broken"]
        )

        code, out, _ = await _cx(capsys, buyer, "flow", "status", "words")
        assert code == 0
        lines = out.splitlines()
        assert lines[0] == "flow words: failed"
        assert lines[1].split()[:4] == ["STEP", "STATE", "JOB", "PROVIDER"]
        total = next(line for line in lines if line.startswith("total "))
        assert "count-a, count-b, split" in total
        code, out, _ = await _cx(capsys, buyer, "flow", "status")
        assert out.splitlines()[1].split()[:3] == ["words", "failed", "4/6"]

        # Run again: nothing is submitted twice, the same result.
        before = len(buyer.peer.jobs())
        code, _, _ = await _cx(capsys, buyer, "flow", "run", str(flow))
        assert code == 1
        assert len(buyer.peer.jobs()) == before


async def test_an_interrupted_flow_resumes_after_the_buyer_restarts(
    image_layout: Path, capsys: Any, tmp_path: Path
) -> None:
    async with cluster(image_layout) as c:
        buyer, providers = await _market(c)
        control = await _control(c, buyer)
        flow = tmp_path / "slow.toml"
        flow.write_text(SLOW.format(image=c.image))
        # The user's cx flow run dies mid-flow (kill -9), then the buyer node restarts.
        argv = ["flow", "run", "--home", str(buyer.home.root), str(flow)]
        first = await trio.lowlevel.open_process([sys.executable, "-m", "node.cli", *argv])
        try:
            slow = await until(
                lambda: [j for j in buyer.peer.jobs() if str(j.name).startswith("slow/slow#")],
                buyer,
            )
            await state(buyer, slow[0].id, "running")  # on the provider: it needs no buyer now
        finally:
            first.kill()
            await first.wait()
        control.cancel()
        await buyer.stop()

        buyer = await c.start(buyer.home)
        await _join(buyer, providers)  # it has the job's output: the next step needs offers
        await _control(c, buyer)
        code, out, err = await _cx(capsys, buyer, "flow", "run", str(flow), "--json")
        assert code == 0, err
        steps = json.loads(out)["steps"]
        assert steps["slow"]["job"] == slow[0].id  # followed, not submitted again
        assert steps["slow"]["attempts"] == 1
        assert [j.name for j in buyer.peer.jobs()].count(slow[0].name) == 1
        (n,) = steps["double"]["outputs"]
        assert buyer.peer.market.store.read_bytes(n["digest"]) == b"10\n"


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (
            '[steps.a]\ncommand = ["true"]\nafter = ["b"]\n[steps.b]\ncommand = ["true"]\n'
            'after = ["a"]\n',
            "is on a dependency cycle",
        ),
        (
            '[steps.a]\ncommand = ["true"]\ninputs = { "/in/x" = "ghost.txt" }\n',
            "input '/in/x': ghost.txt is no file or step",
        ),
        ('[steps.a]\ncommand = ["true"]\nmemroy = "1G"\n', "step 'a': unknown key 'memroy'"),
        ('[steps.a]\ncommand = ["true"]\nmemory = "lots"\n', "step 'a': memory: 'lots'"),
        ('[steps.a]\ncommand = ["true"]\nafter = ["nope"]\n', "depends on 'nope', which is no"),
        ("[steps.a]\n", "step 'a': give 'command'"),
    ],
)
def test_an_unusable_flow_file_is_refused_before_anything_runs(
    tmp_path: Path, capsys: Any, body: str, said: str
) -> None:
    flow = tmp_path / "bad.toml"
    image = "sha256:" + "ab" * 32
    flow.write_text(f'[defaults]\nimage = "{image}"\nmax_price = "1"\n{body}')
    code = main(["flow", "run", "--home", str(tmp_path / "home"), str(flow)])
    err = capsys.readouterr().err
    assert code == 2
    assert said in err
    assert not (tmp_path / "home" / "flows").exists()
