"""Submits on a real SQLite store: a batch is accepted whole and durable, or refused whole with data saying why."""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpud.controller.auth import Principal
from gpud.controller.cluster import Cluster
from gpud.controller.nodes import Gpu, NodeRecord
from gpud.controller.persist import Persister
from gpud.controller.rate import SubmitRate
from gpud.controller.submits import SubmitRefused, Submits
from gpud.plugins import make_plugin_manager
from gpud.policy_file import parse_policy
from gpud.store.sqlite import SQLiteStore

POLICY = {"min_runtime": 0, "grace_period": 5,
          "projects": [{"name": "a", "gpu_quota": 2, "user_pending_jobs": 5}]}
ALICE = Principal("alice")  # no account on this host: refused only where jobs would run here (local_node)


def job(**fields) -> dict:
    return {"project": "a", "command": ["true"], "workdir": "/tmp", "gpus": 1, **fields}


def stored_ids(path: str) -> list[str]:
    with sqlite3.connect(path) as db:
        return sorted(row[0] for row in db.execute("SELECT id FROM jobs"))


@pytest.fixture
async def submits(tmp_path):
    store = SQLiteStore(tmp_path)
    with ThreadPoolExecutor(1) as executor:
        persist = Persister(store, executor)
        cluster = Cluster(parse_policy(POLICY, "test"), make_plugin_manager(), persist)
        cluster.node_messages.register(NodeRecord("n1", cpus=8, memory_gib=64, gpus=[Gpu(0, "g0"), Gpu(1, "g1")]),
                                       tasks=[])

        async def finished_states(ids: list[str]) -> dict[str, str]:
            return await asyncio.get_running_loop().run_in_executor(executor, store.jobs_state, ids)

        service = Submits(cluster.job_service, cluster.node_messages.largest_node, lambda: cluster.policy,
                          SubmitRate(0, 0), persist, finished_states, local_node=False)
        yield service, cluster, store
        await persist.flush()
        store.close()


async def test_an_accepted_batch_is_durable_and_in_the_cluster(submits):
    service, cluster, store = submits
    answer = await service.submit(ALICE, [job(), job(array="0-1")])
    assert answer == {"ids": ["1", "2_0", "2_1"]}
    assert sorted(cluster.jobs) == ["1", "2_0", "2_1"]
    assert stored_ids(store.path) == ["1", "2_0", "2_1"]
    alone = await service.submit(ALICE, [job(array="0-1")], single=True)
    assert alone["array_id"] == "3"


async def test_a_batch_with_one_bad_job_is_refused_whole_naming_it(submits):
    service, cluster, store = submits
    with pytest.raises(SubmitRefused) as refused:
        await service.submit(ALICE, [job(), job(gpus=3)])
    assert (refused.value.status, refused.value.field, refused.value.index) == (422, "gpus", 1)
    assert not cluster.jobs and cluster.job_service.next_seq == 1
    assert stored_ids(store.path) == []


async def test_the_pending_limit_refuses_what_would_pass_it_and_keeps_what_was_there(submits):
    service, cluster, _ = submits
    await service.submit(ALICE, [job()] * 4)
    with pytest.raises(SubmitRefused) as refused:
        await service.submit(ALICE, [job(), job()])
    assert refused.value.status == 429 and "at most 5 pending jobs" in str(refused.value)
    assert sorted(cluster.jobs) == ["1", "2", "3", "4"]


async def test_the_rate_limit_says_when_to_try_again(submits):
    service, _, _ = submits
    service.rate = SubmitRate(1.0, 2.0)
    await service.submit(ALICE, [job(), job()])
    with pytest.raises(SubmitRefused) as refused:
        await service.submit(ALICE, [job()])
    assert refused.value.status == 429 and refused.value.retry_after_s is not None
    assert 0 < refused.value.retry_after_s <= 1.0
    with pytest.raises(SubmitRefused) as never:
        await service.submit(ALICE, [job()] * 3)  # more than the burst: waiting never helps
    assert never.value.retry_after_s is None


async def test_a_dependency_is_looked_up_in_the_store_and_an_unknown_one_refused(submits):
    service, cluster, _ = submits
    (first,) = (await service.submit(ALICE, [job()]))["ids"]
    cluster.job_service.cancel(cluster.jobs[first], "alice")
    await cluster.persist.flush()
    cluster.job_service.recently_ended.clear()  # as after a restart: only the store knows how it ended
    (after,) = (await service.submit(ALICE, [job(depends=[f"afterany:{first}"])]))["ids"]
    assert [dep.met for dep in cluster.jobs[after].depends] == [True]
    with pytest.raises(SubmitRefused) as refused:
        await service.submit(ALICE, [job(depends=["afterok:999"])])
    assert (refused.value.status, refused.value.field) == (422, "depends")


async def test_root_is_refused_without_a_token_that_allows_it(submits):
    service, cluster, _ = submits
    with pytest.raises(SubmitRefused) as refused:
        await service.submit(Principal("root"), [job()])
    assert refused.value.status == 403 and "allow-root" in str(refused.value)
    assert not cluster.jobs
