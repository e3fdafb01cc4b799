"""The README's "Running a node" example, run as written: a provider and a buyer from
`cx init` with their default prices, a job through `cx run`, as a newcomer pastes it.
Before: the example named an image only a later section made, and `cx init`'s defaults
(90 credits/core-hour, 9/GiB-hour) never traded with `cx run --max-price 1.5`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from executor_support import searchable_dir

pytestmark = pytest.mark.integration

README = Path(__file__).parents[2] / "README.md"


def section_script(title: str) -> str:
    """The first ```sh block after the heading ``title``."""
    text = README.read_text()
    section = text[text.index(f"## {title}\n") :]
    match = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert match is not None, f"no sh block under {title!r}"
    return match.group(1)


def test_the_readme_running_a_node_example_trades_as_written():
    script = section_script("Running a node")
    work = searchable_dir("cx-readme-")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "CX_HOME": str(work / "default-home"),  # the example names its homes; keep it so
    }
    # The harness's only addition: on exit the shell stops the nodes it started and waits.
    harness = "trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\nset -euo pipefail\n"
    proc = subprocess.run(
        ["bash", "-c", harness + script],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    logs = "".join(
        f"\n--- {p.name} ---\n{p.read_text()[-3000:]}" for p in sorted(work.glob("*.log"))
    )
    assert proc.returncode == 0, proc.stderr + logs
    lines = proc.stdout.splitlines()
    assert "hello" in lines
    jobs = next(i for i, line in enumerate(lines) if line.startswith("ID "))
    assert lines[jobs + 1].split()[2] in ("succeeded", "settled"), proc.stdout
    assert any(line.startswith("balance: ") and "-" not in line for line in lines), proc.stdout
