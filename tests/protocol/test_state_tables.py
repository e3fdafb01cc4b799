"""Every (state, event) pair of every state machine, the way h11's test_state.py walks its
tables: a pair in the table moves to the state it lists, any other pair raises and leaves
the machine in its error state, and a machine in its error state stays there."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping

import pytest

from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.job import JOB_TABLE
from protocol.machine import Machine
from protocol.messages import JobState
from protocol.negotiation import (
    BUYER_TABLE,
    PROVIDER_TABLE,
    BuyerEvent,
    NegotiationState,
    ProviderEvent,
)

MACHINES: list[tuple[str, Mapping, type[enum.Enum], type[enum.Enum], enum.Enum]] = [
    ("buyer negotiation", BUYER_TABLE, NegotiationState, BuyerEvent, NegotiationState.ERROR),
    (
        "provider negotiation",
        PROVIDER_TABLE,
        NegotiationState,
        ProviderEvent,
        NegotiationState.ERROR,
    ),
    ("job", JOB_TABLE, JobState, JobState, JobState.ERROR),
]


def _pairs():
    for name, table, states, events, error in MACHINES:
        for state in states:
            for event in events:
                yield pytest.param(
                    table, state, event, error, id=f"{name}:{state.value}+{event.value}"
                )


def _at(table: Mapping, state: enum.Enum, error: enum.Enum) -> Machine:
    return Machine(table, state, error)


@pytest.mark.parametrize(("table", "state", "event", "error"), list(_pairs()))
@pytest.mark.parametrize("remote", [False, True])
def test_every_pair_moves_as_the_table_says_or_errors_for_good(table, state, event, error, remote):
    machine = _at(table, state, error)
    expected = table.get((state, event))
    if expected is not None:
        assert machine.fire(event, remote=remote) is expected
        assert machine.state is expected
        return
    kind: Callable = RemoteProtocolError if remote else LocalProtocolError
    with pytest.raises(kind) as raised:
        machine.fire(event, remote=remote)
    assert raised.value.reason is Reason.ILLEGAL_TRANSITION
    assert machine.state is error
    # in its error state it stays, whatever comes next
    for anything in type(event):
        with pytest.raises(LocalProtocolError):
            machine.fire(anything)
        assert machine.state is error


@pytest.mark.parametrize(("name", "table", "states", "events", "error"), MACHINES)
def test_tables_never_leave_or_enter_the_error_state(name, table, states, events, error):
    for (state, event), target in table.items():
        assert state is not error, (name, event)
        assert target is not error, (name, state, event)


def test_every_job_state_but_error_is_reachable_from_agreed():
    reached, frontier = {JobState.AGREED}, [JobState.AGREED]
    while frontier:
        state = frontier.pop()
        for (source, _), target in JOB_TABLE.items():
            if source is state and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(JobState) - {JobState.ERROR}
