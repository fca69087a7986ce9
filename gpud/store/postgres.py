"""The PostgreSQL store: the same tables as SQLite's, every batch one transaction that checks the writer's term.

Several controllers may point at one database; only the one holding the
leader lease (gpud/store/lease.py) writes. Each write transaction first
reads the lease row ``FOR SHARE`` and compares its term with the term this
store was given when its controller took the lease: a controller that was
paused or cut off while another took over is refused in the very
transaction it tries, and nothing of that transaction is written. A
takeover updates the lease row, so it waits for a write in flight to
commit; a write that starts after it sees the new term.

psycopg 3's synchronous connections serve the store, whose calls block in
the controller's store thread as SQLite's do; its asynchronous ones serve
the lease, renewed on the event loop.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from gpud.accounting.decay import Amount, UsageKey
from gpud.lifecycle import ACTIVE
from gpud.store.base import SCHEMA_VERSION, Event, Fenced, Loaded, StoreVersionError, TokenRecord, WriteBatch

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT COLLATE "C" PRIMARY KEY, seq BIGINT NOT NULL, state TEXT NOT NULL, "user" TEXT NOT NULL,
    project TEXT NOT NULL, submitted DOUBLE PRECISION NOT NULL, ended DOUBLE PRECISION, record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_by_ended ON jobs(ended);
CREATE TABLE IF NOT EXISTS events (
    id BIGSERIAL PRIMARY KEY, time DOUBLE PRECISION NOT NULL, job TEXT, node TEXT,
    kind TEXT NOT NULL, message TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_by_job ON events(job);
CREATE TABLE IF NOT EXISTS nodes (name TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (
    hash TEXT PRIMARY KEY, "user" TEXT NOT NULL, admin BOOLEAN NOT NULL, created DOUBLE PRECISION NOT NULL,
    allow_root BOOLEAN NOT NULL DEFAULT FALSE, revoked DOUBLE PRECISION);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS answers (
    "user" TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL, status INTEGER NOT NULL,
    body TEXT NOT NULL, created DOUBLE PRECISION NOT NULL, PRIMARY KEY ("user", key));
CREATE INDEX IF NOT EXISTS answers_by_created ON answers(created);
CREATE TABLE IF NOT EXISTS usage (
    level TEXT NOT NULL, pool TEXT NOT NULL, name TEXT NOT NULL, gpu_s DOUBLE PRECISION NOT NULL,
    cpu_s DOUBLE PRECISION NOT NULL, memory_gib_s DOUBLE PRECISION NOT NULL, PRIMARY KEY (level, pool, name));
CREATE TABLE IF NOT EXISTS usage_clock (id INTEGER PRIMARY KEY CHECK (id = 0), as_of DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS lease (
    id INTEGER PRIMARY KEY CHECK (id = 1), term BIGINT NOT NULL, holder TEXT NOT NULL, url TEXT NOT NULL,
    since TIMESTAMPTZ NOT NULL, expires TIMESTAMPTZ NOT NULL);
INSERT INTO lease VALUES (1, 0, '', '', now(), '-infinity') ON CONFLICT (id) DO NOTHING;
"""
UPSERT_JOB = ('INSERT INTO jobs VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET '
              'seq = excluded.seq, state = excluded.state, "user" = excluded."user", project = excluded.project, '
              'submitted = excluded.submitted, ended = excluded.ended, record = excluded.record')
STATEMENT_TIMEOUT_MS = 30_000  # a write stuck longer than this fails (503) rather than stalling the controller
# A leader paused in the middle of a transaction holds the lease row's share lock, which a takeover waits
# for: the server ends such a session after this long, rolling the transaction back.
IDLE_IN_TRANSACTION_MS = 5_000
CONNECT_TIMEOUT_S = 5


def is_postgres_url(text: str) -> bool:
    """True when ``text`` names a PostgreSQL database (postgresql:// or postgres://)."""
    return text.startswith(("postgresql://", "postgres://"))


def shown(url: str) -> str:
    """The URL as logs and messages show it: a password, in the user part or as ``password=`` among the
    parameters, replaced by ``***``; every other part (host, database, ``sslmode``, ``sslrootcert``) as given."""
    parts = urlsplit(url)
    if parts.password is not None:
        netloc = f"{parts.username}:***@{parts.netloc.rpartition('@')[2]}"
        parts = parts._replace(netloc=netloc)
    if "password" in parts.query:
        query = "&".join(f"{key}=***" if key == "password" and sep else f"{key}{sep}{value}"
                         for key, sep, value in (pair.partition("=") for pair in parts.query.split("&")))
        parts = parts._replace(query=query)
    return urlunsplit(parts)


def masked(text: str, url: str) -> str:
    """``text`` (a driver's message, say) with the password of ``url`` replaced by ``***`` wherever it appears."""
    for secret in _passwords(url):
        text = text.replace(secret, "***")
    return text


def _passwords(url: str) -> list[str]:
    """The password of ``url``, as written (percent-encoded) and decoded, longest first."""
    parts = urlsplit(url)
    written = [parts.password or ""] + [value for key, _, value in (pair.partition("=") for pair in
                                                                     parts.query.split("&")) if key == "password"]
    return sorted({form for secret in written if secret for form in (secret, unquote(secret))}, key=len, reverse=True)


def problem(exc: BaseException, url: str) -> str:
    """What a driver's error says, on one line, with ``url``'s password masked: for messages naming the store."""
    return masked(" ".join(str(exc).split()), url) or type(exc).__name__


def driver() -> Any:
    """The psycopg module; a RuntimeError saying how to install it when it is missing."""
    try:
        import psycopg
    except ImportError as exc:
        raise RuntimeError("a PostgreSQL store needs psycopg 3: pip install 'psycopg[binary]' "
                           f"(or reinstall gpud) ({exc})") from None
    return psycopg


def connect(url: str, *, autocommit: bool = False, name: str = "gpud") -> Any:
    """A synchronous connection to ``url`` with gpud's timeouts and ``application_name``."""
    psycopg = driver()
    return psycopg.connect(url, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT_S, application_name=name,
                           options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS} "
                                   f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}")


def create_schema(url: str) -> None:
    """Create gpud's tables in the database at ``url`` if they are missing (what ``--init`` does first)."""
    with connect(url) as db:
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(4242)")  # two controllers initialising at once
            db.execute(SCHEMA)
            row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('schema_version', %s)", (str(SCHEMA_VERSION),))


def has_schema(url: str) -> bool:
    """True when the database at ``url`` has gpud's tables."""
    with connect(url, autocommit=True) as db:
        return db.execute("SELECT to_regclass('meta') IS NOT NULL AND to_regclass('lease') IS NOT NULL"
                          ).fetchone()[0]


class PostgresStore:
    """The store in a PostgreSQL database; writes are refused unless :attr:`term` is the lease's term."""

    def __init__(self, url: str, *, name: str = "gpud controller", fenced: bool = True) -> None:
        self.url = url
        self.path = shown(url)
        self.name = name
        self.fenced = fenced
        self.term: int | None = None  # set by the lease once this controller leads
        self._db: Any = connect(url, name=name)
        self._reader: Any = None
        version = self.meta_value("schema_version")
        if version is not None and int(version) > SCHEMA_VERSION:
            self.close()
            raise StoreVersionError(f"the database {self.path} was written by a newer gpud (schema {version}; "
                                    f"this gpud knows {SCHEMA_VERSION}): upgrade gpud on this host")

    @property
    def db(self) -> Any:
        """The connection for writes, opened again when the last one broke (the server restarted, a cut link)."""
        if self._db.closed or self._db.broken:
            self._db.close()
            self._db = connect(self.url, name=self.name)
        return self._db

    @property
    def reader(self) -> Any:
        """A second connection for reads, so that a read never waits behind a write; opened again when broken."""
        if self._reader is None or self._reader.closed or self._reader.broken:
            if self._reader is not None:
                self._reader.close()
            self._reader = connect(self.url, autocommit=True, name=self.name)
        return self._reader

    def _check_term(self, db: Any) -> None:
        if not self.fenced:
            return
        if self.term is None:
            raise Fenced(0, None)
        row = db.execute("SELECT term FROM lease WHERE id = 1 FOR SHARE").fetchone()
        current = row[0] if row else None
        if current != self.term:
            raise Fenced(self.term, current)

    def load(self) -> Loaded:
        """Jobs not finished, nodes, tokens and meta, as the last leader left them."""
        db = self.reader
        with db.transaction():
            return self._load(db)

    def _load(self, db: Any) -> Loaded:
        jobs = [row[0] for row in db.execute("SELECT record FROM jobs WHERE state = ANY(%s) ORDER BY seq",
                                             (sorted(ACTIVE),))]
        nodes = dict(db.execute("SELECT name, record FROM nodes").fetchall())
        tokens = {row[0]: TokenRecord(row[0], row[1], bool(row[2]), row[3], bool(row[4]), row[5]) for row in
                  db.execute('SELECT hash, "user", admin, created, allow_root, revoked FROM tokens')}
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        (last_seq,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM jobs").fetchone()
        return Loaded(jobs, nodes, tokens, meta, int(last_seq))

    def active_jobs(self) -> list[str]:
        """The records of the jobs not finished, in submit order (what :meth:`load` reads of them)."""
        return [row[0] for row in self.reader.execute("SELECT record FROM jobs WHERE state = ANY(%s) ORDER BY seq",
                                                      (sorted(ACTIVE),))]

    def meta_value(self, key: str) -> str | None:
        """One setting of the meta table, or None."""
        row = self.reader.execute("SELECT value FROM meta WHERE key = %s", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        """Store one setting now (its own transaction)."""
        self.write(WriteBatch(meta={key: value}))

    def populated(self) -> bool:
        """True when the database holds any job or token."""
        return any(self.reader.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone() for table in ("jobs", "tokens"))

    def write(self, batch: WriteBatch) -> None:
        """Write the batch in one transaction, refused whole (Fenced) when this controller's term is over."""
        db = self.db
        try:
            with db.transaction():
                self._check_term(db)
                with db.cursor() as cur:
                    if batch.jobs:
                        cur.executemany(UPSERT_JOB, batch.jobs)
                    if batch.events:
                        cur.executemany("INSERT INTO events(time, job, node, kind, message) "
                                        "VALUES (%s, %s, %s, %s, %s)",
                                        [(e.time, e.job, e.node, e.kind, e.message) for e in batch.events])
                    if batch.nodes:
                        cur.executemany("INSERT INTO nodes VALUES (%s, %s) ON CONFLICT (name) DO UPDATE "
                                        "SET record = excluded.record", batch.nodes)
                    if batch.tokens:
                        cur.executemany('INSERT INTO tokens(hash, "user", admin, created, allow_root, revoked) '
                                        'VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (hash) DO UPDATE SET '
                                        '"user" = excluded."user", admin = excluded.admin, created = excluded.created, '
                                        'allow_root = excluded.allow_root, revoked = excluded.revoked',
                                        [(t.hash, t.user, t.admin, t.created, t.allow_root, t.revoked)
                                         for t in batch.tokens])
                    if batch.meta:
                        cur.executemany("INSERT INTO meta VALUES (%s, %s) ON CONFLICT (key) DO UPDATE "
                                        "SET value = excluded.value", list(batch.meta.items()))
                    if batch.answers:
                        cur.executemany('INSERT INTO answers VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT ("user", key) '
                                        'DO UPDATE SET fingerprint = excluded.fingerprint, status = excluded.status, '
                                        'body = excluded.body, created = excluded.created', batch.answers)
        except BaseException:
            _recover(db)
            raise

    def job(self, job_id: str) -> str | None:
        """One job's record, or None."""
        row = self.reader.execute("SELECT record FROM jobs WHERE id = %s", (job_id,)).fetchone()
        return row[0] if row else None

    def array_jobs(self, array_id: str) -> list[str]:
        """The records of every element of array ``array_id``, finished or not."""
        rows = self.reader.execute("SELECT record FROM jobs WHERE id > %s AND id < %s",
                                   (f"{array_id}_", f"{array_id}`")).fetchall()
        return [row[0] for row in rows]

    def array_states(self, array_id: str) -> dict[str, int]:
        """How many elements of array ``array_id`` the store holds in each state."""
        return dict(self.reader.execute("SELECT state, COUNT(*) FROM jobs WHERE id > %s AND id < %s "
                                        "GROUP BY state", (f"{array_id}_", f"{array_id}`")).fetchall())

    def jobs_state(self, job_ids: list[str]) -> dict[str, str]:
        """The state of each known job among ``job_ids``."""
        return dict(self.reader.execute("SELECT id, state FROM jobs WHERE id = ANY(%s)", (job_ids,)).fetchall())

    def history(self, *, since: float | None, user: str | None, project: str | None,
                limit: int) -> list[str]:
        """Finished jobs' records, most recently ended first."""
        sql = "SELECT record FROM jobs WHERE ended IS NOT NULL"
        args: list = []
        for column, value in (("ended >=", since), ('"user" =', user), ("project =", project)):
            if value is not None:
                sql += f" AND {column} %s"
                args.append(value)
        sql += " ORDER BY ended DESC LIMIT %s"
        args.append(limit)
        return [row[0] for row in self.reader.execute(sql, args)]

    def events(self, job_id: str, limit: int = 200) -> list[Event]:
        """The job's events, oldest first (the last ``limit``)."""
        rows = self.reader.execute("SELECT time, kind, message, job, node FROM events WHERE job = %s "
                                   "ORDER BY id DESC LIMIT %s", (job_id, limit)).fetchall()
        return [Event(*row) for row in reversed(rows)]

    def answer(self, user: str, key: str) -> tuple[str, int, str] | None:
        """The stored answer to ``user``'s idempotent request ``key``: (fingerprint, status, answer JSON)."""
        row = self.reader.execute('SELECT fingerprint, status, body FROM answers WHERE "user" = %s AND key = %s',
                                  (user, key)).fetchone()
        return (row[0], row[1], row[2]) if row else None

    def forget_answers(self, before: float) -> int:
        """Delete the answers to idempotent requests made before ``before``; returns how many."""
        db = self.db
        try:
            with db.transaction():
                self._check_term(db)
                return db.execute("DELETE FROM answers WHERE created < %s", (before,)).rowcount
        except BaseException:
            _recover(db)
            raise

    def usage(self, synchronous: str = "FULL") -> PostgresUsage:
        """The decayed-usage tables of this database, written under the same term."""
        return PostgresUsage(self)

    def close(self) -> None:
        """Close the connections."""
        for db in (self._reader, self._db):
            if db is not None:
                db.close()


class PostgresUsage:
    """The ``usage`` tables in PostgreSQL, behind the interface of gpud.store.usage.UsageStore."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self._db: Any = connect(store.url, name=store.name)

    @property
    def db(self) -> Any:
        """The connection, opened again when the last one broke."""
        if self._db.closed or self._db.broken:
            self._db.close()
            self._db = connect(self.store.url, name=self.store.name)
        return self._db

    def load(self) -> tuple[dict[UsageKey, Amount], float | None]:
        """The stored amounts and the instant they are decayed to (None when nothing was ever charged)."""
        db = self.db
        with db.transaction():
            rows = {(level, pool, name): (gpu, cpu, memory) for level, pool, name, gpu, cpu, memory in
                    db.execute("SELECT level, pool, name, gpu_s, cpu_s, memory_gib_s FROM usage")}
            row = db.execute("SELECT as_of FROM usage_clock WHERE id = 0").fetchone()
        return rows, (row[0] if row else None)

    def save(self, rows: dict[UsageKey, Amount], as_of: float) -> None:
        """Replace the amounts and their instant in one transaction (refused whole when the term is over)."""
        db = self.db
        try:
            with db.transaction():
                self.store._check_term(db)
                db.execute("DELETE FROM usage")
                with db.cursor() as cur:
                    cur.executemany("INSERT INTO usage VALUES (%s, %s, %s, %s, %s, %s)",
                                    [(*key, *amount) for key, amount in rows.items()])
                db.execute("INSERT INTO usage_clock VALUES (0, %s) ON CONFLICT (id) DO UPDATE SET as_of = "
                           "excluded.as_of", (as_of,))
        except BaseException:
            _recover(db)
            raise

    def ended_between(self, since: float, until: float) -> list[str]:
        """The records (JSON) of jobs that ended in [since, until), oldest end first."""
        db = self.db
        with db.transaction():
            return [row[0] for row in db.execute(
                "SELECT record FROM jobs WHERE ended >= %s AND ended < %s ORDER BY ended", (since, until))]

    def close(self) -> None:
        """Close the connection."""
        self._db.close()


def _recover(db: Any) -> None:
    """After a failed transaction: a broken connection is reopened at the next call (psycopg does not)."""
    if db.closed or db.broken:
        return
    if db.info.transaction_status != 0:  # not idle: leave no transaction open behind a failure
        db.rollback()
