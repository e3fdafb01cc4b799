"""``cx image`` and ``cx exec`` as a user types them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from executor_support import mounts_under, searchable_dir

from node.cli import main
from node.cli.image import resolve_image
from node.storage.image import ImageError, busybox_entries, image_command, write_layout
from node.storage.store import BlobStore


@pytest.fixture
def home():
    root = searchable_dir("cx-cli-")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def busybox_home():
    """A home with busybox imported, shared by the tests that only run ``cx exec``."""
    root = searchable_dir("cx-cli-exec-")
    h = ["--home", str(root / "home")]
    assert main(["image", "build-rootfs", str(root / "layout"), "--import", *h]) == 0
    yield root / "home"
    assert mounts_under(root) == []  # every cx exec took its mounts with it
    shutil.rmtree(root)


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


@pytest.mark.integration
@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--memory", "0", "is outside"),
        ("--memory", "1", "is outside"),
        ("--memory", "999999999999999999999", "is outside"),
        ("--cpu", "1000000000", "is outside"),
        ("--cpu", "0", "is not a CPU amount"),
        ("--cpu", "-1", "is not a CPU amount"),
        ("--pids", "0", "is outside"),
        ("--pids", "-1", "is outside"),
    ],
)
def test_careless_limits_are_refused_before_anything_runs(
    busybox_home, capsys, option, value, says
):
    # Before: a provider fault with a traceback, a cgroup left behind, a job at 1% CPU, or
    # (--pids 0) a job with no pids limit at all (issue 17, D4).
    code = main(["exec", "--home", str(busybox_home), option, value, "busybox", "--", "true"])
    (err,) = capsys.readouterr().err.strip().splitlines()  # one line, before anything ran
    assert code == 2
    assert err.startswith(f"cx exec: {option}: ")
    assert says in err  # and says what is allowed


@pytest.mark.integration
def test_relative_home(busybox_home, capsys, monkeypatch):
    # Before: "make `home/work/jobs/.../root` private: Permission denied" (issue 17, D5).
    monkeypatch.chdir(busybox_home.parent)
    h = ["--home", busybox_home.name]
    code = main(["exec", *h, "--json", "busybox", "--", "sh", "-c", "echo hi > /out/x"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0, result
    assert [o["path"] for o in result["outputs"]] == ["/out/x"]


def test_a_tag_moves_to_the_image_imported_last_and_docker_names_resolve(home, capsys):
    # Before: importing under a tag again left two images with one name, and
    # `busybox:latest` matched nothing.
    h = ["--home", str(home)]
    other = home / "busybox-other"
    other.write_bytes(Path("/bin/busybox").read_bytes() + b"\0")  # another image, same tag
    other.chmod(0o755)
    digests = []
    for layout, busybox in (("one", "/bin/busybox"), ("two", str(other))):
        assert main(["image", "build-rootfs", str(home / layout), "--busybox", busybox]) == 0
        digests.append(capsys.readouterr().out.strip())
        assert main(["image", "import", str(home / layout), *h]) == 0
        assert capsys.readouterr().out.strip() == digests[-1]
    assert main(["image", "ls", "--json", *h]) == 0
    names = {i["manifest"]: i["names"] for i in json.loads(capsys.readouterr().out)}
    assert names == {digests[0]: [], digests[1]: ["busybox"]}
    store = BlobStore(home / "store")
    assert resolve_image(store, "busybox:latest") == digests[1]
    assert resolve_image(store, digests[0][7:19]) == digests[0]  # the IMAGE ID cx image ls shows


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ("exec", "nosuch:latest", "true"),
            "no imported image is named 'nosuch:latest' (no image is imported yet); "
            "import one with `cx image import PATH`",
        ),
        (("exec", "./missing-layout", "true"), "./missing-layout does not exist"),
        (
            ("image", "import", "{home}/notes.txt"),
            "is not an image: neither an OCI layout directory nor an OCI or `docker save` "
            "archive (not a tar archive)",
        ),
    ],
)
def test_what_is_not_an_image_is_said_in_one_line(home, capsys, argv, says):
    # Before: a wrong path read "no imported image matches", a text file dumped tarfile's
    # four-line list of the compressions it tried.
    (home / "notes.txt").write_text("not an image\n")
    argv = [a.format(home=home) for a in argv]
    assert main([*argv[:2], "--home", str(home), *argv[2:]]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert says in line


def test_the_command_is_the_images_entrypoint_then_the_arguments_or_its_cmd():
    # docker run's rule. Before: the image's CMD and ENTRYPOINT were ignored.
    both = {"Entrypoint": ["/bin/echo", "from"], "Cmd": ["the", "image"]}
    assert image_command(both, []) == ("/bin/echo", "from", "the", "image")
    assert image_command(both, ["you"]) == ("/bin/echo", "from", "you")
    assert image_command({"Cmd": ["/bin/sh"]}, ["true"]) == ("true",)
    assert image_command({"Cmd": ["/bin/sh"]}, []) == ("/bin/sh",)
    with pytest.raises(ImageError, match="names no command"):
        image_command({}, [])


@pytest.mark.integration
def test_exec_runs_the_images_own_command(home, capsys):
    h = ["--home", str(home)]
    config = {"Env": ["PATH=/bin"], "Entrypoint": ["/bin/echo", "from"], "Cmd": ["the", "image"]}
    write_layout(home / "layout", [busybox_entries()], config=config, tag="greeter")
    assert main(["image", "import", str(home / "layout"), *h]) == 0
    capsys.readouterr()
    for argv, said in (([], "from the image"), (["--", "you"], "from you")):
        assert main(["exec", *h, "--json", "greeter", *argv]) == 0
        result = json.loads(capsys.readouterr().out)
        stdout = BlobStore(home / "store").read_bytes(result["stdout"]).decode()
        assert stdout == f"{said}\n"
