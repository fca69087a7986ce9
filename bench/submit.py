"""Benchmark of job submission through the controller's real HTTP API, against Slurm's figures.

Starts a real controller (`gpud controller`, its own process, SQLite store with
synchronous=FULL in a temporary directory) on 127.0.0.1, a fresh one for each
measure, and times:
  one client    N jobs one per request over one keep-alive connection
                (http.client, and aiohttp; the faster counts);
  N clients     the same N jobs split over concurrent clients, each on its own
                keep-alive connection (separate processes with http.client, and
                one asyncio process with aiohttp; the faster counts);
  latency       submit -> RUNNING on an idle cluster: one job at a time, from
                the moment the submit request is sent until a stand-in node
                (in this process, speaking the node WebSocket of docs/api.md)
                has received the start order AND the API shows the job RUNNING.
    python bench/submit.py [--jobs 5000] [--clients 8] [--latency-jobs 200] [--quick] [--json]
                           [--repeat 3] [--synchronous normal] [--profile DIR]
Then the same clients against the floor: an aiohttp app that only reads the
JSON and answers 201, what any submit API on aiohttp costs at least; one
client against the durable floor, the same app committing each job to SQLite
with the same synchronous setting before it answers; and the server's CPU per
job (from /proc) in the best run of each.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp

POLICY = """\
[[projects]]
name = "bench"
gpu_quota = 100000
cpu_quota = 10000000
memory_quota_gib = 100000000
"""
SLURM = {"one": 203.0, "many": 425.0, "latency_median": 0.44}
TARGETS = {"one": 2000.0, "many": 4250.0, "latency_median": 0.040}
STAND_IN_GPUS = 8


def job_body(index: int, workdir: str) -> bytes:
    """One job as a script submits it: an argv, a project, one GPU."""
    return json.dumps({"project": "bench", "command": ["python", "train.py", f"--seed={index}"],
                       "workdir": workdir, "gpus": 1, "cpus": 1, "memory_gib": 1}).encode()


class Controller:
    """A `gpud controller` process with its own state directory, stopped by pid."""

    def __init__(self, root: Path, name: str, synchronous: str = "full", store: str | None = None) -> None:
        self.dir = root / name
        self.dir.mkdir()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        (self.dir / "policy.toml").write_text(POLICY)
        (self.dir / "controller.toml").write_text(
            f'listen = "127.0.0.1:{self.port}"\nstate_dir = "state"\npolicy = "policy.toml"\n'
            f'[scheduler]\nheartbeat_s = 5\n[store]\nsynchronous = "{synchronous}"\n'
            + (f'url = "{store}"\n' if store else ""))
        self.log = open(self.dir / "controller.log", "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpud.cli.gpud_main", "controller", "--config", str(self.dir / "controller.toml"),
             "--log-level", "warning",
             *([] if (self.dir / "state" / "gpud.sqlite").exists() and not store else ["--init", "--allow-root"])],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"the controller did not start:\n{(self.dir / 'controller.log').read_text()}")
            time.sleep(0.05)
        self.token = (self.dir / "state" / "admin.token").read_text().strip()
        self.key = (self.dir / "state" / "cluster.key").read_text().strip()
        self.workdir = str(self.dir)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as answer:
                return answer.status == 200 and json.loads(answer.read()).get("role", "leader") == "leader"
        except OSError:
            return False

    def stop(self) -> None:
        terminate(self.process)
        self.log.close()


FLOOR_APP = """
import sqlite3
import sys
from aiohttp import web

db = None
if len(sys.argv) > 2:  # the durable floor: each job committed to SQLite before the answer
    db = sqlite3.connect(sys.argv[2], isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=" + sys.argv[3])
    db.execute("CREATE TABLE IF NOT EXISTS jobs (seq INTEGER PRIMARY KEY, record TEXT)")

async def submit(request):
    if not request.headers.get("Authorization", "").startswith("Bearer "):
        raise web.HTTPUnauthorized()
    body = await request.json()
    if db is not None:
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO jobs (record) VALUES (?)", (str(body),))
        db.execute("COMMIT")
    return web.json_response({"id": "1"}, status=201)

app = web.Application()
app.router.add_post("/api/v1/jobs", submit)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


class FloorServer:
    """The floor: an aiohttp app that only checks the token's presence, reads the JSON and answers 201.

    What any submit API on aiohttp costs before it stores or schedules
    anything, measured with the same clients as the controller. With
    ``synchronous``, the durable floor: it also commits each job to SQLite
    (WAL, that synchronous setting) before it answers.
    """

    def __init__(self, root: Path, synchronous: str | None = None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.token, self.workdir = "floor", str(root)
        store = [] if synchronous is None else [str(root / f"floor-{self.port}.sqlite"), synchronous]
        self.process = subprocess.Popen([sys.executable, "-c", FLOOR_APP, str(self.port), *store])
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise SystemExit("the floor server did not start")
                time.sleep(0.05)

    def stop(self) -> None:
        terminate(self.process)


def terminate(process: subprocess.Popen) -> None:
    """SIGTERM the process, SIGKILL it if it is still there 20 s later, and reap it."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def process_cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` has used so far (user and system), from /proc; 0 off Linux."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Profiler:
    """py-spy recording the controller while a measure runs (only with --profile)."""

    def __init__(self, out: Path | None, name: str, pid: int) -> None:
        self.process = None
        self.path = None
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if out is not None and os.path.exists(spy):
            out.mkdir(parents=True, exist_ok=True)
            self.path = out / f"{name}.txt"
            self.process = subprocess.Popen([spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "250",
                                             "-o", str(self.path), "--nonblocking"],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.5)

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGINT)
            self.process.wait(30)


# ------------------------------------------------------------- throughput


def http_client_submit(port: int, token: str, workdir: str, first: int, count: int) -> int:
    """Submit ``count`` jobs one per request over one keep-alive http.client connection; returns how many."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    done = 0
    for index in range(first, first + count):
        conn.request("POST", "/api/v1/jobs", body=job_body(index, workdir), headers=headers)
        answer = conn.getresponse()
        answer.read()
        if answer.status != 201:
            raise SystemExit(f"submit refused: {answer.status}")
        done += 1
    conn.close()
    return done


def _worker(args: tuple) -> tuple[float, float]:
    port, token, workdir, first, count, start_at = args
    while time.time() < start_at:
        time.sleep(0.001)
    began = time.time()
    http_client_submit(port, token, workdir, first, count)
    return began, time.time()


def processes_submit(ctrl: Controller, jobs: int, clients: int) -> float:
    """``clients`` processes, each one keep-alive http.client connection; returns jobs/s from first send to last answer."""
    share = [jobs // clients + (1 if i < jobs % clients else 0) for i in range(clients)]
    starts = [sum(share[:i]) for i in range(clients)]
    with multiprocessing.get_context("fork").Pool(clients) as pool:
        start_at = time.time() + 0.5
        spans = pool.map(_worker, [(ctrl.port, ctrl.token, ctrl.workdir, starts[i], share[i], start_at)
                                   for i in range(clients)])
    return jobs / (max(end for _, end in spans) - min(begin for begin, _ in spans))


async def aiohttp_submit(ctrl: Controller, jobs: int, clients: int) -> float:
    """``clients`` concurrent aiohttp sessions (one connection each) in one process; returns jobs/s."""
    headers = {"Authorization": f"Bearer {ctrl.token}", "Content-Type": "application/json"}
    url = f"http://127.0.0.1:{ctrl.port}/api/v1/jobs"
    share = [jobs // clients + (1 if i < jobs % clients else 0) for i in range(clients)]

    async def client(first: int, count: int, session: aiohttp.ClientSession) -> None:
        for index in range(first, first + count):
            async with session.post(url, data=job_body(index, ctrl.workdir), headers=headers) as answer:
                await answer.read()
                if answer.status != 201:
                    raise SystemExit(f"submit refused: {answer.status}")

    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) for _ in range(clients)]
    try:
        began = time.perf_counter()
        await asyncio.gather(*(client(sum(share[:i]), share[i], sessions[i]) for i in range(clients)))
        elapsed = time.perf_counter() - began
    finally:
        for session in sessions:
            await session.close()
    return jobs / elapsed


def one_client_http_client(ctrl: Controller, jobs: int) -> float:
    began = time.perf_counter()
    http_client_submit(ctrl.port, ctrl.token, ctrl.workdir, 0, jobs)
    return jobs / (time.perf_counter() - began)


# ---------------------------------------------------------------- latency


class StandInNode:
    """A node daemon's WebSocket side, in this process: tasks start at once and exit a moment later."""

    def __init__(self, ctrl: Controller, run_s: float = 0.005) -> None:
        self.ctrl = ctrl
        self.run_s = run_s
        self.tasks: dict[tuple, dict] = {}
        self.started: dict[str, float] = {}
        self.waiters: dict[str, asyncio.Future] = {}
        self.acked: dict[str, asyncio.Future] = {}
        self.ws: aiohttp.ClientWebSocketResponse | None = None

    async def connect(self, session: aiohttp.ClientSession) -> None:
        self.ws = await session.ws_connect(f"http://127.0.0.1:{self.ctrl.port}/api/v1/node/connect",
                                           headers={"Authorization": f"Bearer {self.ctrl.key}"})
        gpus = [{"index": i, "uuid": f"GPU-standin-{i}", "model": "stand-in", "memory_gib": 80.0, "healthy": True}
                for i in range(STAND_IN_GPUS)]
        await self.ws.send_json({"type": "register", "node": "standin", "pool": "default", "labels": {},
                                 "cpus": 64, "memory_gib": 512.0, "gpus": gpus, "tasks": [],
                                 "version": "bench"})
        answer = await self.ws.receive_json(timeout=10)
        if answer.get("type") != "registered":
            raise SystemExit(f"the stand-in node was not registered: {answer}")
        self.reader = asyncio.create_task(self._read())
        self.beat = asyncio.create_task(self._heartbeat(float(answer.get("heartbeat_s", 5.0))))

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            order = json.loads(msg.data)
            kind = order.get("type")
            if kind == "start":
                job = str(order["job"])
                self.started.setdefault(job, time.perf_counter())
                waiter = self.waiters.get(job)
                if waiter is not None and not waiter.done():
                    waiter.set_result(self.started[job])
                key = (job, order["task"], order["attempt"])
                report = {"job": job, "task": order["task"], "attempt": order["attempt"], "state": "running",
                          "pid": 4242, "exit_code": None, "term_signal": None, "reason": "",
                          "started": time.time(), "ended": None}
                self.tasks[key] = report
                await self.ws.send_json({"type": "task", **report})
                asyncio.get_running_loop().call_later(self.run_s, self._exit, key)
            elif kind == "ack":
                key = (str(order["job"]), order["task"], order["attempt"])
                self.tasks.pop(key, None)
                waiter = self.acked.get(key[0])
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            elif kind == "stop":
                self._exit((str(order["job"]), order["task"], order["attempt"]), signal_=15)

    def _exit(self, key: tuple, signal_: int | None = None) -> None:
        report = self.tasks.get(key)
        if report is None or report["state"] == "exited":
            return
        report.update(state="exited", exit_code=None if signal_ else 0, term_signal=signal_, ended=time.time())
        asyncio.ensure_future(self.ws.send_json({"type": "task", **report}))

    async def _heartbeat(self, period: float) -> None:
        while True:
            await asyncio.sleep(period)
            await self.ws.send_json({"type": "heartbeat", "tasks": list(self.tasks.values())})

    async def close(self) -> None:
        self.beat.cancel()
        await self.ws.close()
        self.reader.cancel()


async def latency(ctrl: Controller, samples: int) -> list[float]:
    """Submit -> RUNNING (start order at the node and RUNNING in the API), one job at a time, in seconds."""
    headers = {"Authorization": f"Bearer {ctrl.token}", "Content-Type": "application/json"}
    base = f"http://127.0.0.1:{ctrl.port}"
    times = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)) as session:
        node = StandInNode(ctrl)
        await node.connect(session)
        await asyncio.sleep(0.3)
        for index in range(samples + 5):
            loop = asyncio.get_running_loop()
            began = time.perf_counter()
            async with session.post(base + "/api/v1/jobs", data=job_body(index, ctrl.workdir),
                                    headers=headers) as answer:
                body = await answer.json()
            job = body["ids"][0]
            if job not in node.started:
                node.waiters[job] = loop.create_future()
                node.acked[job] = loop.create_future()
                await asyncio.wait_for(node.waiters[job], 10)
            else:
                node.acked[job] = loop.create_future()
            while True:
                async with session.get(f"{base}/api/v1/jobs/{job}", headers=headers) as answer:
                    state = (await answer.json())["state"]
                if state in ("RUNNING", "COMPLETED"):
                    break
            seen = time.perf_counter()
            if index >= 5:                      # the first few warm the connections and the scheduler
                times.append(max(node.started[job], seen) - began)
            await asyncio.wait_for(node.acked[job], 10)
        await node.close()
    return times


# ------------------------------------------------------------------ report


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per throughput measure (default 5000)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    parser.add_argument("--latency-jobs", type=int, default=200, help="jobs timed submit -> RUNNING (default 200)")
    parser.add_argument("--quick", action="store_true", help="1,000 jobs and 50 latency samples")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--repeat", type=int, default=1, help="run each measure this many times, keep the best "
                                                            "(default 1; for a busy machine)")
    parser.add_argument("--synchronous", choices=("full", "normal"), default="full",
                        help="the store's SQLite synchronous setting (default full: an fsync per commit)")
    parser.add_argument("--profile", type=Path, help="record the controller with py-spy into this directory "
                                                     "(raw collapsed stacks, one file per measure)")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.latency_jobs = min(args.jobs, 1000), min(args.latency_jobs, 50)
    root = Path(tempfile.mkdtemp(prefix="gpud-bench-"))
    figures: dict[str, float] = {}
    cpu_ms: dict[str, float] = {}  # the server's CPU per job in the best run of each throughput measure
    try:
        def measure(name: str, run, server=None) -> float:
            best = 0.0
            for attempt in range(args.repeat):
                ctrl = server() if server else Controller(root, f"{name}-{attempt}", args.synchronous)
                profiler = Profiler(args.profile if not server else None, f"{name}-{attempt}", ctrl.process.pid)
                try:
                    began = process_cpu_s(ctrl.process.pid)
                    rate = run(ctrl)
                    if rate > best:
                        best = rate
                        cpu_ms[name] = (process_cpu_s(ctrl.process.pid) - began) * 1000 / args.jobs
                finally:
                    profiler.stop()
                    ctrl.stop()
            figures[name] = best
            return best

        measure("one_http_client", lambda c: one_client_http_client(c, args.jobs))
        measure("one_aiohttp", lambda c: asyncio.run(aiohttp_submit(c, args.jobs, 1)))
        measure("many_processes", lambda c: processes_submit(c, args.jobs, args.clients))
        measure("many_aiohttp", lambda c: asyncio.run(aiohttp_submit(c, args.jobs, args.clients)))
        floor = lambda: FloorServer(root)  # noqa: E731
        measure("floor_one_http_client", lambda c: one_client_http_client(c, args.jobs), floor)
        measure("floor_one_aiohttp", lambda c: asyncio.run(aiohttp_submit(c, args.jobs, 1)), floor)
        measure("floor_many_processes", lambda c: processes_submit(c, args.jobs, args.clients), floor)
        measure("floor_many_aiohttp", lambda c: asyncio.run(aiohttp_submit(c, args.jobs, args.clients)), floor)
        durable = lambda: FloorServer(root, args.synchronous)  # noqa: E731
        measure("durable_floor_one_http_client", lambda c: one_client_http_client(c, args.jobs), durable)
        measure("durable_floor_one_aiohttp", lambda c: asyncio.run(aiohttp_submit(c, args.jobs, 1)), durable)
        runs: list[list[float]] = []
        measure("latency", lambda c: runs.append(asyncio.run(latency(c, args.latency_jobs))) or 0.0)
        samples = min(runs, key=statistics.median)
        figures["latency_median"] = statistics.median(samples)
        figures["latency_p99"] = percentile(samples, 0.99)
        figures.pop("latency")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    figures["one"] = max(figures["one_http_client"], figures["one_aiohttp"])
    figures["many"] = max(figures["many_processes"], figures["many_aiohttp"])
    figures["floor_one"] = max(figures["floor_one_http_client"], figures["floor_one_aiohttp"])
    figures["floor_many"] = max(figures["floor_many_processes"], figures["floor_many_aiohttp"])
    figures["durable_floor_one"] = max(figures["durable_floor_one_http_client"], figures["durable_floor_one_aiohttp"])
    for key, pair in (("one", ("one_http_client", "one_aiohttp")), ("many", ("many_processes", "many_aiohttp"))):
        for prefix in ("", "floor_"):
            fastest = max((prefix + name for name in pair), key=lambda name: figures[name])
            figures[f"{prefix}{key}_cpu_ms_per_job"] = round(cpu_ms.get(fastest, 0.0), 3)
    if args.json:
        print(json.dumps({"jobs": args.jobs, "clients": args.clients, **figures}, indent=2))
        return
    print(f"gpud submit benchmark: {args.jobs} jobs per throughput measure, {args.clients} clients, "
          f"{len(samples)} latency samples; {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end; "
          f"SQLite synchronous={args.synchronous.upper()}; best of {args.repeat}")
    print(f"  one client:  http.client {figures['one_http_client']:8.0f} jobs/s   aiohttp {figures['one_aiohttp']:8.0f} jobs/s")
    print(f"  {args.clients} clients:   processes  {figures['many_processes']:8.0f} jobs/s   "
          f"aiohttp {figures['many_aiohttp']:8.0f} jobs/s (one process)")
    print()
    rows = [
        ("submit, one client (jobs/s)", figures["one"], SLURM["one"], TARGETS["one"], True),
        (f"submit, {args.clients} clients (jobs/s)", figures["many"], SLURM["many"], TARGETS["many"], True),
        ("submit -> RUNNING median (ms)", figures["latency_median"] * 1000, SLURM["latency_median"] * 1000,
         TARGETS["latency_median"] * 1000, False),
        ("submit -> RUNNING p99 (ms)", figures["latency_p99"] * 1000, None, None, False),
    ]
    print(f"{'measure':32} {'gpud':>10} {'Slurm 22.05':>12} {'gpud/Slurm':>11} {'target':>9}  met")
    for label, ours, slurm, target, higher in rows:
        if slurm is None:
            print(f"{label:32} {ours:10.1f} {'-':>12} {'-':>11} {'-':>9}")
            continue
        ratio = ours / slurm if higher else slurm / ours
        met = ours >= target if higher else ours <= target
        print(f"{label:32} {ours:10.1f} {slurm:12.0f} {ratio:10.1f}x {target:9.0f}  {'yes' if met else 'NO'}")
    print("  (Slurm: sbatch in a loop, 4 loops in parallel for the concurrent figure, submit to start tuned "
          "for speed; gpud/Slurm is how many times better gpud is)")
    print(f"\nfloor: an aiohttp app that only reads the JSON and answers 201 (no auth check, store or scheduler), "
          f"same clients:\n  one client {figures['floor_one']:.0f} jobs/s (gpud {100 * figures['one'] / figures['floor_one']:.0f} %"
          f" of it), {args.clients} clients {figures['floor_many']:.0f} jobs/s "
          f"(gpud {100 * figures['many'] / figures['floor_many']:.0f} %)")
    print(f"server CPU per job (best runs): gpud {figures['one_cpu_ms_per_job']:.2f} ms with one client, "
          f"{figures['many_cpu_ms_per_job']:.2f} ms with {args.clients}; the floor "
          f"{figures['floor_one_cpu_ms_per_job']:.2f} and {figures['floor_many_cpu_ms_per_job']:.2f} ms")
    print(f"durable floor: the same app, committing each job to SQLite (WAL, synchronous="
          f"{args.synchronous.upper()}) before it answers:\n  one client {figures['durable_floor_one']:.0f} jobs/s "
          f"(gpud {100 * figures['one'] / figures['durable_floor_one']:.0f} % of it)")
    for key, label in (("one", "one client"), ("many", f"{args.clients} clients")):
        if figures[f"floor_{key}"] < TARGETS[key]:
            print(f"  the {label} target ({TARGETS[key]:.0f} jobs/s) is above the floor itself: "
                  f"no submit API on aiohttp reaches it on this machine")
    if figures["durable_floor_one"] < TARGETS["one"]:
        print(f"  the one client target ({TARGETS['one']:.0f} jobs/s) is above the durable floor: no submit API "
              f"on aiohttp that commits each job (synchronous={args.synchronous.upper()}) before it answers "
              f"reaches it on this machine")


if __name__ == "__main__":
    main()
