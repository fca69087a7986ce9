"""What ``gpud up`` does once it serves: submit the demo jobs, report job changes, stop when idle or on a signal."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from gpud.cli.projects_cmd import projects_table
from gpud.cli.queue_cmd import history_table, queue_table
from gpud.controller.job_reason import UNDECIDED
from gpud.waits import wait_event

if TYPE_CHECKING:
    import aiohttp

WATCH_S = 0.5
DEMO_PROJECTS = ("alice-lab", "bob-lab")
DEMO_SLEEP_S = 4
PLAN_TIMEOUT_S = 10.0  # for the first cycle after the node registered


class Api:
    """The embedded controller's REST API, called with the admin token from inside ``gpud up``."""

    def __init__(self, url: str, token_file: str) -> None:
        self.url = url
        self.token_file = token_file
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "Api":
        import aiohttp
        with open(self.token_file, encoding="utf-8") as f:
            token = f.read().strip()
        self._session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"})
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._session is not None
        await self._session.close()

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        """The JSON answer of ``METHOD /api/v1/PATH``; RuntimeError with the controller's message on an error."""
        assert self._session is not None, "Api is used inside ``async with``"
        async with self._session.request(method, f"{self.url}/api/v1/{path}", json=body) as answer:
            payload = await answer.json(content_type=None)
            if answer.status >= 400:
                raise RuntimeError(f"{method} /api/v1/{path}: {payload.get('error')} (HTTP {answer.status})")
            return payload

    async def wait_node_up(self, name: str, timeout: float) -> None:
        """Wait until the controller lists node ``name`` as up; RuntimeError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            nodes = (await self.call("GET", "nodes"))["nodes"]
            if any(node["name"] == name and node["state"] == "up" for node in nodes):
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"the node {name} did not register with the controller in {timeout:.0f} s")


def demo_jobs(gpus: int, workdir: str) -> list[dict]:
    """Example jobs for ``gpus`` GPUs: both labs ask for more than their quota, bob-lab also for one big job.

    Together they want about twice the GPUs there are, so the first wave
    shows the fair shares and the big job waits over quota.
    """
    script = f"echo job $GPUD_JOB_ID of $GPUD_PROJECT on GPUs $CUDA_VISIBLE_DEVICES; sleep {DEMO_SLEEP_S}"
    big = max(2, gpus // 2)

    def job(project: str, name: str, n: int) -> dict:
        return {"project": project, "name": name, "gpus": n, "workdir": workdir, "cpus": 0.1,
                "memory_gib": 0.1, "command": ["/bin/sh", "-c", script], "env": {"GPUD_PROJECT": project}}

    alice = [job("alice-lab", f"train-{i}", 1) for i in range(max(2, gpus * 3 // 4))]
    bob = [job("bob-lab", f"eval-{i}", 1) for i in range(max(2, gpus // 2))]
    return alice + bob + [job("bob-lab", "big-sweep", min(big, gpus))]


async def _queues(api: Api, timeout: float) -> list[dict]:
    """The projects' queues, once the first scheduling cycle with the node has listed them."""
    deadline = time.monotonic() + timeout
    while True:
        queues = (await api.call("GET", "projects"))["queues"]
        if queues or time.monotonic() > deadline:
            return queues
        await asyncio.sleep(0.05)


async def submit_demo(api: Api, gpus: int, workdir: str, out: TextIO) -> list[str]:
    """Submit the demo jobs in one batch and return their ids; RuntimeError when the policy lacks the demo's projects."""
    names = {queue["name"] for queue in await _queues(api, PLAN_TIMEOUT_S)}
    missing = [name for name in DEMO_PROJECTS if name not in names]
    if missing:
        raise RuntimeError(f"--demo needs the projects {', '.join(DEMO_PROJECTS)} in the policy; "
                           f"it lacks {', '.join(missing)}")
    os.makedirs(workdir, exist_ok=True)
    ids = (await api.call("POST", "jobs/batch", {"jobs": demo_jobs(gpus, workdir)}))["ids"]
    print(f"\ndemo: submitted {len(ids)} jobs from alice-lab and bob-lab; their output is in {workdir}",
          file=out, flush=True)
    return ids


class Watcher:
    """Prints each job's change of state, and the queue and project tables once the first jobs are placed."""

    def __init__(self, api: Api, out: TextIO) -> None:
        self.api = api
        self.out = out
        self.seen: dict[str, str] = {}
        self.finished: list[dict] = []
        self.tables_shown = False

    async def poll(self) -> int:
        """Look at the active jobs once, print what changed; returns how many jobs are still active."""
        active = (await self.api.call("GET", "jobs"))["jobs"]
        now_ids = set()
        for job in sorted(active, key=_job_order):
            now_ids.add(job["id"])
            if job["state"] == "PENDING" and job.get("reason_code") == UNDECIDED:
                continue  # not looked at by a cycle yet: its real reason comes with the next poll
            if self.seen.get(job["id"]) != job["state"]:
                self.seen[job["id"]] = job["state"]
                self._line(job)
        for job_id in sorted((i for i in self.seen if i not in now_ids), key=lambda i: _job_order({"id": i})):
            del self.seen[job_id]
            job = await self.api.call("GET", f"jobs/{job_id}")
            self.finished.append(job)
            self._line(job)
        if not self.tables_shown and any(job["state"] == "RUNNING" for job in active) \
                and any(job["state"] == "PENDING" for job in active):
            self.tables_shown = True
            await self.tables()
        return len(active)

    def _line(self, job: dict) -> None:
        what = f"{job['state']:<9} job {job['id']:>4} {job['name']:<10} {job['project']:<10} "
        if job["state"] == "PENDING":
            what += job.get("reason") or ""
        elif job["state"] == "RUNNING":
            what += f"on {', '.join(job.get('nodes') or [])}"
        else:
            code = job.get("exit_code")
            what += f"exit {code}" if job.get("term_signal") is None else f"signal {job['term_signal']}"
        print(f"{time.strftime('%H:%M:%S')} {what.rstrip()}", file=self.out, flush=True)

    async def tables(self) -> None:
        """Print the queue and the projects' fair shares as gpuctl would show them."""
        jobs = (await self.api.call("GET", "jobs"))["jobs"]
        queues = (await self.api.call("GET", "projects"))["queues"]
        jobs.sort(key=_job_order)
        print(f"\n$ gpuctl queue\n{queue_table(jobs, time.time())}\n\n$ gpuctl projects\n"
              f"{projects_table(queues)}\n", file=self.out, flush=True)


async def run(api: Api, options: Any, stop: asyncio.Event, out: TextIO = sys.stdout) -> int:
    """Submit the demo jobs if asked, then serve until ``stop`` is set or, with ``exit_when_idle``, no job is active."""
    watcher = Watcher(api, out) if options.demo or options.exit_when_idle else None
    if options.demo:
        nodes = (await api.call("GET", "nodes"))["nodes"]
        gpus = sum(len(node["gpus"]) for node in nodes if node["name"] == options.node_name)
        await submit_demo(api, gpus, os.path.join(options.state_dir, "demo"), out)
    while not stop.is_set():
        active = await watcher.poll() if watcher is not None else 1
        if options.exit_when_idle and active == 0:
            assert watcher is not None  # exit_when_idle makes one
            return _summary(watcher, out)
        await wait_event(stop, WATCH_S)
    print("gpud up: stopping; running jobs keep running and the next gpud up picks them up", file=out, flush=True)
    return 0


def _job_order(job: dict) -> tuple:
    """Jobs in submission order: by the number of the id, then the array index."""
    head, _, index = str(job["id"]).partition("_")
    return (int(head) if head.isdigit() else 0, int(index) if index.isdigit() else -1, str(job["id"]))


def _summary(watcher: Watcher, out: TextIO) -> int:
    finished = sorted(watcher.finished, key=lambda job: job.get("ended") or 0, reverse=True)
    failed = [job for job in finished if job["state"] != "COMPLETED"]
    if finished:
        print(f"\n$ gpuctl history\n{history_table(finished, time.time())}", file=out, flush=True)
    print(f"\ngpud up: no job left; {len(finished) - len(failed)} completed, {len(failed)} did not", file=out,
          flush=True)
    return 1 if failed else 0
