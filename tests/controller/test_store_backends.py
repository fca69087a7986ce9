"""The store's promises, on both backends: SQLite (a file) and PostgreSQL (a throwaway server).

What the controller writes in one batch is there after a reopen, or none of
it is; queries answer the same on both; a store written by a newer gpud is
refused; on PostgreSQL a write is refused whole once another controller
holds the lease.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpud.controller.persist import Persister, StoreError
from gpud.jobs import Job
from gpud.store import SCHEMA_VERSION, Event, StoreVersionError, TokenRecord, WriteBatch
from gpud.store.sqlite import SQLiteStore
from waiting import until


def row(job_id: str, seq: int, state: str = "PENDING", user: str = "ann", project: str = "alpha",
        submitted: float = 1.0, ended: float | None = None) -> tuple:
    return (job_id, seq, state, user, project, submitted, ended, f'{{"id": "{job_id}", "state": "{state}"}}')


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request, tmp_path):
    """A function that opens the store (again): the same file, or the same database, each time."""
    opened: list = []
    if request.param == "sqlite":
        def open_store():
            store = SQLiteStore(tmp_path)
            opened.append(store)
            return store
    else:
        from gpud.store.postgres import PostgresStore, create_schema
        url = request.getfixturevalue("pg_url")
        create_schema(url)

        def open_store():
            store = PostgresStore(url, fenced=False)
            opened.append(store)
            return store
    yield open_store
    for store in opened:
        store.close()


def test_a_batch_is_there_after_a_reopen(backend):
    store = backend()
    store.write(WriteBatch(
        jobs=[row("1", 1), row("2", 2, "RUNNING"), row("3", 3, "COMPLETED", ended=5.0)],
        events=[Event(1.0, "submitted", "job 1 submitted", job="1"), Event(2.0, "node", "node up", node="n1")],
        nodes=[("n1", '{"name": "n1"}')],
        tokens=[TokenRecord("h1", "ann", True, 1.0, allow_root=True)],
        meta={"cluster_id": "c-1"},
        answers=[("ann", "k1", "fp", 200, '{"id": "1"}', 10.0)]))
    store.close()
    again = backend()
    loaded = again.load()
    assert sorted(loaded.jobs) == sorted([row("1", 1)[7], row("2", 2, "RUNNING")[7]])  # finished ones are not loaded
    assert loaded.nodes == {"n1": '{"name": "n1"}'}
    assert loaded.tokens == {"h1": TokenRecord("h1", "ann", True, 1.0, allow_root=True)}
    assert loaded.meta["cluster_id"] == "c-1"
    assert loaded.meta["schema_version"] == str(SCHEMA_VERSION)
    assert loaded.last_seq == 3
    assert again.answer("ann", "k1") == ("fp", 200, '{"id": "1"}')
    assert again.answer("ann", "k2") is None
    assert again.events("1") == [Event(1.0, "submitted", "job 1 submitted", job="1")]


def test_a_later_write_replaces_rows_and_revokes_tokens(backend):
    store = backend()
    store.write(WriteBatch(jobs=[row("1", 1)], tokens=[TokenRecord("h1", "ann", False, 1.0)], meta={"k": "a"}))
    store.write(WriteBatch(jobs=[row("1", 1, "COMPLETED", ended=9.0)],
                           tokens=[TokenRecord("h1", "ann", False, 1.0, revoked=3.0)], meta={"k": "b"},
                           nodes=[("n1", "x")]))
    store.write(WriteBatch(nodes=[("n1", "y")]))
    loaded = store.load()
    assert loaded.jobs == []
    assert loaded.tokens["h1"].revoked == 3.0
    assert loaded.meta["k"] == "b"
    assert loaded.nodes == {"n1": "y"}
    assert store.job("1") == row("1", 1, "COMPLETED")[7]


def test_a_failed_batch_leaves_nothing_behind(backend):
    store = backend()
    store.write(WriteBatch(jobs=[row("1", 1)]))
    bad = WriteBatch(jobs=[row("2", 2)], events=[Event(1.0, "x", None, job="2")])  # type: ignore[arg-type]
    with pytest.raises(Exception):
        store.write(bad)
    assert store.job("2") is None
    store.write(WriteBatch(jobs=[row("3", 3)]))  # the store goes on after a refused batch
    assert store.jobs_state(["1", "2", "3"]) == {"1": "PENDING", "3": "PENDING"}


def test_queries_answer_alike(backend):
    store = backend()
    store.write(WriteBatch(jobs=[
        row("7_0", 7, "COMPLETED", ended=3.0), row("7_1", 7, "PENDING"), row("7_10", 7, "FAILED", ended=4.0),
        row("70", 8, "PENDING"), row("7", 6, "COMPLETED", ended=1.0),
        row("9", 9, "COMPLETED", user="bob", project="beta", ended=2.0)]))
    assert sorted(store.array_jobs("7")) == sorted(row(i, 7)[7].replace("PENDING", s) for i, s in
                                                   (("7_0", "COMPLETED"), ("7_1", "PENDING"), ("7_10", "FAILED")))
    assert store.array_states("7") == {"COMPLETED": 1, "PENDING": 1, "FAILED": 1}
    assert store.array_jobs("8") == [] and store.array_states("8") == {}
    assert store.jobs_state(["7_1", "9", "nope"]) == {"7_1": "PENDING", "9": "COMPLETED"}
    ended = [r for r in store.history(since=None, user=None, project=None, limit=10)]
    assert [r.split('"')[3] for r in ended] == ["7_10", "7_0", "9", "7"]  # most recently ended first
    assert [r.split('"')[3] for r in store.history(since=2.0, user=None, project=None, limit=10)] == \
        ["7_10", "7_0", "9"]
    assert [r.split('"')[3] for r in store.history(since=None, user="bob", project="beta", limit=10)] == ["9"]
    assert len(store.history(since=None, user=None, project=None, limit=2)) == 2


def test_events_keep_the_last_ones_oldest_first(backend):
    store = backend()
    store.write(WriteBatch(events=[Event(float(i), "k", f"m{i}", job="1") for i in range(5)]))
    assert [e.message for e in store.events("1", limit=3)] == ["m2", "m3", "m4"]


def test_old_answers_are_forgotten(backend):
    store = backend()
    store.write(WriteBatch(answers=[("ann", "old", "f", 200, "{}", 1.0), ("ann", "new", "f", 200, "{}", 100.0)]))
    assert store.forget_answers(50.0) == 1
    assert store.answer("ann", "old") is None and store.answer("ann", "new") is not None


def test_usage_is_saved_whole_and_read_back(backend):
    store = backend()
    usage = store.usage()
    assert usage.load() == ({}, None)
    usage.save({("project", "default", "alpha"): (1.0, 2.0, 3.0)}, 10.0)
    usage.save({("project", "default", "beta"): (4.0, 5.0, 6.0)}, 20.0)
    store.write(WriteBatch(jobs=[row("1", 1, "COMPLETED", ended=15.0), row("2", 2, "COMPLETED", ended=25.0)]))
    usage.close()
    again = backend().usage()
    assert again.load() == ({("project", "default", "beta"): (4.0, 5.0, 6.0)}, 20.0)
    assert again.ended_between(10.0, 20.0) == [row("1", 1, "COMPLETED")[7]]
    again.close()


def test_a_store_of_a_newer_gpud_is_refused(backend):
    store = backend()
    store.write(WriteBatch(meta={"schema_version": str(SCHEMA_VERSION + 1)}))
    store.close()
    with pytest.raises(StoreVersionError, match="newer gpud"):
        backend()


async def test_an_acknowledged_submit_is_committed(backend):
    store = backend()
    with ThreadPoolExecutor(1) as executor:
        persist = Persister(store, executor)
        await persist.new_jobs([Job(id="5", user="u", project="p", workdir="/tmp", command=["true"])])
        other = backend()  # another connection, as a restarted controller would read
        assert other.jobs_state(["5"]) == {"5": "PENDING"}


# ---------------------------------------------------------------- PostgreSQL's fencing

def test_a_write_under_an_old_term_is_refused_whole(pg_url):
    from gpud.store import Fenced
    from gpud.store.postgres import PostgresStore, create_schema
    from gpud.store.lease import take_sync
    create_schema(pg_url)
    old, new = PostgresStore(pg_url), PostgresStore(pg_url)
    try:
        with pytest.raises(Fenced):  # no term at all: not a leader
            old.write(WriteBatch(jobs=[row("1", 1)]))
        old.term = take_sync(pg_url, "old", "http://a", lease_s=0.0)
        old.write(WriteBatch(jobs=[row("1", 1)]))
        new.term = take_sync(pg_url, "new", "http://b", lease_s=30.0)
        assert new.term == old.term + 1
        with pytest.raises(Fenced, match=f"term {old.term} is over"):
            old.write(WriteBatch(jobs=[row("2", 2)], meta={"x": "1"}))
        with pytest.raises(Fenced):
            old.usage().save({}, 1.0)
        with pytest.raises(Fenced):
            old.forget_answers(1e12)
        new.write(WriteBatch(jobs=[row("3", 3)]))
        assert new.jobs_state(["1", "2", "3"]) == {"1": "PENDING", "3": "PENDING"}
        assert new.meta_value("x") is None
    finally:
        old.close()
        new.close()


async def test_a_fenced_batch_is_refused_to_its_waiters(pg_url):
    from gpud.store.postgres import PostgresStore, create_schema
    from gpud.store.lease import take_sync
    create_schema(pg_url)
    store = PostgresStore(pg_url)
    store.term = take_sync(pg_url, "old", "http://a", lease_s=0.0)
    take_sync(pg_url, "new", "http://b", lease_s=30.0)
    fenced: list = []
    with ThreadPoolExecutor(1) as executor:
        persist = Persister(store, executor)
        persist.on_fenced = fenced.append
        with pytest.raises(StoreError, match="term"):
            await asyncio.shield(persist.new_jobs([Job(id="5", user="u", project="p", workdir="/tmp",
                                                       command=["true"])]))
    assert len(fenced) == 1
    assert store.jobs_state(["5"]) == {}
    store.close()


async def test_a_takeover_ends_a_write_left_holding_a_lease_that_ran_out(pg_url):
    """A leader paused inside a write holds the lease row where the server's idle timeout cannot end it (in a
    pipeline, before its Sync); a takeover ends that session once the lease has run out, and takes the lease."""
    import psycopg

    from gpud.store.lease import Lease, take_sync
    from gpud.store.postgres import create_schema
    create_schema(pg_url)
    old_term = take_sync(pg_url, "old", "http://a", lease_s=2.0)
    paused = psycopg.connect(pg_url)  # no idle timeout: a session the server leaves alone, as mid-pipeline
    standby = Lease(pg_url, "new", "http://b", lease_s=30.0)
    try:
        paused.execute("SELECT term FROM lease WHERE id = 1 FOR SHARE")
        assert await standby.take() is None  # the lease has not run out: its holder's session is left alone
        assert paused.execute("SELECT 1").fetchone() == (1,)
        with psycopg.connect(pg_url, autocommit=True) as db:  # a plain read: it does not wait for the lock
            await until(lambda: db.execute("SELECT expires < now() FROM lease").fetchone()[0],
                             "the lease to run out")
        assert await asyncio.wait_for(standby.take(), 10.0) is None  # waited for the write, then ended it
        with pytest.raises(psycopg.OperationalError):
            paused.execute("INSERT INTO meta VALUES ('late', 'write')")
        assert await standby.take() == old_term + 1
        with psycopg.connect(pg_url, autocommit=True) as db:
            assert db.execute("SELECT count(*) FROM meta WHERE key = 'late'").fetchone() == (0,)
    finally:
        paused.close()
        await standby.close()
