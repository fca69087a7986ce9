"""The active jobs in listing order, so a page of ``GET /api/v1/jobs`` is found by bisecting from its cursor.

Keys are (submitted, array index, id), fixed once a job is accepted, and
new jobs nearly always sort last: adding appends. A job that ends is only
forgotten by id; its key stays in the list, skipped by readers, until the
stale keys outnumber the live ones and the list is rebuilt once (amortised
O(1) an end, where deleting from the middle of a 100,000-key list at each
end would copy the list each time). Restoring jobs out of order marks the
list unsorted; the next reader sorts it once.
"""

from __future__ import annotations

import bisect
from typing import Iterator

from gpud.jobs import Job

Key = tuple[float, int, str]

COMPACT_AT = 1024  # stale keys tolerated however few jobs are active


def sort_key(job: Job) -> Key:
    """Where the job comes in the listing."""
    return (job.submitted, job.array_index if job.array_index is not None else -1, job.id)


class ListingOrder:
    """The active jobs, ordered by ``sort_key``; see the module docstring."""

    def __init__(self) -> None:
        self._keys: list[Key] = []
        self._jobs: dict[str, tuple[Key, Job]] = {}
        self._sorted = True

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def add(self, job: Job) -> None:
        """List ``job`` (again, if it was listed before: it then appears once, at its key)."""
        key = sort_key(job)
        old = self._jobs.get(job.id)
        self._jobs[job.id] = (key, job)
        if old is not None and old[0] == key:
            return
        if self._keys and key <= self._keys[-1]:
            if key == self._keys[-1]:
                return
            self._sorted = False  # a duplicate key this makes goes at the sort
        self._keys.append(key)

    def remove(self, job: Job) -> None:
        """Stop listing ``job``; its key is dropped for good at the next rebuild."""
        self._jobs.pop(job.id, None)
        if len(self._keys) - len(self._jobs) > max(COMPACT_AT, len(self._jobs)):
            live = self._jobs
            self._keys = [key for key in self._keys if (entry := live.get(key[2])) is not None and entry[0] == key]

    def after(self, key: Key | None, count: int) -> Iterator[tuple[Key, Job]]:
        """Up to ``count`` listed jobs that sort after ``key`` (from the first when None), in order, with their keys.

        Stale keys are skipped without counting; read it whole before the
        loop turns (a later add or rebuild may move what it walks).
        """
        if not self._sorted:
            self._keys.sort()  # nearly sorted (a restore's few stragglers): one pass of timsort
            self._keys = [k for i, k in enumerate(self._keys) if i == 0 or k != self._keys[i - 1]]
            self._sorted = True
        keys, live = self._keys, self._jobs
        i = 0 if key is None else bisect.bisect_right(keys, key)
        end = min(len(keys), i + count)
        for k in keys[i:end]:
            entry = live.get(k[2])
            if entry is not None and entry[0] == k:
                yield k, entry[1]
