"""swtpm fixtures: each test gets its own running software TPM on free ports.

Manufacturing (EK certificates, ~1 s) happens once per session per TPM identity; each test
copies that state, starts swtpm on it and stops it afterwards.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.tpm import swtpm


@pytest.fixture(scope="session")
def tpm_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tpm-template")
    swtpm.manufacture(directory)
    return directory


@pytest.fixture(scope="session")
def other_tpm_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("other-tpm-template")
    swtpm.manufacture(directory)
    return directory


def _run(template: Path, target: Path) -> Iterator[swtpm.Swtpm]:
    shutil.copytree(template, target)
    tpm = swtpm.start(target)
    try:
        yield tpm
    finally:
        tpm.stop()


@pytest.fixture
def tpm(tpm_template: Path, tmp_path: Path) -> Iterator[swtpm.Swtpm]:
    yield from _run(tpm_template, tmp_path / "tpm")


@pytest.fixture
def other_tpm(other_tpm_template: Path, tmp_path: Path) -> Iterator[swtpm.Swtpm]:
    yield from _run(other_tpm_template, tmp_path / "other-tpm")
