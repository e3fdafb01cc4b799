"""``cx image`` and ``cx exec`` as a user types them."""

from __future__ import annotations

import json
import shutil

import pytest
from executor_support import searchable_dir

from node.cli import main


@pytest.fixture
def home():
    root = searchable_dir("cx-cli-")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.integration
def test_build_import_list_exec(home, capsys):
    h = ["--home", str(home)]
    assert main(["image", "build-rootfs", str(home / "layout"), *h]) == 0
    built = capsys.readouterr().out.strip()
    assert main(["image", "import", str(home / "layout"), *h]) == 0
    assert capsys.readouterr().out.strip() == built
    assert main(["image", "ls", "--json", *h]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert (listed["manifest"], listed["names"]) == (built, ["busybox"])

    (home / "in.txt").write_text("hello\n")
    code = main(
        ["exec", *h, "--json", "--memory", "64M", "--timeout", "20s",
         "--input", f"{home / 'in.txt'}:/in/data", "--output-dir", str(home / "got"),
         "busybox", "--", "sh", "-c", "tr a-z A-Z < /in/data > /out/up"]
    )  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert code == 0, result
    assert result["exit_reason"] == "success"
    assert (home / "got" / "up").read_text() == "HELLO\n"
    assert main(["exec", *h, built[:20], "sh", "-c", "exit 4"]) == 4
    assert "nonzero-exit" in capsys.readouterr().out


def test_unusable_input_says_what_to_do(home, capsys):
    assert main(["image", "import", str(home / "missing"), "--home", str(home)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["exec", "--home", str(home), "nosuch", "--", "true"]) == 2
    assert "cx image ls" in capsys.readouterr().err
