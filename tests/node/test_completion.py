"""``cx completion``: the bash script, generated from cx's parser, completes commands,
sub-commands and options when bash itself runs it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CX = str(Path(__file__).parents[2] / ".venv" / "bin" / "cx")


@pytest.fixture(scope="module")
def bash_script() -> str:
    return subprocess.run(
        [CX, "completion", "bash"], capture_output=True, text=True, check=True
    ).stdout


def complete(script: str, line: str) -> list[str]:
    """What ``script`` offers for the last word of ``line`` when bash runs it."""
    words = line.split(" ")
    program = (
        f"{script}\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        '_cx; printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
    return done.stdout.split()


@pytest.mark.parametrize(
    ("line", "offered"),
    [
        ("cx da", ["dashboard"]),
        ("cx con", ["config"]),
        ("cx config ", ["--help", "check"]),
        ("cx image ", ["--help", "build-rootfs", "gc", "import", "ls"]),
        ("cx node --lo", ["--log-format"]),
        ("cx jobs --w", ["--watch"]),
        ("cx --v", ["--verbose", "--version"]),
    ],
)
def test_bash_completes_commands_and_options(
    bash_script: str, line: str, offered: list[str]
) -> None:
    assert sorted(complete(bash_script, line)) == offered


def test_a_path_option_completes_file_names(bash_script: str, tmp_path: Path) -> None:
    (tmp_path / "home-a").mkdir()
    assert complete(bash_script, f"cx jobs --home {tmp_path}/ho") == [f"{tmp_path}/home-a"]


def test_the_zsh_script_loads_bash_completion_and_defines_the_same_function() -> None:
    script = subprocess.run([CX, "completion", "zsh"], capture_output=True, text=True, check=True)
    assert script.stdout.startswith("# cx completion for zsh\nautoload -U +X bashcompinit")
    assert "complete -o default -F _cx cx" in script.stdout
    if shutil.which("zsh"):
        subprocess.run(["zsh", "-n", "-c", script.stdout], check=True)
