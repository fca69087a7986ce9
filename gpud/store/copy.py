"""Move a cluster from a SQLite file into an empty PostgreSQL database: every table, one transaction.

The source must not be in use (its controller holds the state directory's
lock while it runs), and the database must hold no cluster yet, so a copy
never mixes two clusters. The cluster key, kept beside the SQLite file in
``cluster.key``, moves into the database with the cluster id, so nodes
keep theirs.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from typing import Any

from gpud.store.sqlite import FILE_NAME

# (table, its columns in SQLite, the same in PostgreSQL): copied in this order, in chunks of CHUNK rows.
TABLES = (
    ("jobs", "id, seq, state, user, project, submitted, ended, record",
     'id, seq, state, "user", project, submitted, ended, record'),
    ("events", "id, time, job, node, kind, message", "id, time, job, node, kind, message"),
    ("nodes", "name, record", "name, record"),
    ("tokens", "hash, user, admin != 0, created, allow_root != 0, revoked",
     'hash, "user", admin, created, allow_root, revoked'),
    ("meta", "key, value", "key, value"),
    ("answers", "user, key, fingerprint, status, body, created", '"user", key, fingerprint, status, body, created'),
    ("usage", "level, pool, name, gpu_s, cpu_s, memory_gib_s", "level, pool, name, gpu_s, cpu_s, memory_gib_s"),
    ("usage_clock", "id, as_of", "id, as_of"),
)
CHUNK = 5000


class CopyError(RuntimeError):
    """The copy cannot be made; the message says why and what to do. Nothing was written."""


def sqlite_source(text: str) -> tuple[str, str]:
    """``sqlite:PATH`` (the store file, or the state directory holding it) as (store file, state directory)."""
    if not text.startswith("sqlite:"):
        raise CopyError(f"--from must be sqlite:PATH (the controller's gpud.sqlite or its state directory), "
                        f"got {text!r}")
    path = os.path.abspath(text[len("sqlite:"):])
    if os.path.isdir(path):
        path = os.path.join(path, FILE_NAME)
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        raise CopyError(f"there is no SQLite store at {path}")
    return path, os.path.dirname(path)


def copy_to_postgres(source: str, dest: str, key_file: str | None = None) -> dict[str, int]:
    """Copy the SQLite store named by ``source`` (sqlite:PATH) into the empty database at ``dest``.

    Returns how many rows of each table were copied. Raises CopyError,
    having written nothing, when the source is in use or the database
    already holds a cluster.
    """
    from gpud.controller.state_dir import LOCK_FILE
    from gpud.store.postgres import connect, create_schema, driver, is_postgres_url, problem, shown
    if not is_postgres_url(dest):
        raise CopyError(f"--to must be a postgresql:// URL, got {dest.split('@')[-1]!r}")
    path, state_dir = sqlite_source(source)
    key = _key(key_file or os.path.join(state_dir, "cluster.key"))
    lock_fd = _hold(os.path.join(state_dir, LOCK_FILE))
    psycopg = driver()
    try:
        source_db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            create_schema(dest)
            with connect(dest, name="gpud store copy") as db:
                with db.transaction():
                    db.execute("LOCK TABLE jobs, tokens, meta IN EXCLUSIVE MODE")
                    taken = db.execute("SELECT (SELECT count(*) FROM jobs) + (SELECT count(*) FROM tokens), "
                                       "(SELECT value FROM meta WHERE key = 'cluster_id')").fetchone()
                    if taken[0] or taken[1]:
                        held = taken[1] or "jobs and tokens"
                        raise CopyError(f"the database {shown(dest)} already holds a cluster ({held}); copy into "
                                        f"an empty database")
                    counts = {table: _copy(source_db, db, table, theirs, ours) for table, theirs, ours in TABLES}
                    db.execute("SELECT setval(pg_get_serial_sequence('events', 'id'), "
                               "GREATEST((SELECT COALESCE(MAX(id), 0) FROM events), 1))")
                    db.execute("INSERT INTO meta VALUES ('cluster_key', %s) ON CONFLICT (key) DO UPDATE "
                               "SET value = excluded.value", (key,))
                    if db.execute("SELECT 1 FROM meta WHERE key = 'cluster_id'").fetchone() is None:
                        raise CopyError(f"the store {path} holds no cluster id; start its controller once "
                                        f"(it records one) and copy again")
        finally:
            source_db.close()
    except sqlite3.DatabaseError as exc:
        raise CopyError(f"cannot read the store {path}: {exc}") from None
    except psycopg.Error as exc:
        raise CopyError(f"cannot write the database {shown(dest)}: {problem(exc, dest)}") from None
    finally:
        os.close(lock_fd)
    return counts


def _copy(source: sqlite3.Connection, db: Any, table: str, theirs: str, ours: str) -> int:
    exists = source.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
    if not exists:
        return 0
    marks = ", ".join(["%s"] * len(ours.split(",")))
    skip = " WHERE key != 'schema_version'" if table == "meta" else ""  # the database has its own
    conflict = " ON CONFLICT DO NOTHING" if table == "meta" else ""
    rows = source.execute(f"SELECT {theirs} FROM {table}{skip}")
    count = 0
    with db.cursor() as cur:
        while chunk := rows.fetchmany(CHUNK):
            cur.executemany(f"INSERT INTO {table} ({ours}) VALUES ({marks}){conflict}",
                            [tuple(bool(v) if table == "tokens" and i in (2, 4) else v for i, v in enumerate(row))
                             for row in chunk])
            count += len(chunk)
    return count


def _key(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            key = f.read().strip()
    except OSError as exc:
        raise CopyError(f"cannot read the cluster key {path} ({exc.strerror or exc}); give it with --key FILE") \
            from None
    if not key:
        raise CopyError(f"the cluster key file {path} is empty; give the cluster's key with --key FILE")
    return key


def _hold(path: str) -> int:
    """The state directory's lock, held for the copy: refused while its controller runs."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise CopyError(f"cannot open {path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise CopyError(f"a controller is using {os.path.dirname(path)}: stop it first, so the copy is the "
                        f"cluster's last state") from None
    return fd
