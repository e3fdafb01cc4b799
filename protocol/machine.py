"""A transition-table state machine, shared by negotiation and job lifecycles.

Rules (h11's ``_state.py``): the table lists every allowed ``(state, event) -> state``;
anything else is illegal, puts the machine in its error state, and raises. A machine in its
error state stays there.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Generic, TypeVar

from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError

__all__ = ["Machine"]

S = TypeVar("S", bound=enum.Enum)
E = TypeVar("E", bound=enum.Enum)


class Machine(Generic[S, E]):
    def __init__(self, table: Mapping[tuple[S, E], S], initial: S, error: S) -> None:
        self._table = table
        self._error = error
        self.state = initial

    def fire(self, event: E, *, remote: bool = False) -> S:
        """Apply ``event``; ``remote`` says a peer caused it (for the error class).

        Raises:
            LocalProtocolError or RemoteProtocolError (ILLEGAL_TRANSITION).
        """
        new = self._table.get((self.state, event))
        if new is None:
            old, self.state = self.state, self._error
            error = RemoteProtocolError if remote else LocalProtocolError
            raise error(Reason.ILLEGAL_TRANSITION, f"{event.value} is not allowed in {old.value}")
        self.state = new
        return new
