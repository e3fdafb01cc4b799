"""Live views for ``cx jobs --watch`` and ``cx top``: redrawn from the node's live stream
(GET /v1/stream, one snapshot per change), never by polling.

On a terminal the view is redrawn in place (rich's Live); into a pipe or a file each
snapshot is printed after the last, so a script can follow it line by line. Ctrl-C ends
the view with status 0.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from node.cli.common import client

if TYPE_CHECKING:
    from rich.console import Group

__all__ = ["follow"]

Json = dict[str, Any]


def follow(args: argparse.Namespace, title: str, render: Callable[[Json], str]) -> int:
    """Show ``render(snapshot)`` under ``title`` for every snapshot until interrupted.

    ``render`` raises ValueError for a snapshot it cannot show (its message is the one line
    the command prints, status 1).
    """
    # Imported here: rich costs every other cx command its start-up time (about 0.1 s).
    from rich.console import Console
    from rich.live import Live

    console = Console(highlight=False)
    stream = client(args).stream()
    try:
        if not console.is_terminal:
            for snapshot in stream:
                console.print(_frame(title, snapshot, render), soft_wrap=True)
            return 0
        with Live(console=console, auto_refresh=False, transient=False) as live:
            for snapshot in stream:
                live.update(_frame(title, snapshot, render), refresh=True)
    except KeyboardInterrupt:
        return 0
    except ValueError as exc:
        print(f"{title}: {exc}", file=sys.stderr)
        return 1
    return 0


def _frame(title: str, snapshot: Json, render: Callable[[Json], str]) -> Group:
    from rich.console import Group
    from rich.text import Text

    at = datetime.fromtimestamp(snapshot["at_ms"] / 1000, UTC).astimezone()
    heading = Text(f"{title} · live · {at:%H:%M:%S} · Ctrl-C to stop", style="bold")
    return Group(heading, Text(render(snapshot)))
