"""Group commit: changes marked by many requests are written in one transaction, each caller waits for its own."""

from __future__ import annotations

import asyncio
import errno
import logging
import sqlite3
import time
from concurrent.futures import Executor
from typing import Callable, Iterable

from gpud import jsontext
from gpud.controller.slices import Slices
from gpud.jobs import Job
from gpud.store import Event, Fenced, Store, TokenRecord, WriteBatch


INLINE_WRITE_S = 0.001
INLINE_ROWS = 256          # a batch larger than this is written in the store's thread, however fast the disk
# Rows (and events) made on the event loop between two looks at the clock of its slice (gpud.controller.slices): a
# job's row takes 10-30 us, so a slice of long work ends within a step of its time.
ROWS_PER_STEP = 32
EVENTS_PER_STEP = 256
FLUSH_SOON_S = 0.02  # how long a change nobody waits for may stay in memory only
log = logging.getLogger("gpud.controller")


class StoreError(RuntimeError):
    """The durable store failed a write; nothing in that batch is acknowledged (the API answers 503).

    New things in the batch (submitted jobs, tokens, idempotent answers) are
    forgotten: their callers are told, and nothing of them is written later.
    Changes to what already exists are marked again and go in the next batch.
    """


PG_DISK_FULL = "53100"  # PostgreSQL's SQLSTATE for disk_full


def is_store_failure(exc: BaseException) -> bool:
    """True when ``exc`` is the store's own failure (SQLite's, PostgreSQL's driver's, a fenced write)."""
    return isinstance(exc, (sqlite3.Error, Fenced)) or type(exc).__module__.split(".")[0] == "psycopg"


def store_error(exc: BaseException) -> StoreError:
    """The StoreError that tells a caller why the store refused a write (naming the store's own error)."""
    full = isinstance(exc, sqlite3.OperationalError) and getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
    full = full or (isinstance(exc, OSError) and exc.errno == errno.ENOSPC)
    full = full or getattr(exc, "sqlstate", None) == PG_DISK_FULL
    hint = "; free space in the controller's state directory" if full else ""
    return StoreError(f"the state store refused the write: {exc} (nothing of this request was accepted{hint})")


class Persister:
    """Collects changed jobs, nodes, events, tokens and meta, and makes them durable on ``flush``.

    One batch is written at a time, on the event loop while commits are quick
    (a lone submit pays one fsync and no trip through a thread), in the store's
    thread once they are slow, so a slow disk never stalls the API.

    Each batch has its own outcome (a future): whoever marked something new
    (a job, a token, an answer) waits for exactly the batch that carries it,
    so a request is never told of another batch's success or failure.
    """

    def __init__(self, store: Store, executor: Executor) -> None:
        self.store = store
        self.executor = executor
        self._jobs: dict[str, Job] = {}
        self._new: dict[str, Job] = {}
        self._answers: list[tuple[str, str, str, int, str, float]] = []
        self._nodes: dict[str, Callable[[], str]] = {}
        self._events: list[Event] = []
        self._tokens: list[TokenRecord] = []
        self._meta: dict[str, str] = {}
        self._next: asyncio.Future | None = None      # the outcome of the batch being gathered
        self._flying: asyncio.Future | None = None    # the outcome of the batch being written
        self._writer: asyncio.Future | None = None
        self.last_write_s = 0.0
        self.batches = 0
        self.failed_batches = 0
        self._soon: asyncio.TimerHandle | None = None
        # Called with the store's refusal when another controller took the lease (Fenced).
        self.on_fenced: Callable[[BaseException], None] | None = None

    def job(self, job: Job) -> None:
        """Mark a job as changed (its record is read at the next batch)."""
        self._jobs[job.id] = job

    def new_jobs(self, jobs: Iterable[Job]) -> asyncio.Future:
        """Mark submitted jobs for the next batch; the returned future is that batch's outcome.

        It resolves once those jobs are durable, or raises StoreError when that
        batch failed: then they are forgotten, never written later.
        """
        for job in jobs:
            self._new[job.id] = job
        return self.ticket()

    def answer(self, user: str, key: str, fingerprint: str, status: int, body: str, created: float) -> None:
        """Record the answer to an idempotent request, in the same transaction as what it made."""
        self._answers.append((user, key, fingerprint, status, body, created))

    def node(self, name: str, to_json: Callable[[], str]) -> None:
        """Mark a node as changed; ``to_json`` gives its record at the next batch."""
        self._nodes[name] = to_json

    def event(self, event: Event) -> None:
        """Record an event."""
        self._events.append(event)

    def token(self, record: TokenRecord) -> None:
        """Record a token (by its hash), new or revoked."""
        self._tokens.append(record)

    def meta(self, key: str, value: str) -> None:
        """Record a setting."""
        self._meta[key] = value

    def ticket(self) -> asyncio.Future:
        """The outcome of the batch that will carry what is marked now (a writer is started for it).

        Await it (through ``asyncio.shield`` when the awaiting task may be
        cancelled): it resolves when that batch is durable and raises
        StoreError when it failed.
        """
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
            self._next.add_done_callback(_retrieved)
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write_batches())
        return self._next

    async def flush(self) -> None:
        """Return once every change marked before this call is durable; raises StoreError if the store failed.

        Changes to existing things from a failed batch are marked again, so
        after a failure a later flush writes them.
        """
        if self._dirty():
            outcome = self.ticket()
        elif self._flying is not None:
            outcome = self._flying            # they may be in the batch being written
        else:
            return
        await asyncio.shield(outcome)

    def flush_soon(self) -> None:
        """Make the changes marked so far durable within FLUSH_SOON_S, or with an earlier flush.

        For changes nobody waits for (a task the node says has started), so
        they share the next transaction instead of paying one of their own.
        """
        if self._soon is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (the state machine driven directly): the next flush writes the changes
        self._soon = loop.call_later(FLUSH_SOON_S, self._flush_soon)

    def _flush_soon(self) -> None:
        self._soon = None
        if self._dirty():
            asyncio.ensure_future(self._flush_quietly())

    async def _flush_quietly(self) -> None:
        try:
            await self.flush()
        except StoreError as exc:  # nobody waits for these changes; they are marked again for the next flush
            log.error("%s", exc)

    def _dirty(self) -> bool:
        return bool(self._jobs or self._new or self._nodes or self._events or self._tokens or self._meta
                    or self._answers)

    async def _write_batches(self) -> None:
        # One batch at a time; changes marked while one is written go in the
        # next, so under load many requests share one transaction and fsync.
        loop = asyncio.get_running_loop()
        try:
            while self._dirty() or self._next is not None:
                await asyncio.sleep(0)        # let requests already read mark their changes
                outcome = self._next if self._next is not None else loop.create_future()
                self._next = None
                if not self._dirty():         # everything marked for it went with an earlier batch
                    outcome.set_result(None)
                    continue
                self._flying = outcome        # a flush from here on, with nothing newer marked, waits for it
                batch, taken, new = await self._take()
                began = time.perf_counter()
                try:
                    if self.last_write_s < INLINE_WRITE_S and len(batch.jobs) + len(new) <= INLINE_ROWS:
                        batch.jobs.extend(job_rows(new))
                        self.store.write(batch)
                    else:
                        # Submitted jobs are nobody else's until written, so their rows are made in the
                        # store's thread: a 100,000-element array does not hold the event loop for it.
                        await loop.run_in_executor(self.executor, _write_with, self.store, batch, new)
                except Exception as exc:  # noqa: BLE001 - any failure of the store refuses this batch alone
                    if self.on_fenced is not None and isinstance(exc, Fenced):
                        self.on_fenced(exc)
                    self._mark_again(taken)
                    self.failed_batches += 1
                    self._flying = None
                    if not outcome.done():
                        outcome.set_exception(store_error(exc))
                    if self._next is None:
                        break                 # nobody waits for a later batch: the next flush retries
                    continue
                self.last_write_s = time.perf_counter() - began
                self.batches += 1
                self._flying = None
                if not outcome.done():
                    outcome.set_result(None)
        finally:
            self._writer = None
            # Cancelled (the controller is stopping) with a batch unwritten or its outcome unknown: say so.
            for unknown in (self._flying, self._next):
                if unknown is not None and not unknown.done():
                    unknown.set_exception(StoreError("the controller stopped before the write was known to be "
                                                     "durable"))
            self._flying = self._next = None

    async def _take(self) -> tuple[WriteBatch, tuple[dict, dict, list, dict], list[Job]]:
        """What is marked now, as the next batch's rows; everything marked from here on goes in a later batch.

        The rows of changed jobs and nodes, and the events, are made here, on the event loop (the loop
        changes those objects, so no other thread may read them): a slice at a time (gpud.controller.slices),
        the loop free between, so the rows of 16,000 jobs just started hold it no longer than any long work. A
        record made after a later change holds that change too, which is marked again for the next
        batch anyway.
        """
        batch = WriteBatch()
        jobs, nodes, events = list(self._jobs.values()), list(self._nodes.items()), self._events
        new = list(self._new.values())
        batch.tokens = [t for t in self._tokens if _storable(t.user)]
        batch.meta, batch.answers = self._meta, self._answers
        taken = (self._jobs, self._nodes, self._events, self._meta)
        self._jobs, self._new, self._nodes, self._events, self._tokens, self._meta = {}, {}, {}, [], [], {}
        self._answers = []
        slices = Slices()
        for start in range(0, len(events), EVENTS_PER_STEP):
            batch.events.extend(Event(e.time, _text(e.kind), _text(e.message), e.job and _text(e.job),
                                      e.node and _text(e.node)) for e in events[start:start + EVENTS_PER_STEP])
            await slices.pause()
        for start in range(0, len(jobs), ROWS_PER_STEP):
            batch.jobs.extend(job_rows(jobs[start:start + ROWS_PER_STEP]))
            await slices.pause()
        for start in range(0, len(nodes), ROWS_PER_STEP):
            batch.nodes.extend((name, to_json()) for name, to_json in nodes[start:start + ROWS_PER_STEP])
            await slices.pause()
        return batch, taken, new

    def _mark_again(self, taken: tuple[dict, dict, list, dict]) -> None:
        """After a failed write, mark again what changed (marks made since are newer and win)."""
        jobs, nodes, events, meta = taken
        for key, job in jobs.items():
            self._jobs.setdefault(key, job)
        for name, to_json in nodes.items():
            self._nodes.setdefault(name, to_json)
        self._events[:0] = events
        for key, value in meta.items():
            self._meta.setdefault(key, value)


def _retrieved(outcome: asyncio.Future) -> None:
    # A failed batch nobody awaited (its changes are marked again) is not an unhandled error.
    if not outcome.cancelled():
        outcome.exception()


def job_rows(jobs: Iterable[Job]) -> list[tuple[str, int, str, str, str, float, float | None, str]]:
    """The store's rows for these jobs (their records as JSON)."""
    return [(job.id, job.seq, job.state, _text(job.user), _text(job.project), job.submitted, job.ended,
             jsontext.dumps(job.to_record())) for job in jobs]


def _write_with(store: Store, batch: WriteBatch, new: list[Job]) -> None:
    batch.jobs.extend(job_rows(new))
    store.write(batch)


def _storable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        log.error("not stored: a token for a user name that is not valid Unicode (%r)", text)
        return False
    return True


def _text(text: str) -> str:
    """``text`` as the store can hold it: a lone surrogate (never valid UTF-8) becomes its escape.

    The API refuses such text; this keeps one that slipped through from failing
    every other change in its transaction.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
