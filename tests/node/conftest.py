"""Fixtures shared by the node tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio.testing
from executor_support import searchable_dir

from node.storage.image import busybox_entries, write_layout


@pytest.fixture(scope="module")
def image_layout() -> Iterator[Path]:
    """A busybox OCI layout, imported into each buyer's store by ``Cluster.buyer``."""
    root = searchable_dir("cx-market-image-")
    write_layout(root / "layout", [busybox_entries()])
    yield root / "layout"
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """trio's MockClock, for a test that asks for it (pytest-trio runs the test on it). It
    jumps only after the loop has been idle this long in real time, so a worker thread
    (store I/O) finishing is never mistaken for a market with nothing left to do."""
    return trio.testing.MockClock(autojump_threshold=0.005)
