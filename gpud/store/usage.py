"""Decayed usage in the controller's SQLite file: one table of amounts and the instant they are decayed to.

It has its own connection, so a charge is its own small transaction and
never shares one with the controller's job writes.
"""

from __future__ import annotations

import sqlite3

from gpud.accounting.decay import Amount, UsageKey

SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    level TEXT NOT NULL, pool TEXT NOT NULL, name TEXT NOT NULL,
    gpu_s REAL NOT NULL, cpu_s REAL NOT NULL, memory_gib_s REAL NOT NULL, PRIMARY KEY (level, pool, name));
CREATE TABLE IF NOT EXISTS usage_clock (id INTEGER PRIMARY KEY CHECK (id = 0), as_of REAL NOT NULL);
"""


class UsageStore:
    """The ``usage`` tables of the store file at ``path``; calls block and come from one thread at a time."""

    def __init__(self, path: str, *, synchronous: str = "FULL") -> None:
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.execute("PRAGMA busy_timeout=5000")
        self.db.executescript(SCHEMA)

    def load(self) -> tuple[dict[UsageKey, Amount], float | None]:
        """The stored amounts and the instant they are decayed to (None when nothing was ever charged)."""
        rows = {(level, pool, name): (gpu, cpu, memory) for level, pool, name, gpu, cpu, memory in
                self.db.execute("SELECT level, pool, name, gpu_s, cpu_s, memory_gib_s FROM usage")}
        row = self.db.execute("SELECT as_of FROM usage_clock WHERE id = 0").fetchone()
        return rows, (row[0] if row else None)

    def save(self, rows: dict[UsageKey, Amount], as_of: float) -> None:
        """Replace the amounts and their instant in one transaction; durable when this returns."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("DELETE FROM usage")
            db.executemany("INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?)",
                           [(*key, *amount) for key, amount in rows.items()])
            db.execute("INSERT OR REPLACE INTO usage_clock VALUES (0, ?)", (as_of,))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def ended_between(self, since: float, until: float) -> list[str]:
        """The records (JSON) of jobs that ended in [since, until), oldest end first."""
        return [row[0] for row in self.db.execute(
            "SELECT record FROM jobs WHERE ended >= ? AND ended < ? ORDER BY ended", (since, until))]

    def close(self) -> None:
        """Close the connection."""
        self.db.close()
