"""The node's durable state: one SQLite database in WAL mode under the home directory.

Rules:
- Everything that must survive ``kill -9`` is written here before the node acts on it or
  acknowledges it to a peer: our own orders, the buyer's jobs and their events, every
  agreement with its job state, receipts (provider-signed, then countersigned), the ledger
  and the outbox of messages still to deliver. ``synchronous=NORMAL`` in WAL mode: a
  committed transaction survives ``kill -9`` of the node (it is in the WAL, which the kernel
  holds), without an fsync per commit.
- Receipts and the ledger survive a power cut too: a transaction that writes them
  (``atomic(durable=True)``) fsyncs the WAL when it commits, and with it every commit
  before it. A power cut may roll back the other commits since the last such sync.
  Inside :meth:`Database.synced_off_loop` (a trio task's block of plain calls) that fsync
  runs in a worker thread when the block ends, and the task goes on only after it: the
  event loop serves the node's other work for the milliseconds a disk sync takes.
- A countersigned receipt and its ledger entry are written in one transaction, so the
  ledger never holds an entry without its receipt, nor a receipt without its entry.
- A provider marks an agreement ``started`` before its container starts; after a crash a
  started agreement with no receipt is known to have been interrupted, never re-run.
- Calls are short and synchronous (the trio node calls them inline): no statement scans
  more than one node's own history.
- One bad row never stops a node: a row its reader cannot parse is *quarantined*
  (:meth:`Database.quarantine`: copied aside with the reason, then deleted, in one
  transaction) and the node goes on without it. A damaged file (SQLite's own check fails)
  is :class:`DamagedDatabase`, one line that says what to do.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import trio

from protocol.settlement import LedgerEntry

__all__ = ["AgreementRow", "DamagedDatabase", "Database", "JobRow"]

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    id BLOB PRIMARY KEY, kind TEXT NOT NULL, wire BLOB NOT NULL, expires_ms INTEGER NOT NULL,
    job_id TEXT
);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, name TEXT, request TEXT NOT NULL, state TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '', created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL,
    bid_id BLOB, agreement_id BLOB, provider TEXT, attempts INTEGER NOT NULL DEFAULT 0,
    max_cost INTEGER, cost INTEGER, exit_reason TEXT, exit_code INTEGER,
    outputs TEXT NOT NULL DEFAULT '[]', logs TEXT NOT NULL DEFAULT '[]', checkpoint TEXT,
    prices TEXT
);
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL, seq INTEGER NOT NULL, at_ms INTEGER NOT NULL, state TEXT NOT NULL,
    detail TEXT NOT NULL, PRIMARY KEY (job_id, seq)
);
CREATE TABLE IF NOT EXISTS agreements (
    id BLOB PRIMARY KEY, role TEXT NOT NULL, wire BLOB NOT NULL, state TEXT NOT NULL,
    peer TEXT NOT NULL, job_id TEXT, started_ms INTEGER, created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS receipts (
    agreement_id BLOB PRIMARY KEY, receipt BLOB NOT NULL, countersigned BLOB
);
CREATE TABLE IF NOT EXISTS ledger (
    agreement_id BLOB PRIMARY KEY, payer BLOB NOT NULL, payee BLOB NOT NULL,
    amount INTEGER NOT NULL, at_ms INTEGER NOT NULL
);
-- A provider's quotas ask what each payer paid it today at every proposal (paid_to).
CREATE INDEX IF NOT EXISTS ledger_payee_at ON ledger (payee, at_ms);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, agreement_id BLOB NOT NULL, peer TEXT NOT NULL,
    wire BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS trusted_aks (
    provider BLOB NOT NULL, ak_name BLOB NOT NULL, PRIMARY KEY (provider, ak_name)
);
CREATE TABLE IF NOT EXISTS tape (
    trade_id BLOB PRIMARY KEY, at_ms INTEGER NOT NULL, wire BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS summaries (
    agreement_id BLOB PRIMARY KEY, summary BLOB NOT NULL, payer_sig BLOB, payee_sig BLOB,
    at_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS summaries_at ON summaries (at_ms);
CREATE TABLE IF NOT EXISTS quarantine (
    id INTEGER PRIMARY KEY AUTOINCREMENT, source TEXT NOT NULL, record TEXT NOT NULL,
    reason TEXT NOT NULL, at_ms INTEGER NOT NULL
);
"""
# The column that names one row of each table a reader may quarantine.
_KEYS = {
    "orders": "id",
    "jobs": "id",
    "agreements": "id",
    "receipts": "agreement_id",
    "ledger": "agreement_id",
    "outbox": "id",
    "tape": "trade_id",
    "summaries": "agreement_id",
}


class DamagedDatabase(Exception):
    """The database file is not one SQLite can use; the message says what to do."""


@dataclass(slots=True, kw_only=True)
class JobRow:
    """A buyer's job: what the user asked for and where it stands (one per ``cx run``)."""

    id: str
    name: str | None
    request: str  # the job request as JSON (node.market.request parses it)
    state: str
    created_ms: int
    updated_ms: int
    detail: str = ""
    bid_id: bytes | None = None
    agreement_id: bytes | None = None
    provider: str | None = None
    attempts: int = 0
    max_cost: int | None = None
    cost: int | None = None
    exit_reason: str | None = None
    exit_code: int | None = None
    outputs: list[dict[str, Any]] | None = None
    logs: list[dict[str, Any]] | None = None
    checkpoint: str | None = None
    prices: dict[str, int] | None = None


_JSON_FIELDS = frozenset({"outputs", "logs", "prices"})


@dataclass(frozen=True, slots=True)
class AgreementRow:
    id: bytes
    role: str  # "buyer" or "provider"
    wire: bytes
    state: str
    peer: str
    job_id: str | None
    started_ms: int | None
    created_ms: int


@dataclass(slots=True)
class _Due:
    """The databases whose durable commits wait for the end of a synced_off_loop block."""

    databases: set[Database] = field(default_factory=set)
    open: bool = True


_SYNCS_DUE: contextvars.ContextVar[_Due | None] = contextvars.ContextVar(
    "cx_db_syncs_due", default=None
)


class Database:
    def __init__(self, path: Path | str) -> None:
        """Open (or create) the database at ``path`` and check it.

        Raises:
            DamagedDatabase: SQLite cannot read it, or its own integrity check fails.
        """
        self._conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._depth = 0
        self._durable = False  # the open transaction must reach the disk when it commits
        self._wal = None if str(path) == ":memory:" else Path(f"{path}-wal")
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA foreign_keys=ON")
            (verdict,) = self._conn.execute("PRAGMA quick_check(1)").fetchone()
            if verdict != "ok":
                raise sqlite3.DatabaseError(verdict.replace("*** in database main ***", ""))
            self._conn.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "unreadable"
            raise DamagedDatabase(
                f"{path} is damaged ({first}); restore it from a backup, or move it aside to "
                "start with an empty state (its jobs and ledger are then lost)"
            ) from None

    def close(self) -> None:
        self._conn.close()

    @contextlib.contextmanager
    def atomic(self, *, durable: bool = False) -> Iterator[None]:
        """One transaction around the block; nested blocks join the outer one. ``durable``:
        the whole transaction is on disk (the WAL fsynced) when the outermost block ends."""
        if self._depth == 0:
            self._conn.execute("BEGIN IMMEDIATE")
            self._durable = False
        self._durable |= durable
        self._depth += 1
        try:
            yield
        except BaseException:
            self._depth -= 1
            if self._depth == 0:
                self._conn.execute("ROLLBACK")
            raise
        self._depth -= 1
        if self._depth == 0:
            self._conn.execute("COMMIT")
            if self._durable:
                due = _SYNCS_DUE.get()
                if due is None or not due.open:  # (a task started in a block outlives it)
                    self._sync_wal()
                else:
                    due.databases.add(self)

    @contextlib.asynccontextmanager
    async def synced_off_loop(self) -> AsyncIterator[None]:
        """Durable commits in the block (this task's, per context) fsync the WAL when it
        ends, in a worker thread; the caller goes on, and so acknowledges anything, only
        after that sync."""
        due = _Due()
        token = _SYNCS_DUE.set(due)
        try:
            yield
        finally:
            due.open = False
            _SYNCS_DUE.reset(token)
            with trio.CancelScope(shield=True):  # committed: it reaches the disk
                for db in due.databases:
                    await trio.to_thread.run_sync(db._sync_wal)

    def _sync_wal(self) -> None:
        # What synchronous=FULL does at every commit, done for the commits that need it.
        if self._wal is None:
            return
        try:
            fd = os.open(self._wal, os.O_RDONLY)
        except FileNotFoundError:  # checkpointed away: the database file holds it, synced
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _run(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        with self.atomic():
            return self._conn.execute(sql, args)

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, args).fetchall()

    # -- our own orders ------------------------------------------------------------------

    def save_order(
        self, order_id: bytes, kind: str, wire: bytes, expires_ms: int, job_id: str | None
    ) -> None:
        self._run(
            "INSERT OR REPLACE INTO orders VALUES (?, ?, ?, ?, ?)",
            (order_id, kind, wire, expires_ms, job_id),
        )

    def drop_order(self, order_id: bytes) -> None:
        self._run("DELETE FROM orders WHERE id = ?", (order_id,))

    def orders(self) -> list[tuple[bytes, str, bytes, int, str | None]]:
        """(id, kind, wire, expires_ms, job_id) of every order we still hold."""
        return [(r[0], r[1], r[2], r[3], r[4]) for r in self._rows("SELECT * FROM orders")]

    # -- the buyer's jobs ----------------------------------------------------------------

    def add_job(self, job: JobRow) -> None:
        values = {f.name: getattr(job, f.name) for f in fields(job)}
        for name in _JSON_FIELDS:
            values[name] = json.dumps(values[name] if values[name] is not None else [])
        if job.prices is None:
            values["prices"] = None
        cols = ", ".join(values)
        marks = ", ".join("?" * len(values))
        self._run(f"INSERT INTO jobs ({cols}) VALUES ({marks})", tuple(values.values()))  # noqa: S608

    def update_job(self, job_id: str, **changes: Any) -> None:  # noqa: ANN401 - column values
        for name in _JSON_FIELDS & changes.keys():
            changes[name] = json.dumps(changes[name])
        assignments = ", ".join(f"{name} = ?" for name in changes)
        self._run(f"UPDATE jobs SET {assignments} WHERE id = ?", (*changes.values(), job_id))  # noqa: S608

    def job(self, job_id: str) -> JobRow | None:
        rows = self._job_rows("WHERE id = ?", (job_id,))
        return rows[0] if rows else None

    def jobs_by_prefix(self, prefix: str) -> list[JobRow]:
        """The jobs whose id starts with ``prefix`` (at most two: enough to see ambiguity)."""
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        return self._job_rows("WHERE id LIKE ? || '%' ESCAPE '\\' LIMIT 2", (escaped,))

    def jobs(self) -> list[JobRow]:
        return self._job_rows("ORDER BY created_ms DESC, id", ())

    def state_counts(self, role: str | None = None) -> dict[str, int]:
        """How many of this node's jobs are in each state (``role`` None), or how many of
        its agreements in that role (buyer, provider)."""
        if role is None:
            rows = self._rows("SELECT state, COUNT(*) FROM jobs GROUP BY state")
        else:
            rows = self._rows(
                "SELECT state, COUNT(*) FROM agreements WHERE role = ? GROUP BY state", (role,)
            )
        return {str(state): int(n) for state, n in rows}

    def _job_rows(self, where: str, args: tuple[Any, ...]) -> list[JobRow]:
        cursor = self._conn.execute(f"SELECT * FROM jobs {where}", args)  # noqa: S608
        names = [d[0] for d in cursor.description]
        out = []
        for row in cursor.fetchall():
            values = dict(zip(names, row, strict=True))
            for name in _JSON_FIELDS:
                if values[name] is not None:
                    values[name] = json.loads(values[name])
            out.append(JobRow(**values))
        return out

    def sweep_jobs(self, at_ms: int) -> int:
        """Quarantine every job row whose stored JSON does not read; how many."""
        bad = []
        for job_id, *columns in self._rows("SELECT id, outputs, logs, prices FROM jobs"):
            try:
                for text in columns:
                    if text is not None and not isinstance(json.loads(text), list | dict):
                        raise ValueError("not a list or object")
            except ValueError as exc:
                bad.append((job_id, f"unreadable JSON column: {exc}"))
        for job_id, reason in bad:
            self.quarantine("jobs", job_id, reason, at_ms)
        return len(bad)

    def add_event(self, job_id: str, at_ms: int, state: str, detail: str) -> int:
        with self.atomic():
            (last,) = self._conn.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM events WHERE job_id = ?", (job_id,)
            ).fetchone()
            self._conn.execute(
                "INSERT INTO events VALUES (?, ?, ?, ?, ?)",
                (job_id, last + 1, at_ms, state, detail),
            )
            self._conn.execute(
                "UPDATE jobs SET state = ?, detail = ?, updated_ms = ? WHERE id = ?",
                (state, detail, at_ms, job_id),
            )
        return int(last) + 1

    def events(self, job_id: str, after: int = 0) -> list[dict[str, Any]]:
        return [
            {"seq": seq, "at_ms": at, "state": state, "detail": detail}
            for seq, at, state, detail in self._rows(
                "SELECT seq, at_ms, state, detail FROM events WHERE job_id = ? AND seq > ? "
                "ORDER BY seq",
                (job_id, after),
            )
        ]

    # -- agreements ----------------------------------------------------------------------

    def save_agreement(
        self,
        agreement_id: bytes,
        *,
        role: str,
        wire: bytes,
        state: str,
        peer: str,
        job_id: str | None,
        created_ms: int,
    ) -> None:
        self._run(
            "INSERT INTO agreements VALUES (?, ?, ?, ?, ?, ?, NULL, ?)",
            (agreement_id, role, wire, state, peer, job_id, created_ms),
        )

    def set_agreement_state(self, agreement_id: bytes, state: str) -> None:
        self._run("UPDATE agreements SET state = ? WHERE id = ?", (state, agreement_id))

    def mark_started(self, agreement_id: bytes, at_ms: int) -> None:
        self._run("UPDATE agreements SET started_ms = ? WHERE id = ?", (at_ms, agreement_id))

    def agreement(self, agreement_id: bytes) -> AgreementRow | None:
        rows = self._rows("SELECT * FROM agreements WHERE id = ?", (agreement_id,))
        return AgreementRow(*rows[0]) if rows else None

    def agreements(self) -> list[AgreementRow]:
        return [AgreementRow(*r) for r in self._rows("SELECT * FROM agreements ORDER BY rowid")]

    # -- receipts and the ledger -----------------------------------------------------------

    def save_receipt(self, agreement_id: bytes, receipt: bytes) -> None:
        with self.atomic(durable=True):
            self._conn.execute(
                "INSERT OR IGNORE INTO receipts VALUES (?, ?, NULL)", (agreement_id, receipt)
            )

    def settle(self, entry: LedgerEntry, receipt: bytes, countersigned: bytes, at_ms: int) -> None:
        """Record the countersigned receipt and its ledger entry together, durably."""
        with self.atomic(durable=True):
            self._conn.execute(
                "INSERT INTO receipts VALUES (?, ?, ?) ON CONFLICT(agreement_id) "
                "DO UPDATE SET countersigned = excluded.countersigned",
                (entry.agreement_id, receipt, countersigned),
            )
            self._conn.execute(
                "INSERT INTO ledger VALUES (?, ?, ?, ?, ?)",
                (entry.agreement_id, entry.payer, entry.payee, entry.amount, at_ms),
            )

    def paid_to(self, payee: bytes, since_ms: int) -> dict[bytes, int]:
        """What each payer paid ``payee`` in entries settled from ``since_ms`` (quotas)."""
        rows = self._rows(
            "SELECT payer, SUM(amount) FROM ledger WHERE payee = ? AND at_ms >= ? GROUP BY payer",
            (payee, since_ms),
        )
        return {bytes(payer): int(total) for payer, total in rows}

    def receipt(self, agreement_id: bytes) -> tuple[bytes, bytes | None] | None:
        """(provider-signed receipt, countersigned receipt or None)."""
        rows = self._rows(
            "SELECT receipt, countersigned FROM receipts WHERE agreement_id = ?", (agreement_id,)
        )
        return (rows[0][0], rows[0][1]) if rows else None

    def ledger(self) -> list[tuple[LedgerEntry, int]]:
        """Every settled entry with its time, oldest first."""
        return [
            (LedgerEntry(agreement_id=a, payer=p, payee=q, amount=n), at)
            for a, p, q, n, at in self._rows("SELECT * FROM ledger ORDER BY at_ms, rowid")
        ]

    # -- outbox: messages a peer has not acknowledged yet ---------------------------------

    def queue(self, agreement_id: bytes, peer: str, wire: bytes) -> int:
        cursor = self._run(
            "INSERT INTO outbox (agreement_id, peer, wire) VALUES (?, ?, ?)",
            (agreement_id, peer, wire),
        )
        return int(cursor.lastrowid or 0)

    def delivered(self, item_id: int) -> None:
        self._run("DELETE FROM outbox WHERE id = ?", (item_id,))

    def outbox(self) -> list[tuple[int, bytes, str, bytes]]:
        """(id, agreement id, peer, wire), in the order they were queued."""
        return [(r[0], r[1], r[2], r[3]) for r in self._rows("SELECT * FROM outbox ORDER BY id")]

    # -- rows set aside ---------------------------------------------------------------

    def quarantine(self, table: str, key: object, reason: str, at_ms: int) -> None:
        """Set aside the row of ``table`` named by ``key`` (its key column's value): it is
        copied with ``reason`` into ``quarantine`` and deleted, in one transaction."""
        column = _KEYS[table]
        with self.atomic():
            cursor = self._conn.execute(
                f"SELECT * FROM {table} WHERE {column} = ?",  # noqa: S608 - names from _KEYS
                (key,),
            )
            names = [d[0] for d in cursor.description]
            for row in cursor.fetchall():
                values = zip(names, row, strict=True)
                record = {n: v.hex() if isinstance(v, bytes) else v for n, v in values}
                self._conn.execute(
                    "INSERT INTO quarantine (source, record, reason, at_ms) VALUES (?, ?, ?, ?)",
                    (table, json.dumps(record), reason, at_ms),
                )
            self._conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (key,))  # noqa: S608
        shown = key.hex() if isinstance(key, bytes) else key
        log.warning("set aside %s row %s (see its quarantine table): %s", table, shown, reason)

    def quarantined(self) -> list[dict[str, Any]]:
        """The rows set aside, oldest first: ``{source, record, reason, at_ms}``."""
        return [
            {"source": src, "record": json.loads(rec), "reason": why, "at_ms": at}
            for src, rec, why, at in self._rows(
                "SELECT source, record, reason, at_ms FROM quarantine ORDER BY id"
            )
        ]

    # -- attestation keys this buyer trusts -----------------------------------------------

    def trust_ak(self, provider: bytes, ak_name: bytes) -> None:
        self._run("INSERT OR IGNORE INTO trusted_aks VALUES (?, ?)", (provider, ak_name))

    def trusted_aks(self) -> list[tuple[bytes, bytes]]:
        return [(p, n) for p, n in self._rows("SELECT * FROM trusted_aks")]

    # -- the tape: public trade prints (a print lost to a crash is fetched again) ------

    def save_prints(self, prints: list[tuple[bytes, int, bytes]]) -> None:
        """``(trade_id, at_ms, wire)`` rows in one transaction: one commit for many."""
        with self.atomic():
            self._conn.executemany("INSERT OR IGNORE INTO tape VALUES (?, ?, ?)", prints)

    def prints(self, since_ms: int) -> list[tuple[bytes, bytes]]:
        """``(trade_id, wire)`` of the prints at or after ``since_ms``, oldest first."""
        sql = "SELECT trade_id, wire FROM tape WHERE at_ms >= ? ORDER BY at_ms"
        return [(t, w) for t, w in self._rows(sql, (since_ms,))]

    def forget_prints_before(self, at_ms: int) -> None:
        self._run("DELETE FROM tape WHERE at_ms < ?", (at_ms,))

    # -- receipt summaries (node/market/reputation.py) -------------------------------------

    def save_summaries(
        self, rows: list[tuple[bytes, bytes, bytes | None, bytes | None, int]]
    ) -> None:
        """Store receipt summaries, ``(agreement_id, summary, payer_sig, payee_sig, at_ms)``,
        in one transaction; a signature already stored is kept where none is given."""
        with self.atomic():
            self._conn.executemany(
                "INSERT INTO summaries VALUES (?, ?, ?, ?, ?) ON CONFLICT (agreement_id)"
                " DO UPDATE SET payer_sig = COALESCE(excluded.payer_sig, payer_sig),"
                " payee_sig = COALESCE(excluded.payee_sig, payee_sig)",
                rows,
            )

    def summaries(self) -> list[tuple[bytes, bytes, bytes | None, bytes | None]]:
        """Every stored summary: agreement id, summary bytes, payer's and payee's signature."""
        return [
            (a, s, p, q)
            for a, s, p, q in self._rows(
                "SELECT agreement_id, summary, payer_sig, payee_sig FROM summaries"
            )
        ]

    def signed_summaries(self, limit: int) -> list[tuple[bytes, bytes, bytes]]:
        """The newest ``limit`` summaries signed by both parties: bytes, payer's and payee's
        signature."""
        sql = (
            "SELECT summary, payer_sig, payee_sig FROM summaries WHERE payer_sig NOTNULL"
            " AND payee_sig NOTNULL ORDER BY at_ms DESC LIMIT ?"
        )
        return [(s, p, q) for s, p, q in self._rows(sql, (limit,))]

    def forget_summaries(self, before_ms: int) -> int:
        """Drop the summaries of receipts issued before ``before_ms``; returns how many."""
        return self._run("DELETE FROM summaries WHERE at_ms < ?", (before_ms,)).rowcount
