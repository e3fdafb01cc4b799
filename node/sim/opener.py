"""How a simulated node opens a gossiped message: decode, check the signature, parse.

Two modes, with the same verdicts by construction and by test
(tests/node/test_sim.py runs a scenario in both and compares digests):

- ``every``: each delivery runs :func:`protocol.envelope.open_signed` on the bytes, as a
  real node's topic validator does. Real Ed25519 at every hop; slow.
- ``once``: the first delivery of a wire opens it for real and every later delivery, at
  any node, reuses that verdict (the opened message or the error). Decoding and signature
  checking are pure functions of the bytes, so no node can decide differently; what still
  runs per delivery is each node's own admission (time, replay) and book.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from protocol.envelope import Signed, open_signed
from protocol.errors import ProtocolError

__all__ = ["VERIFY_MODES", "Opener"]

VERIFY_MODES = ("once", "every")


@dataclass(slots=True)
class Opener:
    mode: str = "once"
    opened: int = 0  # real open_signed calls
    _verdicts: dict[bytes, Signed[Any] | ProtocolError] = field(default_factory=dict)

    def __call__(self, wire: bytes) -> Signed[Any]:
        """The opened message.

        Raises:
            ProtocolError: DecodeError or InvalidMessage, as open_signed raises them.
        """
        if self.mode == "every":
            self.opened += 1
            return open_signed(wire)
        verdict = self._verdicts.get(wire)
        if verdict is None:
            self.opened += 1
            try:
                verdict = open_signed(wire)
            except ProtocolError as exc:
                verdict = exc
            self._verdicts[wire] = verdict
        if isinstance(verdict, ProtocolError):
            # a fresh error each time: re-raising one object would grow its traceback
            raise type(verdict)(verdict.reason, str(verdict).split(": ", 1)[-1])
        return verdict

    def forget(self, wire: bytes) -> None:
        """Every node has seen ``wire``: drop its verdict to bound memory."""
        self._verdicts.pop(wire, None)
