"""How cx reads its command line: one-line errors with a suggestion, aliases docker and
kubectl users type, --version, help for every argument, and a reader that goes away."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from node.cli import EXIT_BROKEN_PIPE, build_parser, main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ("run", "--max-prise", "1", "busybox", "--", "true"),
            "cx run: --max-prise: unknown option; did you mean --max-price? (see `cx run --help`)",
        ),
        (("jbos",), "did you mean jobs?"),
        (("jobs", "--hme", "x"), "cx jobs: --hme: unknown option; did you mean --home?"),
        (("exec", "--memory", "128m", "busybox", "true"), "cx exec: --memory: '128m' is ambiguous"),
        (("exec", "--cpus", "0", "busybox", "true"), "cx exec: --cpu: '0' is not a CPU amount"),
        (("init", "--price", "cheap"), "cx init: --price: 'cheap' is not an amount of credits"),
    ],
)
def test_mistakes_get_one_line_with_a_suggestion(capsys, argv, expected):
    # Before: the top-level usage and "unrecognized arguments" for a sub-command's typo.
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    (line,) = err.splitlines()
    assert expected in line


def test_version(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out.startswith("cx 0.")


def _parsers(parser: argparse.ArgumentParser, name: str = "cx"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, p in action.choices.items():
                yield from _parsers(p, f"{name} {sub}")


def test_every_argument_has_help_and_home_reads_the_same_everywhere():
    homes = set()
    for name, parser in _parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue  # its commands' help is their parsers'
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
            if "--home" in action.option_strings and action.help != argparse.SUPPRESS:
                homes.add(action.help)  # (one hidden on purpose repeats its parent's)
    assert len(homes) == 1, homes


def test_the_run_aliases_docker_users_type(capsys):
    parser = build_parser()
    args = parser.parse_args(["run", "--cpus", "2", "-m", "1Gi", "-e", "A=1", "img", "true"])
    assert (args.cpu, args.memory, args.env) == (2000, 1 << 30, ["A=1"])


def test_a_reader_that_goes_away_ends_quietly(tmp_path):
    # Before: `cx jobs | head -2` ended in a BrokenPipeError traceback.
    read, write = os.pipe()
    os.close(read)  # the reader has gone before cx writes a byte
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "node.cli", "image", "ls", "--home", str(tmp_path)],
            stdout=write,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert proc.stderr == b""
    assert proc.returncode == EXIT_BROKEN_PIPE
