"""The leader lease of a PostgreSQL store: one row with a term, taken when expired, renewed by its holder.

Expiry is judged by the database's clock (``now()``), so the controllers'
clocks need not agree. Taking the lease adds one to the term; the store
checks that term in every write transaction (gpud/store/postgres.py), so
a controller whose lease was taken cannot write, however long it was
paused.

A leader paused in the middle of a write holds the lease row's share lock,
which a takeover must wait for. The server ends such a session after
``idle_in_transaction_session_timeout`` only between statements: paused
inside a pipeline (psycopg's ``executemany``), before its Sync, it would
hold the lock for as long as it stays paused. So a takeover waits for the
lock at most TAKE_LOCK_WAIT_MS and then ends the sessions that hold it,
once the lease has run out by the database's clock: their transactions roll
back, so nothing they meant to write lands after the takeover.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gpud.store.postgres import CONNECT_TIMEOUT_S, STATEMENT_TIMEOUT_MS, connect, driver

log = logging.getLogger("gpud.controller")

TAKE = ("UPDATE lease SET term = term + 1, holder = %(holder)s, url = %(url)s, since = now(), "
        "expires = now() + %(lease_s)s * interval '1 second' WHERE id = 1 AND expires < now() RETURNING term")
RENEW = ("UPDATE lease SET expires = now() + %(lease_s)s * interval '1 second', url = %(url)s "
         "WHERE id = 1 AND term = %(term)s AND holder = %(holder)s RETURNING term")
RESIGN = "UPDATE lease SET expires = '-infinity' WHERE id = 1 AND term = %(term)s AND holder = %(holder)s"
# The sessions holding the lease row's share lock (only a leader's write transactions take it), ended when the
# lease has run out. pg_terminate_backend needs the same role as theirs (or pg_signal_backend).
END_STALE_WRITES = ("SELECT count(*) FILTER (WHERE pg_terminate_backend(l.pid)) FROM pg_locks l JOIN lease ON lease.id = 1 "
                    "WHERE l.relation = 'lease'::regclass AND l.mode = 'RowShareLock' AND l.granted "
                    "AND l.pid <> pg_backend_pid() AND lease.expires < now()")
TAKE_LOCK_WAIT_MS = 1000  # how long a takeover waits for a write of the old leader to end before ending it
READ = "SELECT term, holder, url, expires < now(), EXTRACT(EPOCH FROM now() - since) FROM lease WHERE id = 1"


@dataclass(frozen=True, slots=True)
class LeaseState:
    """What the lease row says now: the term, who holds it, the holder's URL, and whether it has run out."""

    term: int
    holder: str
    url: str
    expired: bool
    held_s: float


def take_sync(url: str, holder: str, advertise: str, lease_s: float) -> int | None:
    """Take the lease if it has run out (blocking); the new term, or None when another holds it."""
    with connect(url, autocommit=True, name=f"gpud controller {holder}") as db:
        row = db.execute(TAKE, {"holder": holder, "url": advertise, "lease_s": lease_s}).fetchone()
    return row[0] if row else None


class Lease:
    """This controller's side of the lease, on an asynchronous connection of its own."""

    def __init__(self, url: str, holder: str, advertise: str, lease_s: float) -> None:
        self.url = url
        self.holder = holder
        self.advertise = advertise
        self.lease_s = lease_s
        self._db: Any = None

    async def _conn(self) -> Any:
        if self._db is None or self._db.closed or self._db.broken:
            if self._db is not None:
                await self._db.close()
            psycopg = driver()
            self._db = await psycopg.AsyncConnection.connect(
                self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                application_name=f"gpud controller {self.holder}",
                options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}")
        return self._db

    def _args(self, term: int = 0) -> dict:
        return {"holder": self.holder, "url": self.advertise, "lease_s": self.lease_s, "term": term}

    async def take(self) -> int | None:
        """Take the lease if it has run out; the new term, or None when another controller holds it.

        When the lease has run out but a write of its old holder still holds the lease row, the write's
        session is ended instead (see the module's docstring) and None returned: the next call takes it.
        """
        db = await self._conn()
        psycopg = driver()
        try:
            async with db.transaction():
                await db.execute(f"SET LOCAL lock_timeout = {TAKE_LOCK_WAIT_MS}")
                row = await (await db.execute(TAKE, self._args())).fetchone()
        except psycopg.errors.LockNotAvailable:
            (ended,) = await (await db.execute(END_STALE_WRITES)).fetchone()
            if ended:
                log.warning("the lease has run out but a write of its holder still held it: ended %d session(s) "
                            "of that controller, whose transactions roll back", ended)
            return None
        return row[0] if row else None

    async def renew(self, term: int) -> bool:
        """Extend the lease of ``term``; False when it is no longer this controller's."""
        db = await self._conn()
        row = await (await db.execute(RENEW, self._args(term))).fetchone()
        return row is not None

    async def state(self) -> LeaseState:
        """The lease row as it is now."""
        db = await self._conn()
        term, holder, url, expired, held = await (await db.execute(READ)).fetchone()
        return LeaseState(term, holder, url, bool(expired), float(held))

    async def resign(self, term: int) -> None:
        """Let the lease run out now (a controller stopping cleanly), so a standby need not wait for it."""
        db = await self._conn()
        await db.execute(RESIGN, self._args(term))

    async def close(self) -> None:
        """Close the connection."""
        if self._db is not None:
            await self._db.close()
            self._db = None


__all__ = ["CONNECT_TIMEOUT_S", "Lease", "LeaseState", "take_sync"]
