"""Group commit: changes marked by many requests are written in one transaction, each caller waits for its own."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from typing import Callable, Iterable

from gpud import jsontext
from gpud.jobs import Job
from gpud.store import Event, Store, TokenRecord, WriteBatch


INLINE_WRITE_S = 0.001
INLINE_ROWS = 256          # a batch larger than this is written in the store's thread, however fast the disk
FLUSH_SOON_S = 0.02  # how long a change nobody waits for may stay in memory only
log = logging.getLogger("gpud.controller")


class StoreError(RuntimeError):
    """The durable store failed a write; nothing in that batch is acknowledged.

    New things in the batch (submitted jobs, tokens, idempotent answers) are
    forgotten: their callers are told, and nothing of them is written later.
    Changes to what already exists are marked again and go in the next batch.
    """


class Persister:
    """Collects changed jobs, nodes, events, tokens and meta, and makes them durable on ``flush``.

    One batch is written at a time, on the event loop while commits are quick
    (a lone submit pays one fsync and no trip through a thread), in the store's
    thread once they are slow, so a slow disk never stalls the API.
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
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._writer: asyncio.Future | None = None
        self._taken = 0
        self._done = 0
        self.last_write_s = 0.0
        self.batches = 0
        self._soon: asyncio.TimerHandle | None = None

    def job(self, job: Job) -> None:
        """Mark a job as changed (its record is read at the next batch)."""
        self._jobs[job.id] = job

    def new_job(self, job: Job) -> None:
        """Mark a submitted job: written by the next batch, or forgotten (never retried) when that batch fails."""
        self._new[job.id] = job

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

    async def flush(self) -> None:
        """Return once every change marked before this call is durable; raises if the store failed."""
        if self._dirty():
            target = self._taken + 1          # the next batch will carry these changes
        elif self._writer is not None:
            target = self._taken              # they may be in the batch being written
        else:
            return
        if target <= self._done:
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((target, future))
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write_batches())
        await future

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
        except StoreError as exc:  # nobody waits for these changes; the next flush that is waited for fails too
            log.error("%s", exc)

    def _dirty(self) -> bool:
        return bool(self._jobs or self._new or self._nodes or self._events or self._tokens or self._meta
                    or self._answers)

    async def _write_batches(self) -> None:
        # One batch at a time; changes marked while one is written go in the
        # next, so under load many requests share one transaction and fsync.
        loop = asyncio.get_running_loop()
        try:
            while self._dirty():
                await asyncio.sleep(0)        # let requests already read mark their changes
                batch, taken, new = self._take()
                self._taken += 1
                began = time.perf_counter()
                try:
                    if self.last_write_s < INLINE_WRITE_S and len(batch.jobs) + len(new) <= INLINE_ROWS:
                        batch.jobs.extend(job_rows(new))
                        self.store.write(batch)
                    else:
                        # Submitted jobs are nobody else's until written, so their rows are made in the
                        # store's thread: a 100,000-element array does not hold the event loop for it.
                        await loop.run_in_executor(self.executor, _write_with, self.store, batch, new)
                except Exception:
                    self._mark_again(taken)
                    raise
                self.last_write_s = time.perf_counter() - began
                self.batches += 1
                self._done = self._taken
                self._wake(self._done)
        except Exception as exc:  # the store is unusable: every waiter hears why
            error = StoreError(f"the state store refused the write: {exc}")
            for _, waiter in self._waiters:
                if not waiter.done():
                    waiter.set_exception(error)
            self._waiters.clear()
        finally:
            self._writer = None

    def _wake(self, done: int) -> None:
        still = []
        for target, waiter in self._waiters:
            if target <= done:
                if not waiter.done():
                    waiter.set_result(None)
            else:
                still.append((target, waiter))
        self._waiters = still

    def _take(self) -> tuple[WriteBatch, tuple[dict, dict, list, dict], list[Job]]:
        batch = WriteBatch()
        batch.jobs = job_rows(self._jobs.values())
        new = list(self._new.values())
        batch.nodes = [(name, to_json()) for name, to_json in self._nodes.items()]
        batch.events = [Event(e.time, _text(e.kind), _text(e.message), e.job and _text(e.job), e.node and _text(e.node))
                        for e in self._events]
        batch.tokens = [t for t in self._tokens if _storable(t.user)]
        batch.meta, batch.answers = self._meta, self._answers
        taken = (self._jobs, self._nodes, self._events, self._meta)
        self._jobs, self._new, self._nodes, self._events, self._tokens, self._meta = {}, {}, {}, [], [], {}
        self._answers = []
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
