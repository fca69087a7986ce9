"""The SQLite store: one file in WAL mode, every batch one transaction, fsync'd before it counts."""

from __future__ import annotations

import os
import sqlite3

from gpud.lifecycle import ACTIVE
from gpud.store.base import SCHEMA_VERSION, Event, Loaded, StoreVersionError, TokenRecord, WriteBatch
from gpud.store.usage import UsageStore

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, seq INTEGER NOT NULL, state TEXT NOT NULL, user TEXT NOT NULL,
    project TEXT NOT NULL, submitted REAL NOT NULL, ended REAL, record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_by_ended ON jobs(ended);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, job TEXT, node TEXT,
    kind TEXT NOT NULL, message TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_by_job ON events(job);
CREATE TABLE IF NOT EXISTS nodes (name TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (
    hash TEXT PRIMARY KEY, user TEXT NOT NULL, admin INTEGER NOT NULL, created REAL NOT NULL,
    allow_root INTEGER NOT NULL DEFAULT 0, revoked REAL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS answers (
    user TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL, status INTEGER NOT NULL,
    body TEXT NOT NULL, created REAL NOT NULL, PRIMARY KEY (user, key));
CREATE INDEX IF NOT EXISTS answers_by_created ON answers(created);
"""
FILE_NAME = "gpud.sqlite"
# An update in place: only the indexes whose columns changed are written (INSERT OR REPLACE deletes and
# inserts the row, rewriting every index), about a third less work per commit.
UPSERT_JOB = ("INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET seq = excluded.seq, "
              "state = excluded.state, user = excluded.user, project = excluded.project, "
              "submitted = excluded.submitted, ended = excluded.ended, record = excluded.record")


def private(path: str) -> None:
    """Make ``path`` readable and writable by its owner alone, if it exists."""
    try:
        os.chmod(path, 0o600)
    except FileNotFoundError:
        pass


def migrate(db: sqlite3.Connection, path: str) -> None:
    """Bring a store written by an earlier gpud up to this schema (columns added since); refuse a later one's."""
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is not None and int(row[0]) > SCHEMA_VERSION:
        raise StoreVersionError(f"the store {path} was written by a newer gpud (schema {row[0]}; this gpud "
                                f"knows {SCHEMA_VERSION}): upgrade gpud on this host")
    columns = {row[1] for row in db.execute("PRAGMA table_info(tokens)")}
    if "allow_root" not in columns:
        db.execute("ALTER TABLE tokens ADD COLUMN allow_root INTEGER NOT NULL DEFAULT 0")
    if "revoked" not in columns:
        db.execute("ALTER TABLE tokens ADD COLUMN revoked REAL")
    if row is None or int(row[0]) < SCHEMA_VERSION:
        db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))


class SQLiteStore:
    """The default store: ``state_dir/gpud.sqlite``, synchronous=FULL so a commit survives power loss."""

    def __init__(self, state_dir: str | os.PathLike, *, synchronous: str = "FULL") -> None:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        os.chmod(state_dir, 0o700)
        self.path = os.path.join(state_dir, FILE_NAME)
        # Jobs' commands and environments are in here: readable by the controller's user alone. SQLite
        # gives the WAL and shared-memory files the database file's mode; older files are tightened too.
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.execute("PRAGMA busy_timeout=5000")
        self.db.executescript(SCHEMA)
        self.synchronous = synchronous
        try:
            migrate(self.db, self.path)
        except StoreVersionError:
            self.db.close()
            raise
        for path in (self.path, self.path + "-wal", self.path + "-shm"):
            private(path)
        self._reader: sqlite3.Connection | None = None

    @property
    def reader(self) -> sqlite3.Connection:
        """A second connection for reads, so a reader never sees a writer's open transaction."""
        if self._reader is None:
            self._reader = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._reader.execute("PRAGMA busy_timeout=5000")
        return self._reader

    def load(self) -> Loaded:
        """Jobs not finished, nodes, tokens and meta, as the controller left them."""
        marks = ",".join("?" * len(ACTIVE))
        jobs = [row[0] for row in self.db.execute(
            f"SELECT record FROM jobs WHERE state IN ({marks}) ORDER BY seq", sorted(ACTIVE))]
        nodes = dict(self.db.execute("SELECT name, record FROM nodes"))
        tokens = {row[0]: TokenRecord(row[0], row[1], bool(row[2]), row[3], bool(row[4]), row[5]) for row in
                  self.db.execute("SELECT hash, user, admin, created, allow_root, revoked FROM tokens")}
        meta = dict(self.db.execute("SELECT key, value FROM meta"))
        (last_seq,) = self.db.execute("SELECT COALESCE(MAX(seq), 0) FROM jobs").fetchone()
        return Loaded(jobs, nodes, tokens, meta, last_seq)

    def meta_value(self, key: str) -> str | None:
        """One setting of the meta table, or None."""
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        """Store one setting now (its own transaction)."""
        self.write(WriteBatch(meta={key: value}))

    def populated(self) -> bool:
        """True when the store holds any job or token: it is some cluster's memory, not a new file."""
        return any(self.db.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone() for table in ("jobs", "tokens"))

    def write(self, batch: WriteBatch) -> None:
        """Write the batch in one transaction (rolled back whole on error)."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            if batch.jobs:
                db.executemany(UPSERT_JOB, batch.jobs)
            if batch.events:
                db.executemany("INSERT INTO events(time, job, node, kind, message) VALUES (?, ?, ?, ?, ?)",
                               [(e.time, e.job, e.node, e.kind, e.message) for e in batch.events])
            if batch.nodes:
                db.executemany("INSERT OR REPLACE INTO nodes VALUES (?, ?)", batch.nodes)
            if batch.tokens:
                db.executemany("INSERT OR REPLACE INTO tokens(hash, user, admin, created, allow_root, revoked) "
                               "VALUES (?, ?, ?, ?, ?, ?)",
                               [(t.hash, t.user, int(t.admin), t.created, int(t.allow_root), t.revoked)
                                for t in batch.tokens])
            if batch.meta:
                db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", batch.meta.items())
            if batch.answers:
                db.executemany("INSERT OR REPLACE INTO answers VALUES (?, ?, ?, ?, ?, ?)", batch.answers)
            db.execute("COMMIT")
        except BaseException:
            # SQLite rolls some failures back itself (a full disk at COMMIT does); never leave one open, or
            # every later BEGIN would fail and the store would stay refused after space is freed.
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def job(self, job_id: str) -> str | None:
        """One job's record, or None."""
        row = self.reader.execute("SELECT record FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return row[0] if row else None

    def array_jobs(self, array_id: str) -> list[str]:
        """The records of every element of array ``array_id`` (ids ``42_0``, ``42_1``, ...), finished or not."""
        # A range on the primary key, not LIKE (case-insensitive, so it would scan the table): '`' follows '_'.
        rows = self.reader.execute("SELECT record FROM jobs WHERE id > ? AND id < ?",
                                   (f"{array_id}_", f"{array_id}`")).fetchall()
        return [row[0] for row in rows]

    def array_states(self, array_id: str) -> dict[str, int]:
        """How many elements of array ``array_id`` the store holds in each state."""
        return dict(self.reader.execute("SELECT state, COUNT(*) FROM jobs WHERE id > ? AND id < ? GROUP BY state",
                                        (f"{array_id}_", f"{array_id}`")))

    def jobs_state(self, job_ids: list[str]) -> dict[str, str]:
        """The state of each known job among ``job_ids``."""
        found: dict[str, str] = {}
        for start in range(0, len(job_ids), 500):
            chunk = job_ids[start:start + 500]
            marks = ",".join("?" * len(chunk))
            found.update(self.reader.execute(f"SELECT id, state FROM jobs WHERE id IN ({marks})", chunk))
        return found

    def history(self, *, since: float | None, user: str | None, project: str | None,
                limit: int) -> list[str]:
        """Finished jobs' records, most recently ended first."""
        sql = "SELECT record FROM jobs WHERE ended IS NOT NULL"
        args: list = []
        for column, value in (("ended >=", since), ("user =", user), ("project =", project)):
            if value is not None:
                sql += f" AND {column} ?"
                args.append(value)
        sql += " ORDER BY ended DESC LIMIT ?"
        args.append(limit)
        return [row[0] for row in self.reader.execute(sql, args)]

    def events(self, job_id: str, limit: int = 200) -> list[Event]:
        """The job's events, oldest first (the last ``limit``)."""
        rows = self.reader.execute("SELECT time, kind, message, job, node FROM events WHERE job = ? "
                               "ORDER BY id DESC LIMIT ?", (job_id, limit)).fetchall()
        return [Event(*row) for row in reversed(rows)]

    def answer(self, user: str, key: str) -> tuple[str, int, str] | None:
        """The stored answer to ``user``'s idempotent request ``key``: (fingerprint, status, answer JSON)."""
        row = self.reader.execute("SELECT fingerprint, status, body FROM answers WHERE user = ? AND key = ?",
                                  (user, key)).fetchone()
        return (row[0], row[1], row[2]) if row else None

    def forget_answers(self, before: float) -> int:
        """Delete the answers to idempotent requests made before ``before``; returns how many."""
        return self.db.execute("DELETE FROM answers WHERE created < ?", (before,)).rowcount

    def usage(self, synchronous: str | None = None) -> UsageStore:
        """The decayed-usage tables of this file, on a connection of their own."""
        return UsageStore(self.path, synchronous=synchronous or self.synchronous)

    def close(self) -> None:
        """Close the database file."""
        if self._reader is not None:
            self._reader.close()
        self.db.close()
