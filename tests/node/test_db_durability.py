"""The node's database: every commit survives kill -9; receipts and the ledger reach the disk.

Commits run with ``synchronous=NORMAL`` (no fsync each); a transaction that writes a
receipt or a ledger entry fsyncs the WAL when it commits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from node.storage.db import Database, JobRow
from protocol.settlement import LedgerEntry

ENTRY = LedgerEntry(agreement_id=b"\x02" * 32, payer=b"b" * 32, payee=b"p" * 32, amount=7)


def test_commits_survive_kill_9_of_the_writer(tmp_path: Path):
    path = tmp_path / "node.db"
    writer = textwrap.dedent(
        f"""
        import os, signal
        from node.storage.db import Database, JobRow
        from protocol.settlement import LedgerEntry
        db = Database({str(path)!r})
        db.add_job(JobRow(id="j1", name=None, request="{{}}", state="queued",
                          created_ms=1, updated_ms=1))
        db.update_job("j1", state="running")
        db.save_receipt(b"\\x01" * 32, b"receipt")
        entry = LedgerEntry(agreement_id=b"\\x02" * 32, payer=b"b" * 32, payee=b"p" * 32,
                            amount=7)
        db.settle(entry, b"r2", b"countersigned", 9)
        db.update_job("j1", state="ended")
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", writer], check=False, timeout=60)
    assert done.returncode == -signal.SIGKILL
    db = Database(path)
    job = db.job("j1")
    assert job is not None
    assert job.state == "ended"
    assert db.receipt(b"\x01" * 32) == (b"receipt", None)
    assert db.receipt(ENTRY.agreement_id) == (b"r2", b"countersigned")
    assert db.ledger() == [(ENTRY, 9)]


@pytest.fixture
def wal_syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files fsynced, by name (a spy: the real fsync still runs)."""
    synced: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return synced


def test_only_receipts_and_the_ledger_fsync(tmp_path: Path, wal_syncs: list[str]):
    db = Database(tmp_path / "node.db")
    db.add_job(JobRow(id="j1", name=None, request="{}", state="queued", created_ms=1, updated_ms=1))
    db.update_job("j1", state="running")
    db.add_event("j1", 2, "running", "")
    assert wal_syncs == []
    db.save_receipt(b"\x01" * 32, b"receipt")
    assert wal_syncs == [f"{tmp_path / 'node.db'}-wal"]
    with db.atomic():  # a receipt written inside a larger transaction syncs it all, once
        db.update_job("j1", state="ended")
        db.settle(ENTRY, b"r2", b"countersigned", 9)
        assert len(wal_syncs) == 1
    assert len(wal_syncs) == 2
    db.update_job("j1", detail="after")
    assert len(wal_syncs) == 2


async def test_a_sync_left_to_a_worker_thread_is_done_before_the_block_ends(
    tmp_path: Path, wal_syncs: list[str]
) -> None:
    db = Database(tmp_path / "node.db")
    async with db.synced_off_loop():
        db.settle(ENTRY, b"r", b"countersigned", 9)
        assert wal_syncs == []  # committed (kill -9 safe), not yet on disk
    assert wal_syncs == [f"{tmp_path / 'node.db'}-wal"]
    db.save_receipt(b"\x01" * 32, b"receipt")  # outside the block: at its commit again
    assert len(wal_syncs) == 2
