"""``cx node --log-format json``: one JSON object per log record, for log shippers.

Each line holds ``ts`` (RFC 3339, UTC, milliseconds), ``level``, ``logger`` and ``message``
(the record's %-args applied), and ``exc`` with the traceback when there is one. Nothing
else is added: a record's arguments may hold what a user typed, never a secret (the node
logs no credentials), so they are written as the text record would show them.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

__all__ = ["JsonFormatter", "use_json_logs"]


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def use_json_logs() -> None:
    """Make every handler of the root logger write JSON lines."""
    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonFormatter())
