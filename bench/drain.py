"""Drain benchmark: N trivial jobs (`true`, one fake GPU each) through `gpud up --fake-gpus 8`, submit to COMPLETED.

Starts `gpud up` as a subprocess (its own state directory, HOME and config
directory, a free port on 127.0.0.1), submits every job in one
POST /api/v1/jobs/batch (or one POST /api/v1/jobs per job with
--one-by-one), waits until none is pending or running, then reads the
history: wall time from the first submit to the last job's end, jobs/s,
median and p95 submit-to-RUNNING, and every job's exit code (must be 0).
Where the time went, per job: gpud up's event loop thread on a CPU,
waiting for one, or blocked (from /proc/PID/task/*/schedstat), the CPU of
the node's task supervisor and of the tasks it reaped (from /proc/PID/stat),
and how busy the whole machine was. With --repeat N, N drains (a fresh
gpud up each) and the median one. With --cgroups both, the drains alternate
between per-task cgroups on and off (``GPUD_CGROUPS=off``), N of each, so
both see the same load; it prints each side's median and their ratio. With --postgresql the drains alternate
between the SQLite store and a PostgreSQL store (`gpud up --store`) on a throwaway server started here
(gpud/testing/pg_server.py, every commit fsync'd, a new database each drain), N of each, and it prints both
medians and their ratio. The store is on the disk (fsync'd); the
running tasks' state on a tmpfs (`gpud up --run-dir`), as the shipped
node.toml keeps it in /run/gpud/node, or with --tasks-on disk beside the
store.
Slurm 22.05 on the same kind of machine, tuned: 29.8 s for 1,000 jobs
(33.6 jobs/s); target under 3 s.

    python bench/drain.py [--jobs 1000] [--gpus 8] [--quick] [--one-by-one] [--store-sync normal] [--repeat 5]
                          [--tasks-on tmpfs|disk] [--cgroups on|off|both] [--postgresql]
                          [--json] [--profile FILE.svg|.json|.txt]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpud.client import Client, ClientError  # noqa: E402
from gpud.node.cgroups import CGROUPS_ENV  # noqa: E402

SLURM_S, SLURM_JOBS = 29.8, 1000
TARGET_S = 3.0
CGROUPS_TARGET_RATIO = 1.10  # a drain with per-task cgroups takes at most 10 % longer than without
TMPFS = "/dev/shm"
TASKS_ON = {"tmpfs": f"a tmpfs ({TMPFS})", "disk": "the disk, in the state directory"}
START_TIMEOUT_S = 30.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_up(root: str, gpus: int, store_sync: str = "full", run_dir: str | None = None, cgroups: bool = True,
             store: str | None = None) -> tuple[subprocess.Popen, Client]:
    """Start `gpud up --fake-gpus GPUS` in ``root``; returns the process and an admin client once its node is up.

    ``cgroups`` False runs its tasks without cgroups (``GPUD_CGROUPS=off``);
    ``store`` a PostgreSQL URL keeps its state there (`gpud up --store`).
    """
    port = free_port()
    env = {**os.environ, "HOME": os.path.join(root, "home"), "XDG_CONFIG_HOME": os.path.join(root, "config")}
    for key in ("GPUD_URL", "GPUD_TOKEN", CGROUPS_ENV):
        env.pop(key, None)
    if not cgroups:
        env[CGROUPS_ENV] = "off"
    log = open(os.path.join(root, "up.log"), "wb")
    process = subprocess.Popen([sys.executable, "-m", "gpud.cli.gpud_main", "up", "--fake-gpus", str(gpus),
                                "--port", str(port), "--state-dir", os.path.join(root, "state"),
                                "--store-sync", store_sync, *(["--run-dir", run_dir] if run_dir else []),
                                *(["--store", store] if store else [])],
                               env=env, stdout=log, stderr=subprocess.STDOUT)
    token_file = os.path.join(root, "state", "controller", "admin.token")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"gpud up exited with {process.returncode}:\n{_tail(root)}")
        if "gpuctl is set up" in _tail(root) or "is left as it is" in _tail(root):
            with open(token_file, encoding="utf-8") as f:
                return process, Client(f"http://127.0.0.1:{port}", f.read().strip(), timeout=120)
        time.sleep(0.05)
    stop(process)
    raise SystemExit(f"gpud up did not get ready in {START_TIMEOUT_S:.0f} s:\n{_tail(root)}")


def _tail(root: str) -> str:
    with open(os.path.join(root, "up.log"), "rb") as f:
        return f.read()[-4000:].decode(errors="replace")


def stop(process: subprocess.Popen) -> None:
    """SIGTERM gpud up by pid and wait; SIGKILL if it does not stop."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)


def job(workdir: str) -> dict:
    """One trivial job: `true` on one GPU; small CPU and memory requests so the GPUs are what limits."""
    return {"project": "default", "command": ["true"], "gpus": 1, "cpus": 0.1, "memory_gib": 0.1,
            "workdir": workdir}


def submit(api: Client, jobs: list[dict], one_by_one: bool) -> list[str]:
    """Submit ``jobs``: one batch request, or one request each from 8 threads; returns the ids."""
    if not one_by_one:
        return api.post("jobs/batch", {"jobs": jobs})["ids"]
    with ThreadPoolExecutor(8) as pool:
        return [ids[0] for ids in pool.map(lambda j: api.post("jobs", j)["ids"], jobs)]


def wait_drained(api: Client, timeout: float) -> float:
    """Poll the projects' pending and running counts (a cheap call) until both are zero; returns when.

    The counts are of the jobs as they are, but listed by the last cycle's
    queues: before gpud up's first cycle there are none, and no count at all
    says nothing yet.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queues = [q for q in api.get("projects")["queues"] if q.get("kind") == "project"]
        if queues and not any(q.get("pending_jobs") or q.get("running_jobs") for q in queues):
            return time.time()
        time.sleep(0.1)
    raise SystemExit(f"jobs still pending or running after {timeout:.0f} s")


def thread_times(pid: int) -> dict[str, tuple[float, float]]:
    """Seconds on a CPU and waiting for one so far: the main thread, and the other threads together; {} off Linux."""
    times = {"main": [0.0, 0.0], "threads": [0.0, 0.0]}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                on_cpu, waiting = (int(x) / 1e9 for x in f.read().split()[:2])
            entry = times["main" if int(tid) == pid else "threads"]
            entry[0] += on_cpu
            entry[1] += waiting
    except OSError:
        return {}
    return {name: (cpu, wait) for name, (cpu, wait) in times.items()}


def machine_ticks() -> tuple[int, int]:
    """Busy and total CPU ticks of the whole machine so far (every process), from /proc/stat; (0, 0) off Linux."""
    try:
        with open("/proc/stat") as f:
            values = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0, 0
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


def supervisor_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds so far of gpud up's children (the node's task supervisor) and of the tasks they reaped; 0 off Linux."""
    own = tasks = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
        for kid in kids:
            with open(f"/proc/{kid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            own += (int(fields[11]) + int(fields[12])) / tick
            tasks += (int(fields[13]) + int(fields[14])) / tick
    except OSError:
        pass
    return own, tasks


def profile(pid: int, path: str) -> subprocess.Popen | None:
    """Start `py-spy record` on ``pid`` writing ``path``; None when py-spy is not installed."""
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        print("py-spy not found; no profile", file=sys.stderr)
        return None
    fmt = "speedscope" if path.endswith(".json") else "raw" if path.endswith(".txt") else "flamegraph"
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--output", path, "--format", fmt, "--rate", "200",
                             "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def run(args: argparse.Namespace, cgroups: bool = True, store: str | None = None) -> dict:
    """Run the drain once (tasks in cgroups or not; on SQLite, or the PostgreSQL ``store``); returns its figures."""
    root = tempfile.mkdtemp(prefix="gpud-drain-")
    workdir = os.path.join(root, "work")
    os.makedirs(workdir)
    run_dir = tempfile.mkdtemp(prefix="gpud-drain-", dir=TMPFS) if args.tasks_on == "tmpfs" else None
    try:
        return _drain(args, root, workdir, run_dir, cgroups, store)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)


def _drain(args: argparse.Namespace, root: str, workdir: str, run_dir: str | None, cgroups: bool,
           store: str | None) -> dict:
    process, api = start_up(root, args.gpus, args.store_sync, run_dir, cgroups, store)
    spy = None
    try:
        jobs = [job(workdir) for _ in range(args.jobs)]
        if args.profile:
            spy = profile(process.pid, args.profile)
            time.sleep(0.5)
        cpu_before, machine_before = thread_times(process.pid), machine_ticks()
        supervisor_before = supervisor_cpu(process.pid)
        began = time.time()
        ids = submit(api, jobs, args.one_by_one)
        submitted = time.time()
        seen_empty = wait_drained(api, timeout=max(120.0, args.jobs * 0.5))
        cpu_after, machine_after = thread_times(process.pid), machine_ticks()
        supervisor_after = supervisor_cpu(process.pid)
        history = api.get("history", {"limit": args.jobs + 10})["jobs"]
        limits = sorted({how for node in api.get("nodes")["nodes"] for how in node["limits"]["enforced"]})
    except ClientError as exc:
        raise SystemExit(f"drain: {exc}\n{_tail(root)}") from None
    finally:
        if spy is not None:
            os.kill(spy.pid, signal.SIGINT)
            spy.wait(60)
        stop(process)
    done = {j["id"]: j for j in history if j["id"] in set(ids)}
    bad = [j for j in done.values() if j["state"] != "COMPLETED" or j.get("exit_code") != 0]
    waits = sorted(j["started"] - j["submitted"] for j in done.values() if j.get("started"))
    last_end = max((j["ended"] for j in done.values() if j.get("ended")), default=seen_empty)
    wall = last_end - began
    figures = {"jobs": args.jobs, "gpus": args.gpus, "submit": "one-by-one" if args.one_by_one else "batch",
               "store": "postgresql" if store else "sqlite", "store_sync": args.store_sync,
               "tasks_on": args.tasks_on, "cgroups": "on" if cgroups else "off",
               "limits_enforced": limits,
               "submit_s": round(submitted - began, 3), "wall_s": round(wall, 3),
               "jobs_per_s": round(args.jobs / wall, 1), "observed_wall_s": round(seen_empty - began, 3),
               "median_submit_to_running_s": round(statistics.median(waits), 3) if waits else None,
               "p95_submit_to_running_s": round(waits[int(len(waits) * 0.95) - 1], 3) if waits else None,
               "ms_per_job": _per_job(cpu_before, cpu_after, seen_empty - began, args.jobs),
               "supervisor_cpu_ms_per_job": round((supervisor_after[0] - supervisor_before[0]) * 1000 / args.jobs, 2),
               "task_cpu_ms_per_job": round((supervisor_after[1] - supervisor_before[1]) * 1000 / args.jobs, 2),
               "machine_cpus": os.cpu_count(),
               "machine_busy_pct": round(100 * (machine_after[0] - machine_before[0]) /
                                         max(1, machine_after[1] - machine_before[1]), 1),
               "load_1m": round(os.getloadavg()[0], 2),
               "recorded": len(done), "exit_code_0": len(done) - len(bad), "not_ok": len(bad)}
    if len(done) != args.jobs or bad:
        figures["problem"] = (f"{args.jobs - len(done)} job(s) missing from history, {len(bad)} not "
                              f"COMPLETED with exit code 0: {[(j['id'], j['state'], j.get('exit_code')) for j in bad[:5]]}")
    return figures


def _per_job(before: dict, after: dict, wall: float, jobs: int) -> dict[str, float]:
    if not before or not after:
        return {}
    ms = lambda seconds: round(seconds * 1000 / jobs, 2)  # noqa: E731
    cpu, runq = (after["main"][i] - before["main"][i] for i in (0, 1))
    return {"wall": ms(wall), "main_cpu": ms(cpu), "main_runqueue": ms(runq), "main_blocked": ms(wall - cpu - runq),
            "threads_cpu": ms(after["threads"][0] - before["threads"][0])}


def median_run(runs: list[dict]) -> dict:
    """The median drain of ``runs`` (the lower middle one of an even number), with every wall time and problem."""
    runs = sorted(runs, key=lambda f: f["wall_s"])
    figures = dict(runs[(len(runs) - 1) // 2])
    figures["wall_s_each"] = [f["wall_s"] for f in runs]
    figures["load_1m_each"] = [f["load_1m"] for f in runs]
    if any("problem" in f for f in runs):
        figures["problem"] = "; ".join(f["problem"] for f in runs if "problem" in f)
    return figures


def show(figures: dict) -> None:
    """Print one side's median drain as text."""
    slurm_rate = SLURM_JOBS / SLURM_S
    print(f"drain: {figures['jobs']} jobs (`true`, 1 fake GPU each) on {figures['gpus']} GPUs, "
          f"submitted {figures['submit']} in {figures['submit_s']:.2f} s, store sync {figures['store_sync']}, "
          f"tasks' state on {TASKS_ON[figures['tasks_on']]}, per-task cgroups {figures['cgroups']} "
          f"(limits enforced: {', '.join(figures['limits_enforced']) or 'none'})")
    if len(figures["wall_s_each"]) > 1:
        print(f"  {len(figures['wall_s_each'])} drains, wall times {', '.join(f'{w:.2f}' for w in figures['wall_s_each'])} s; "
              f"the median one:")
    print(f"  wall time (first submit to last end): {figures['wall_s']:.2f} s   "
          f"({figures['jobs_per_s']:.1f} jobs/s; Slurm: {SLURM_S} s for {SLURM_JOBS}, {slurm_rate:.1f} jobs/s; "
          f"target < {TARGET_S * figures['jobs'] / SLURM_JOBS:.1f} s)")
    print(f"  submit -> RUNNING: median {figures['median_submit_to_running_s']} s, "
          f"p95 {figures['p95_submit_to_running_s']} s")
    if figures["ms_per_job"]:
        t = figures["ms_per_job"]
        print(f"  per job, gpud up's event loop thread: {t['wall']} ms of wall time = {t['main_cpu']} on a CPU "
              f"+ {t['main_runqueue']} waiting for a CPU + {t['main_blocked']} blocked (disk, sleep, idle); "
              f"its other threads: {t['threads_cpu']} ms on a CPU")
    print(f"  per job, the node's task supervisor: {figures['supervisor_cpu_ms_per_job']} ms on a CPU; "
          f"the task (`true`): {figures['task_cpu_ms_per_job']} ms")
    print(f"  machine: {figures['machine_cpus']} CPUs, {figures['machine_busy_pct']}% busy during the drain "
          f"(every process, ours and others'), load average {figures['load_1m']}")
    print(f"  exit codes recorded: {figures['exit_code_0']}/{figures['jobs']} are 0")
    if "problem" in figures:
        print(f"  PROBLEM: {figures['problem']}")


def compare(on: dict, off: dict) -> dict:
    """What per-task cgroups cost: the median drains' wall times, per-job supervisor and task CPU and start delay,
    on / off."""
    def per(key: str) -> float | None:
        return round(on[key] / off[key], 3) if on.get(key) and off.get(key) else None
    return {"wall_ratio": per("wall_s"), "wall_s": [on["wall_s"], off["wall_s"]],
            "supervisor_cpu_ms_per_job": [on["supervisor_cpu_ms_per_job"], off["supervisor_cpu_ms_per_job"]],
            "task_cpu_ms_per_job": [on["task_cpu_ms_per_job"], off["task_cpu_ms_per_job"]],
            "median_submit_to_running_s": [on["median_submit_to_running_s"], off["median_submit_to_running_s"]],
            "target_ratio": CGROUPS_TARGET_RATIO}


def compare_stores(pg: dict, sqlite: dict) -> dict:
    """What PostgreSQL costs beside SQLite: the median drains' wall times and start delays, and their ratios."""
    def per(key: str) -> float | None:
        return round(pg[key] / sqlite[key], 3) if pg.get(key) and sqlite.get(key) else None
    return {"wall_ratio": per("wall_s"), "wall_s": [pg["wall_s"], sqlite["wall_s"]],
            "submit_s": [pg["submit_s"], sqlite["submit_s"]], "submit_ratio": per("submit_s"),
            "median_submit_to_running_s": [pg["median_submit_to_running_s"], sqlite["median_submit_to_running_s"]],
            "jobs_per_s": [pg["jobs_per_s"], sqlite["jobs_per_s"]], "order": ["postgresql", "sqlite"]}


def store_sides(args: argparse.Namespace) -> int:
    """Drain on SQLite and on PostgreSQL, alternating, ``--repeat`` of each; print both medians and the ratio."""
    from gpud.testing.pg_server import Server
    server = Server(durable=True)
    runs: dict[str, list[dict]] = {"sqlite": [], "postgresql": []}
    try:
        for _ in range(max(1, args.repeat)):
            runs["sqlite"].append(run(args, cgroups=args.cgroups == "on"))
            url = server.database()
            try:
                runs["postgresql"].append(run(args, cgroups=args.cgroups == "on", store=url))
            finally:
                server.drop(url)
    finally:
        server.stop()
    medians = {side: median_run(found) for side, found in runs.items()}
    result = {**medians, "postgresql_cost": compare_stores(medians["postgresql"], medians["sqlite"])}
    problem = any("problem" in figures for figures in medians.values())
    if args.json:
        print(json.dumps(result, indent=2))
        return 1 if problem else 0
    for side, figures in medians.items():
        print(f"[{side}]")
        show(figures)
    cost = result["postgresql_cost"]
    print(f"PostgreSQL / SQLite (median drains, alternated): wall {cost['wall_s'][0]:.2f} / {cost['wall_s'][1]:.2f} s "
          f"= {cost['wall_ratio']}; submit {cost['submit_s'][0]:.2f} / {cost['submit_s'][1]:.2f} s; load average "
          f"{', '.join(map(str, medians['postgresql']['load_1m_each']))} / "
          f"{', '.join(map(str, medians['sqlite']['load_1m_each']))}")
    return 1 if problem else 0


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, run the drains and print the figures; 1 when a job was lost or failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs to drain (default 1000)")
    parser.add_argument("--gpus", type=int, default=8, help="fake GPUs of the node (default 8)")
    parser.add_argument("--quick", action="store_true", help="100 jobs: a smoke test")
    parser.add_argument("--one-by-one", action="store_true", help="one POST /api/v1/jobs per job (8 threads)")
    parser.add_argument("--profile", metavar="FILE",
                        help="py-spy record gpud up into FILE (.svg, .json, or .txt for collapsed stacks)")
    parser.add_argument("--store-sync", choices=("full", "normal"), default="full",
                        help="gpud up --store-sync: fsync every commit (full) or not (normal)")
    parser.add_argument("--tasks-on", choices=tuple(TASKS_ON), default="tmpfs" if os.path.isdir(TMPFS) else "disk",
                        help="where gpud up keeps the running tasks' state (--run-dir): a tmpfs, as the shipped "
                             "node.toml's /run/gpud/node, or the disk beside the store (default tmpfs)")
    parser.add_argument("--cgroups", choices=("on", "off", "both"), default="on",
                        help="run the tasks in per-task cgroups (on, where the host lets root make them), without "
                             "(off: GPUD_CGROUPS=off), or both, alternating drain by drain, and compare (default on)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="drains to run (of each, with --cgroups both); the median one is shown (default 1)")
    parser.add_argument("--postgresql", action="store_true",
                        help="drain on SQLite and on PostgreSQL (a throwaway server started here, fsync on, a new "
                             "database each drain), alternating, and compare")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs = min(args.jobs, 100)
    if args.postgresql:
        if args.cgroups == "both":
            parser.error("--postgresql compares the stores: give --cgroups on or off, not both")
        return store_sides(args)
    sides = {"both": (True, False), "on": (True,), "off": (False,)}[args.cgroups]
    runs: dict[bool, list[dict]] = {side: [] for side in sides}
    for _ in range(max(1, args.repeat)):
        for side in sides:
            runs[side].append(run(args, cgroups=side))
    medians = {"on" if side else "off": median_run(found) for side, found in runs.items()}
    result: dict = medians["on" if sides[0] else "off"] if len(sides) == 1 else \
        {**medians, "cgroups_cost": compare(medians["on"], medians["off"])}
    problem = any("problem" in figures for figures in medians.values())
    if args.json:
        print(json.dumps(result, indent=2))
        return 1 if problem else 0
    for figures in medians.values():
        show(figures)
    if len(sides) == 2:
        cost = result["cgroups_cost"]
        on, off = medians["on"], medians["off"]
        print(f"per-task cgroups, on / off (median drains, alternated): wall {on['wall_s']:.2f} / {off['wall_s']:.2f} s "
              f"= {cost['wall_ratio']} (target <= {CGROUPS_TARGET_RATIO}); supervisor CPU "
              f"{on['supervisor_cpu_ms_per_job']} / {off['supervisor_cpu_ms_per_job']} ms per job; task CPU "
              f"{on['task_cpu_ms_per_job']} / {off['task_cpu_ms_per_job']} ms per job; submit -> RUNNING "
              f"median {on['median_submit_to_running_s']} / {off['median_submit_to_running_s']} s; load average "
              f"{', '.join(map(str, on['load_1m_each']))} / {', '.join(map(str, off['load_1m_each']))}")
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
