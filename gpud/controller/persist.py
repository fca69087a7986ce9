"""Group commit: changes marked by many requests are written in one transaction, each caller waits for its own."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import Executor
from typing import Callable

from gpud.jobs import Job
from gpud.store import Event, Store, WriteBatch


class Persister:
    """Collects changed jobs, nodes, events, tokens and meta, and makes them durable on ``flush``.

    While one batch is being written, new changes pile up for the next: under
    load many submits share one fsync, and a lone submit waits for one.
    """

    def __init__(self, store: Store, executor: Executor) -> None:
        self.store = store
        self.executor = executor
        self._jobs: dict[str, Job] = {}
        self._nodes: dict[str, Callable[[], str]] = {}
        self._events: list[Event] = []
        self._tokens: list[tuple[str, str, bool, float]] = []
        self._meta: dict[str, str] = {}
        self._taken = 0
        self._done = 0
        self._writing: asyncio.Task | None = None
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
        target = self._taken + 1
        while self._done < target:
            if self._writing is None:
                self._writing = asyncio.ensure_future(self._write_next())
            await asyncio.shield(self._writing)

    async def _write_next(self) -> None:
        try:
            batch = self._take()
            self._taken += 1
            number = self._taken
            if batch:
                self.batches += 1
                await asyncio.get_running_loop().run_in_executor(self.executor, self.store.write, batch)
            self._done = number
        finally:
            self._writing = None

    def _take(self) -> WriteBatch:
        batch = WriteBatch()
        for job in self._jobs.values():
            batch.jobs.append((job.id, job.seq, job.state, job.user, job.project, job.submitted, job.ended,
                               json.dumps(job.to_record(), separators=(",", ":"))))
        batch.nodes = [(name, to_json()) for name, to_json in self._nodes.items()]
        batch.events, batch.tokens, batch.meta = self._events, self._tokens, self._meta
        self._jobs, self._nodes, self._events, self._tokens, self._meta = {}, {}, [], [], {}
        return batch
