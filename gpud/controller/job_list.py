"""One page of the job list (``GET /api/v1/jobs``): in listing order, after a cursor, without holding the loop.

The order is (submitted, array index, id), a total order; a cursor is the
key of the last job of the page before, so a page is the ``limit`` jobs
that sort after it, whatever was submitted or ended in between. The jobs
are scanned a slice at a time, the event loop free between slices, and only
the best ``limit`` seen so far are kept: a listing of 100,000 active jobs
never stalls other requests for long.
"""

from __future__ import annotations

import asyncio
import base64
import heapq
import json
import math
from typing import Collection, Iterable

from gpud.jobs import Job

DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000
SCAN_SLICE = 2000

Key = tuple[float, int, str]


class CursorError(ValueError):
    """A cursor this controller did not give out."""


def sort_key(job: Job) -> Key:
    """Where the job comes in the listing."""
    return (job.submitted, job.array_index if job.array_index is not None else -1, job.id)


def encode_cursor(key: Key) -> str:
    """The cursor that continues the listing after the job with ``key`` (opaque to clients)."""
    return base64.urlsafe_b64encode(json.dumps(list(key), separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(text: str) -> Key:
    """The key a cursor continues after; CursorError when it is not one ``encode_cursor`` made."""
    try:
        value = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        submitted, index, job_id = value
    except (ValueError, TypeError):
        raise CursorError("cursor is not one this controller gave; start again without it") from None
    if (isinstance(submitted, bool) or not isinstance(submitted, (int, float)) or not math.isfinite(submitted)
            or isinstance(index, bool) or not isinstance(index, int) or not isinstance(job_id, str)):
        raise CursorError("cursor is not one this controller gave; start again without it")
    return (float(submitted), index, job_id)


async def select_page(jobs: Iterable[Job], states: Collection[str], user: str | None, project: str | None,
                      after: Key | None, limit: int) -> tuple[list[Job], Key | None]:
    """The first ``limit`` jobs in ``states`` (of ``user`` and ``project`` when given) that sort after
    ``after``, in order, and the cursor key for the next page (None when these are the last).

    ``jobs`` is read whole first (a copy), so jobs that change while the
    scan yields the loop change nothing it reads.
    """
    snapshot = list(jobs)
    best: list[tuple[Key, Job]] = []
    for start in range(0, len(snapshot), SCAN_SLICE):
        # One comprehension per slice, no call per job: a page of 100,000 jobs costs tens of ms, not hundreds.
        rows = [((job.submitted, -1 if job.array_index is None else job.array_index, job.id), job)
                for job in snapshot[start:start + SCAN_SLICE] if job.state in states]
        if user is not None or project is not None:
            rows = [row for row in rows if (user is None or row[1].user == user)
                    and (project is None or row[1].project == project)]
        if after is not None:
            rows = [row for row in rows if row[0] > after]
        best += rows
        if len(best) > 4 * (limit + 1):
            best = heapq.nsmallest(limit + 1, best)   # ids are unique: two rows never compare their jobs
        if start + SCAN_SLICE < len(snapshot):
            await asyncio.sleep(0)
    best.sort()
    page = best[:limit]
    more = len(best) > limit
    return [job for _, job in page], (page[-1][0] if more and page else None)
