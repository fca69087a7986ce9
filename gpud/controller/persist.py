"""Group commit: changes marked by many requests are written in one transaction, each caller waits for its own."""

from __future__ import annotations

import asyncio
import json
from typing import Callable

from gpud.jobs import Job
from gpud.store import Event, Store, WriteBatch


class StoreError(RuntimeError):
    """The durable store failed a write; nothing in that batch is acknowledged."""


class Persister:
    """Collects changed jobs, nodes, events, tokens and meta, and makes them durable on ``flush``.

    The write runs on the event loop once per loop iteration: every request
    read in that iteration shares the transaction and its fsync, and a lone
    submit pays one fsync without a trip through a thread.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._jobs: dict[str, Job] = {}
        self._nodes: dict[str, Callable[[], str]] = {}
        self._events: list[Event] = []
        self._tokens: list[tuple[str, str, bool, float]] = []
        self._meta: dict[str, str] = {}
        self._waiters: list[asyncio.Future] = []
        self._scheduled = False
        self.batches = 0

    def job(self, job: Job) -> None:
        """Mark a job as changed (its record is read at the next batch)."""
        self._jobs[job.id] = job

    def node(self, name: str, to_json: Callable[[], str]) -> None:
        """Mark a node as changed; ``to_json`` gives its record at the next batch."""
        self._nodes[name] = to_json

    def event(self, event: Event) -> None:
        """Record an event."""
        self._events.append(event)

    def token(self, digest: str, user: str, admin: bool, created: float) -> None:
        """Record a token (by its hash)."""
        self._tokens.append((digest, user, admin, created))

    def meta(self, key: str, value: str) -> None:
        """Record a setting."""
        self._meta[key] = value

    async def flush(self) -> None:
        """Return once every change marked before this call is durable; raises if the store failed."""
        if not self._dirty():
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._write)
        await future

    def _dirty(self) -> bool:
        return bool(self._jobs or self._nodes or self._events or self._tokens or self._meta)

    def _write(self) -> None:
        # Runs once the requests already read in this loop iteration have
        # marked their changes, so they share one transaction (one fsync).
        self._scheduled = False
        waiters, self._waiters = self._waiters, []
        batch = self._take()
        try:
            if batch:
                self.store.write(batch)
                self.batches += 1
        except Exception as exc:  # the store is unusable: every waiter hears why
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(StoreError(f"the store refused a write: {exc}"))
            return
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _take(self) -> WriteBatch:
        batch = WriteBatch()
        for job in self._jobs.values():
            batch.jobs.append((job.id, job.seq, job.state, job.user, job.project, job.submitted, job.ended,
                               json.dumps(job.to_record(), separators=(",", ":"))))
        batch.nodes = [(name, to_json()) for name, to_json in self._nodes.items()]
        batch.events, batch.tokens, batch.meta = self._events, self._tokens, self._meta
        self._jobs, self._nodes, self._events, self._tokens, self._meta = {}, {}, [], [], {}
        return batch
