"""``cx node --log-format json``: each record one JSON line, %-args applied, tracebacks kept."""

from __future__ import annotations

import json
import logging

from node.cli.logs_json import JsonFormatter


def test_a_record_becomes_one_json_line_with_its_traceback() -> None:
    try:
        raise ValueError("broken")
    except ValueError:
        import sys

        record = logging.LogRecord(
            "node.market.gossip", logging.WARNING, __file__, 1, "refused %s: %d", ("peer\n", 3),
            sys.exc_info(),
        )  # fmt: skip
    line = JsonFormatter().format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["level"] == "warning"
    assert parsed["logger"] == "node.market.gossip"
    assert parsed["message"] == "refused peer\n: 3"
    assert parsed["ts"].endswith("+00:00")
    assert "ValueError: broken" in parsed["exc"]
