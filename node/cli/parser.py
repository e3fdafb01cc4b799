"""How ``cx`` reads its command line: argparse, with every mistake in one line that says
what to do (``cx run: --max-prise: unknown option; did you mean --max-price?``) and exit
status 2, never the top-level usage for a sub-command's mistake.

argparse leaves an unknown option of a sub-command to the top-level parser, which knows
nothing of the sub-command; :func:`parse` hands it back to the sub-command's parser.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["CxParser", "parse"]

_ARGUMENT = re.compile(r"^argument ([^:]+): ")
_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)'")


class CxParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``PROG: OPTION: what went wrong``."""

    def error(self, message: str) -> NoReturn:
        message = _ARGUMENT.sub(lambda m: f"{_long_name(m.group(1))}: ", message)
        if m := _INVALID_CHOICE.search(message):
            message = _suggest(message, m.group(1), self._choices())
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")

    def unknown(self, extras: Sequence[str]) -> NoReturn:
        """Refuse arguments this parser does not know, suggesting the closest option."""
        first = extras[0]
        if first.startswith("-"):
            name = first.partition("=")[0]
            options = [o for a in self._actions for o in a.option_strings]
            self.error(_suggest(f"{name}: unknown option", name, options))
        self.error(f"unexpected argument(s): {' '.join(extras)}")

    def _choices(self) -> list[str]:
        return [
            name
            for action in self._actions
            if isinstance(action, argparse._SubParsersAction)
            for name in action.choices
        ]


def parse(parser: CxParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser``'s namespace for ``argv``; an unknown option is refused by the parser of
    the sub-command it was given to.

    Raises:
        SystemExit: 2 with the one-line error on stderr; 0 after --help or --version.
    """
    args, extras = parser.parse_known_args(argv)
    if extras:
        sub = _subparser(parser, getattr(args, "subcommand", None))
        (sub or parser).unknown(extras)
    return args


def _subparser(parser: CxParser, command: str | None) -> CxParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            found = action.choices[command]
            return found if isinstance(found, CxParser) else None
    return None


def _long_name(names: str) -> str:
    """``-m/--memory`` as ``--memory``, ``--cpu/--cpus`` as ``--cpu``: the first long name."""
    return next((n for n in names.split("/") if n.startswith("--")), names)


def _suggest(message: str, given: str, candidates: Sequence[str]) -> str:
    close = difflib.get_close_matches(given, candidates, n=1, cutoff=0.6)
    return f"{message}; did you mean {close[0]}?" if close else message
