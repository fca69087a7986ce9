"""A store whose commits fail never costs an acknowledged job, and never runs a refused one.

A real controller (in this process, real HTTP on 127.0.0.1, a real SQLite
file) and a real node agent with fake GPUs whose tasks are real processes;
under the store's SQLite connection sits a layer that fails chosen COMMITs
the way a full disk does (rolled back, "database or disk is full") and makes
each commit a little slow, as fsync is, so batches are written while other
requests mark their jobs. Several clients submit at once. Afterwards: every
job answered 201 is in the store a restarted controller reads, and ran; no
job answered 503 is in the store or in the controller's memory, and
none ran.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from daemons import free_port
from gpud import jsontext
from gpud.controller.app import make_app
from gpud.controller.config import ControllerConfig
from gpud.controller.keys import CONTROLLER
from gpud.controller.node_link import connect_in_process
from gpud.gpu.fake import FakeBackend
from gpud.node.agent import NodeAgent
from gpud.node.config import NodeConfig
from gpud.store.sqlite import SQLiteStore
from node_helpers import kill_everything
from waiting import until

SUBMITTERS = 6
JOBS_EACH = 12


class FailingConnection:
    """An SQLite connection whose COMMITs fail on demand as a full disk makes them fail, and take ``slow_s``."""

    def __init__(self, db: sqlite3.Connection, seed: int, failure_rate: float, slow_s: float) -> None:
        self.db = db
        self.rng = random.Random(seed)
        self.failure_rate = failure_rate
        self.slow_s = slow_s
        self.failing = False
        self.failed = 0
        self.committed = 0

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT":
            time.sleep(self.slow_s)
            if self.failing and self.rng.random() < self.failure_rate:
                self.db.execute("ROLLBACK")   # as SQLite does itself when the disk is full at COMMIT
                self.failed += 1
                full = sqlite3.OperationalError("database or disk is full")
                full.sqlite_errorcode = sqlite3.SQLITE_FULL  # as SQLite's own error carries it
                raise full
            self.committed += 1
        return self.db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


@pytest.mark.parametrize("seed", [1, 2])
async def test_failed_commits_lose_no_acknowledged_job_and_run_no_refused_one(tmp_path: Path, seed: int):
    policy = tmp_path / "policy.toml"
    policy.write_text('grace_period = 1\nmin_runtime = 0\n[[projects]]\nname = "alpha"\ngpu_quota = 4\n')
    state, markers, work = tmp_path / "controller", tmp_path / "markers", tmp_path / "work"
    markers.mkdir()
    work.mkdir()
    port = free_port()
    app = make_app(ControllerConfig(host="127.0.0.1", port=port, state_dir=str(state), policy=str(policy),
                                    interval_s=0.2, heartbeat_s=0.2, init=True, admin_allow_root=True))
    ctrl = app[CONTROLLER]
    faults = FailingConnection(ctrl.store.db, seed, failure_rate=0.4, slow_s=0.003)
    ctrl.store.db = faults
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    node_dir = tmp_path / "node"
    agent = NodeAgent(NodeConfig(state_dir=str(node_dir), name="n1", gpu_backend="fake", fake_gpus=2, cpus=64,
                                 memory_gib=64, reconnect_max_s=0.2), FakeBackend("n1", 2, str(node_dir)),
                      connect=connect_in_process(ctrl))
    url = f"http://127.0.0.1:{port}/api/v1/jobs"
    headers = {"Authorization": f"Bearer {(state / 'admin.token').read_text().strip()}"}
    answers: dict[str, int] = {}
    messages: set[str] = set()

    def job(name: str) -> dict:
        return {"project": "alpha", "workdir": str(work), "name": name, "gpus": 0, "cpus": 0.1, "memory_gib": 0.05,
                "output": "/dev/null", "error": "/dev/null", "command": ["sh", "-c", f"echo ran > {markers / name}"]}

    async def submitter(session: aiohttp.ClientSession, number: int) -> None:
        for index in range(JOBS_EACH):
            name = f"s{number}j{index}"
            extra = {"Idempotency-Key": str(uuid.uuid4())} if index % 2 else {}
            for _ in range(2):  # a refused idempotent submit is sent again with its key, as gpuctl may
                async with session.post(url, json=job(name), headers={**headers, **extra}) as answer:
                    answers[name] = answer.status
                    body = await answer.json()
                if answer.status != 201:
                    messages.add(body["error"])
                if answer.status == 201 or not extra:
                    break

    try:
        await agent.start()
        await until(lambda: "n1" in ctrl.links, "the node to connect", timeout=120.0)
        faults.failing = True
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(submitter(session, n) for n in range(SUBMITTERS)))
            acked = {name for name, status in answers.items() if status == 201}
            refused = {name for name, status in answers.items() if status == 503}
            assert acked | refused == set(answers), answers
            assert faults.failed and acked and refused, (faults.failed, len(acked), len(refused))
            assert all("database or disk is full" in m and "state store" in m and "free space" in m
                       for m in messages), messages
            faults.failing = False
            await until(lambda: all((markers / name).exists() for name in acked), "every acknowledged job to run", timeout=120.0)
            await until(lambda: not any(j.state in ("PENDING", "RUNNING") for j in ctrl.cluster.jobs.values()),
                        "every job to end")
            in_memory = {j.name for j in ctrl.cluster.jobs.values()} | {j.name for j in ctrl.cluster.job_service.staged.values()}
            assert not refused & in_memory
    finally:
        await agent.stop()
        await runner.cleanup()
        kill_everything(str(node_dir))
    store = SQLiteStore(state)   # what a restarted controller reads
    try:
        stored = {jsontext.loads(store.job(job_id) or "{}").get("name")
                  for (job_id,) in store.db.execute("SELECT id FROM jobs")}
    finally:
        store.close()
    ran = set(os.listdir(markers))
    assert acked - stored == set(), "acknowledged jobs lost"
    assert refused & stored == set(), "refused jobs stored"
    assert refused & ran == set(), "refused jobs ran"
