"""One page of the job list (``GET /api/v1/jobs``): in listing order, after a cursor, without holding the loop.

The order is (submitted, array index, id), a total order; a cursor is the
key of the last job of the page before, so a page is the ``limit`` jobs
that sort after it, whatever was submitted or ended in between. The active
jobs are kept in that order (gpud.controller.listing_order), so a page
starts by bisecting from its cursor and reads about ``limit`` jobs, not
all of them; when filters skip many, the walk goes a slice at a time, the
event loop free between slices.
"""

from __future__ import annotations

import asyncio
import base64
import heapq
import itertools
import json
import math
from typing import Awaitable, Callable, Collection

from gpud.controller.listing_order import Key, ListingOrder, sort_key
from gpud.jobs import Job
from gpud.lifecycle import ACTIVE

DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000
SCAN_SLICE = 2000

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "CursorError", "Key", "decode_cursor", "encode_cursor", "select_page",
           "sort_key"]


class CursorError(ValueError):
    """A cursor this controller did not give out."""


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


async def select_page(active: ListingOrder, read_ended: Callable[[], Awaitable[list[Job]]] | None, states: Collection[str], user: str | None,
                      project: str | None, after: Key | None, limit: int) -> tuple[list[Job], Key | None]:
    """The first ``limit`` jobs in ``states`` (of ``user`` and ``project`` when given) that sort after
    ``after``, in order, and the cursor key for the next page (None when these are the last).

    ``active`` is walked from the cursor, at most SCAN_SLICE keys between two
    turns of the loop; ``ended`` (jobs read back from the store, in any
    order, read after the walk so a job that ends meanwhile is in one or the
    other) are merged in, except those also found active. ``read_ended`` is
    None when no ended state is asked for.
    """
    def wanted(job: Job) -> bool:
        return job.state in states and (user is None or job.user == user) and (project is None or job.project == project)

    found: list[tuple[Key, Job]] = []
    if any(state in ACTIVE for state in states):
        position = after
        while len(found) <= limit:
            rows = list(active.after(position, SCAN_SLICE))
            if not rows:
                break
            found += itertools.islice(((key, job) for key, job in rows if wanted(job)), limit + 1 - len(found))
            position = rows[-1][0]
            if len(found) <= limit:
                await asyncio.sleep(0)   # the slice held no full page: let others in before the next
    ended = await read_ended() if read_ended is not None else []
    if ended:
        seen = {job.id for _, job in found}
        rows = sorted((row for row in ((sort_key(job), job) for job in ended
                                       if wanted(job) and job.id not in seen and job.id not in active)
                       if after is None or row[0] > after), key=lambda row: row[0])
        found = list(itertools.islice(heapq.merge(found, rows, key=lambda row: row[0]), limit + 1))
    page = found[:limit]
    more = len(found) > limit
    return [job for _, job in page], (page[-1][0] if more and page else None)
