"""The graph rules of flows: dependencies, what may run, what a failure skips, inputs by
digest."""

from __future__ import annotations

import pytest

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

P, R, S, F, K = (
    StepState.PENDING,
    StepState.RUNNING,
    StepState.SUCCEEDED,
    StepState.FAILED,
    StepState.SKIPPED,
)
D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64


def _in(source: str, output: str = "/out/x", path: str = "/in/x") -> StepInput:
    return StepInput(path=path, source=source, output=output)


# split -> a, b -> merge; lone stands apart; after-merge waits on merge without its outputs
FLOW = {
    "split": Step(name="split"),
    "a": Step(name="a", inputs=(_in("split"),)),
    "b": Step(name="b", inputs=(_in("split"),)),
    "merge": Step(name="merge", inputs=(_in("a", path="/in/a"), _in("b", path="/in/b"))),
    "after-merge": Step(name="after-merge", after=("merge",)),
    "lone": Step(name="lone"),
}


def _states(**given: StepState) -> dict[str, StepState]:
    return {n: given.get(n.replace("-", "_"), P) for n in FLOW}


def test_order_puts_dependencies_first() -> None:
    check_flow(FLOW)
    got = order(FLOW)
    for name, step in FLOW.items():
        assert all(got.index(d) < got.index(name) for d in step.needs)


@pytest.mark.parametrize(
    ("steps", "reason", "step"),
    [
        ({"a": Step(name="a", after=("nope",))}, "unknown-step", "a"),
        ({"a": Step(name="a", inputs=(_in("a"),))}, "cycle", "a"),
        (
            {"a": Step(name="a", after=("b",)), "b": Step(name="b", inputs=(_in("a"),))},
            "cycle",
            "a",
        ),
    ],
)
def test_unusable_flows_name_the_step(steps: dict[str, Step], reason: str, step: str) -> None:
    with pytest.raises(FlowError) as exc:
        check_flow(steps)
    assert (exc.value.reason, exc.value.step) == (reason, step)


def test_independent_steps_are_ready_together() -> None:
    assert ready(FLOW, _states()) == ["lone", "split"]
    assert ready(FLOW, _states(split=S, lone=R)) == ["a", "b"]
    assert ready(FLOW, _states(split=S, a=S, b=R, lone=S)) == []
    assert ready(FLOW, _states(split=S, a=S, b=S, lone=S)) == ["merge"]


def test_a_failure_skips_only_its_dependants_naming_it() -> None:
    states = _states(split=S, a=F, b=S, lone=R)
    assert skipped(FLOW, states) == {"merge": "a", "after-merge": "a"}
    assert ready(FLOW, states) == []
    assert not flow_over(states.values())
    states.update({"merge": K, "after-merge": K, "lone": S})
    assert flow_over(states.values())


def test_outputs_pass_by_digest_files_and_directories() -> None:
    outs = {
        "split": [
            Output(path="/out/part/aa", digest=D1, size=3),
            Output(path="/out/part/ab", digest=D2, size=4),
            Output(path="/out/x", digest=D1, size=3),
        ]
    }
    step = Step(
        name="a",
        inputs=(_in("split"), _in("split", output="/out/part/", path="/in/parts")),
    )
    assert resolve_inputs(step, outs) == [
        Output(path="/in/x", digest=D1, size=3),
        Output(path="/in/parts/aa", digest=D1, size=3),
        Output(path="/in/parts/ab", digest=D2, size=4),
    ]
    with pytest.raises(FlowError) as exc:
        resolve_inputs(Step(name="b", inputs=(_in("split", output="/out/y"),)), outs)
    assert exc.value.reason == "missing-output"
    assert "split produced no /out/y" in str(exc.value)
    with pytest.raises(FlowError):
        resolve_inputs(Step(name="b", inputs=(_in("split", output="/out/none/"),)), outs)
