"""The persister on a real SQLite file (durable at once when waited for, soon after when not); its JSON text."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpud import jsontext

from gpud.controller.persist import ROWS_PER_STEP, Persister
from gpud.jobs import Job
from gpud.store.sqlite import SQLiteStore
from waiting import loop_turn, until


def stored_state(path: str, job_id: str) -> str | None:
    """The job's state as another process reading the file would see it."""
    with sqlite3.connect(path) as db:
        row = db.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return row[0] if row else None


async def test_a_flushed_change_is_in_the_file_and_one_flushed_soon_follows_within_moments(tmp_path):
    store = SQLiteStore(tmp_path)
    with ThreadPoolExecutor(1) as executor:
        persist = Persister(store, executor)
        job = Job(id="7", user="u", project="p", workdir="/tmp", command=["true"])
        persist.job(job)
        await persist.flush()
        assert stored_state(store.path, "7") == "PENDING"
        job.state = "RUNNING"
        persist.job(job)
        persist.flush_soon()
        persist.flush_soon()  # one flush for both
        assert stored_state(store.path, "7") == "PENDING"
        await until(lambda: stored_state(store.path, "7") == "RUNNING", "the flush that was asked for soon")
        assert persist.batches == 2
        store.close()


async def test_a_record_orjson_refuses_is_still_written_and_read_back(tmp_path):
    store = SQLiteStore(tmp_path)
    with ThreadPoolExecutor(1) as executor:
        persist = Persister(store, executor)
        odd = Job(id="8", user="u", project="p", workdir="/tmp", command=["true"], env={"A": "\ud800"})
        persist.job(odd)
        await persist.flush()  # the store keeps writing: this record does not stop it
        assert jsontext.loads(store.job("8"))["env"] == {"A": "\ud800"}
        store.close()


def test_json_text_takes_whatever_the_json_module_takes():
    for value in ({"name": "ok", "n": 1, "x": 1.5, "none": None}, {"big": 2 ** 70}, {"odd": "\udc80"}, {1: "key"}):
        assert json.loads(jsontext.dumps(value)) == json.loads(json.dumps(value))
        assert jsontext.loads(json.dumps(value)) == json.loads(json.dumps(value))
    with pytest.raises(ValueError):
        jsontext.loads("{not json")


CHANGED = 16  # the first jobs change, one a turn of the loop, while the batch is made and written


async def test_a_batch_too_big_for_one_slice_is_written_whole_and_changes_made_meanwhile_follow(tmp_path):
    store = SQLiteStore(tmp_path)
    with ThreadPoolExecutor(1) as executor:
        persist = Persister(store, executor)
        jobs = [Job(id=str(n), user="u", project="p", workdir="/tmp", command=["true"])
                for n in range(ROWS_PER_STEP * 64)]
        for job in jobs:
            persist.job(job)
        first = asyncio.ensure_future(persist.flush())
        changed: set[str] = set()
        turns = 0
        while not first.done():  # while the batch's rows are made and written, the first jobs change, once each
            if turns < CHANGED:
                jobs[turns].state = "RUNNING"
                persist.job(jobs[turns])
                changed.add(jobs[turns].id)
            turns += 1
            await loop_turn()
        await first
        await persist.flush()
        assert len(changed) > 1  # some changed while the batch was made and written
        for job in jobs:
            assert stored_state(store.path, job.id) == ("RUNNING" if job.id in changed else "PENDING")
        store.close()
