"""Live-fleet benchmark: a real controller, N emulated nodes in processes of their own, M jobs filled and drained.

Starts `gpud controller` (its own state directory, a free port on
127.0.0.1, the store fsync'd), then emulator processes
(`python -m gpud.testing.fleet`, the real node protocol, no processes run)
that connect N nodes of G GPUs each, spread over one heartbeat period as
real hosts' heartbeats are. Once every node is up it submits M jobs in
batches of 2,000 (one GPU each, or with --mix a rotation of one-GPU jobs,
half-GPU fractions and gangs of 2 tasks x 4 GPUs), each running
`sleep --task-s` on its emulated node, and measures:

- fill_s: first submit to every task started on its node;
- drain_s: the first task's end to every job recorded finished by the
  controller (the tasks end --task-s after they started, so this is about
  the spread of the starts plus what the controller lags behind);
  drain_lag_s: the last task's end to every job finished;
- controller_cpu_s: the controller process's CPU time (all its threads)
  from the first submit to the end of the drain (register_cpu_s: while the
  nodes registered; register_builds: how many times the controller built
  its scheduler anew meanwhile, from its /metrics);
- heartbeat_p99_ms: heartbeat sent to its lease answer, at the nodes,
  over the whole run;
- healthz_max_ms: the slowest of the /healthz requests made every 100 ms
  from the first node's connection to the end of the drain;
  controller_loop_lag_max_ms: the worst ``loop_lag_ms`` they answered, how
  late the controller's own loop ran (gpud.controller.loop_lag);
- nodes_not_up, reconnects, lease_expiries, errors: must all be 0 (no node
  marked down by mistake, no message refused);
- with --stretches, loop_lag_max_ms, loop_stalls_over_100ms, loop_stalls:
  how late the controller's loop woke for a probe asking every 10 ms, and
  the longest stalls with what the process did meanwhile; loop_held_cpu_ms:
  the loop's own CPU time between the probe's wake-ups (percentiles), which
  the machine's load does not stretch; gc_passes_by_generation and
  gc_longest_ms_by_generation: the collector's passes
  (bench/loop_stretches.py);
- gc_full_passes_all, gc_full_pass_longest_ms, gc_freezes: the garbage
  collector's full passes over the controller's whole life, from its
  /metrics (gpud.controller.heap), read at the end; event_loop: the loop
  the controller ran on, from the same page (uvloop; asyncio with
  GPUD_EVENT_LOOP=asyncio in this script's environment, or --stretches).

The controller's CPU is its own: the emulators, this script and the
machine's other load are not in it (the load average is printed beside).
The emulators stand for node hosts, which in a real fleet run on machines
of their own: --emulator-nice 10 runs them at a lower priority, so that on
a machine of few cores they take the CPU the controller leaves rather than
half of it (by default they run at the controller's priority, and the
figures include their fight for the CPUs; the printout says which). On a
machine shared with other work a niced emulator also yields to that work
and answers its nodes' messages late (heartbeat round trips are measured
at the nodes). This script and its /healthz prober run at the controller's
priority.
Goal: 2,000 nodes x 8 GPUs filled by 16,000 one-GPU jobs in under 60 s,
/healthz under 100 ms throughout (KAI-Scheduler's published scale test:
4,000 one-GPU jobs on 500 nodes in 6 min 38 s).

    python bench/fleet.py --nodes 2000 --gpus-per-node 8 --jobs 16000 [--mix] [--task-s 60]
                          [--emulators K] [--emulator-nice N] [--heartbeat-s 5] [--node-timeout-s 60] [--json]
                          [--cprofile FILE.prof] [--profile FILE.svg|.txt] [--stretches N] [--gc-census] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpud.client import Client, ClientError  # noqa: E402
from gpud.testing.fleet import percentile, summary  # noqa: E402

GOAL_FILL_S = 60.0
GOAL_HEALTHZ_MS = 100.0
BATCH = 2000
MAX_HISTORY = 10_000
START_TIMEOUT_S = 60.0
PROBE_EVERY_S = 0.1
NODES_PER_EMULATOR = 1000
# The emulators stand for node hosts, which have CPUs of their own: --emulator-nice N runs them at a lower
# priority, leaving the controller the CPU it would have beside a real fleet (by default they share it evenly).
EMULATOR_NICE = 0
STRETCHES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loop_stretches.py")
# One-GPU jobs, half-GPU fractions (two share a GPU), gangs of 2 tasks x 4 GPUs: (gpus per task, tasks).
MIX = ((1, 1), (0.5, 1), (0.5, 1), (4, 2))


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) of process ``pid`` so far, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Prober(threading.Thread):
    """GET /healthz every PROBE_EVERY_S: each answer's time, and the live job count it says."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = f"{url}/healthz"
        self.samples: list[tuple[float, float]] = []  # (when, ms)
        self.failures = 0
        self.jobs: int | None = None
        self.nodes: int | None = None
        self.loop_lag_ms = 0.0  # the worst loop_lag_ms the answers said (how late the controller's loop ran)
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            began = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url, timeout=10) as answer:
                    body = json.loads(answer.read())
                self.samples.append((time.time(), (time.perf_counter() - began) * 1000.0))
                self.jobs, self.nodes = body.get("jobs"), body.get("nodes")
                self.loop_lag_ms = max(self.loop_lag_ms, body.get("loop_lag_ms") or 0.0)
            except OSError:
                self.failures += 1
            self.stopping.wait(max(0.0, PROBE_EVERY_S - (time.perf_counter() - began)))

    def between(self, start: float, end: float) -> list[float]:
        """The answer times (ms) of the probes made from ``start`` to ``end``."""
        return [ms for when, ms in self.samples if start <= when <= end]

    def since(self, start: float) -> list[float]:
        """The answer times (ms) of the probes made since ``start``."""
        return [ms for when, ms in self.samples if when >= start]


def write_setup(root: str, args: argparse.Namespace, port: int) -> str:
    """The controller's config and policy (one project deserving every GPU of the fleet); returns the config's path."""
    gpus = args.nodes * args.gpus_per_node
    with open(os.path.join(root, "policy.toml"), "w") as f:
        f.write(f'min_runtime = 0\ngrace_period = 5\n[[projects]]\nname = "fleet"\ngpu_quota = {gpus}\n')
    config = os.path.join(root, "controller.toml")
    with open(config, "w") as f:
        f.write(f'listen = "127.0.0.1:{port}"\nstate_dir = "{root}/state"\npolicy = "{root}/policy.toml"\n'
                f"[scheduler]\nheartbeat_s = {args.heartbeat_s}\nnode_timeout_s = {args.node_timeout_s}\n"
                f"[ui]\nenabled = false\n")
    return config


def start_controller(root: str, config: str, url: str, cprofile: str | None,
                     stretches: str | None = None, gc_census: bool = False) -> subprocess.Popen:
    """`gpud controller --init` (under cProfile, or with its loop's callbacks timed, when asked), once it answers
    /healthz."""
    profiler = ["-m", "cProfile", "-o", cprofile] if cprofile else []
    gpud = [STRETCHES, stretches] if stretches else ["-m", "gpud.cli.gpud_main"]
    log = open(os.path.join(root, "controller.log"), "wb")
    census = {"GPUD_STRETCHES_CENSUS": "1"} if gc_census else {}
    process = subprocess.Popen([sys.executable, *profiler, *gpud, "controller", "--config",
                                config, "--init", "--allow-root", "--log-level", "warning"],
                               stdout=log, stderr=subprocess.STDOUT, cwd=root, env={**os.environ, **census})
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the controller exited with {process.returncode}:\n{tail(root, 'controller.log')}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2):
                return process
        except OSError:
            time.sleep(0.1)
    stop(process)
    raise SystemExit(f"the controller did not answer in {START_TIMEOUT_S:.0f} s:\n{tail(root, 'controller.log')}")


def start_emulators(root: str, args: argparse.Namespace, url: str) -> list[tuple[subprocess.Popen, str, str]]:
    """The emulator processes, each with its share of the nodes; (process, status file, report file) each."""
    count = args.emulators or max(1, math.ceil(args.nodes / NODES_PER_EMULATOR))
    width = len(str(args.nodes - 1))
    emulators = []
    first = 0
    for number in range(count):
        nodes = args.nodes // count + (1 if number < args.nodes % count else 0)
        status, report = (os.path.join(root, f"fleet{number}.{kind}.json") for kind in ("status", "report"))
        log = open(os.path.join(root, f"fleet{number}.log"), "wb")
        niced = ["nice", "-n", str(args.emulator_nice)] if args.emulator_nice else []
        process = subprocess.Popen([*niced, sys.executable, "-m", "gpud.testing.fleet", "--controller", url, "--key-file",
                                    os.path.join(root, "state", "cluster.key"), "--nodes", str(nodes),
                                    "--first", str(first), "--width", str(width),
                                    "--gpus-per-node", str(args.gpus_per_node), "--ramp-s", str(args.heartbeat_s),
                                    "--status", status, "--report", report],
                                   stdout=log, stderr=subprocess.STDOUT, cwd=root)
        emulators.append((process, status, report))
        first += nodes
    return emulators


def statuses(emulators: list[tuple[subprocess.Popen, str, str]], root: str) -> list[dict]:
    """Each emulator's latest counts ({} before its first)."""
    found = []
    for number, (process, status, _) in enumerate(emulators):
        if process.poll() is not None:
            raise SystemExit(f"emulator {number} exited with {process.returncode}:\n{tail(root, f'fleet{number}.log')}")
        try:
            with open(status) as f:
                found.append(json.load(f))
        except (OSError, ValueError):
            found.append({})
    return found


def total(found: list[dict], key: str) -> int:
    """The sum of one count over the emulators."""
    return sum(s.get(key) or 0 for s in found)


def jobs_to_submit(args: argparse.Namespace) -> tuple[list[dict], int, float]:
    """The jobs, how many tasks they have and how many GPUs they ask for together."""
    shapes = MIX if args.mix else ((1, 1),)
    jobs, tasks, gpus = [], 0, 0.0
    for number in range(args.jobs):
        per_task, count = shapes[number % len(shapes)]
        jobs.append({"project": "fleet", "command": ["sleep", f"{args.task_s:g}"], "gpus": per_task,
                     "tasks": count, "cpus": 1, "memory_gib": 4, "workdir": "/tmp"})
        tasks += count
        gpus += per_task * count
    return jobs, tasks, gpus


def wait(what: str, check, timeout: float, every: float = 0.05):
    """Poll ``check`` until it gives something true; SystemExit naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def stop(process: subprocess.Popen, timeout: float = 60.0) -> None:
    """SIGTERM ``process`` by pid and wait; SIGKILL when it does not stop."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)


def profile(pid: int, path: str) -> subprocess.Popen | None:
    """Start `py-spy record` on ``pid`` (every thread) writing ``path``; None without py-spy."""
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        print("py-spy not found; no profile", file=sys.stderr)
        return None
    fmt = "speedscope" if path.endswith(".json") else "raw" if path.endswith(".txt") else "flamegraph"
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--output", path, "--format", fmt, "--rate", "100",
                             "--threads", "--nonblocking"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)


def metrics(url: str, names: tuple[str, ...]) -> dict[str, float]:
    """The values of these metrics on the controller's /metrics, by series (the name with its labels, as
    written there); those it does not show are left out."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=60) as answer:
        lines = answer.read().decode().splitlines()
    found = {}
    for line in lines:
        series, _, value = line.partition(" ")
        if series.partition("{")[0] in names:
            found[series] = float(value)
    return found


def event_loop_of(collected: dict[str, float]) -> str | None:
    """The controller's event loop, as its gpud_event_loop_info series in ``collected`` labels it."""
    for series in collected:
        if series.startswith('gpud_event_loop_info{loop="'):
            return series.split('"')[1]
    return None


def tail(root: str, name: str) -> str:
    """The end of a log file in ``root``."""
    try:
        with open(os.path.join(root, name), "rb") as f:
            return f.read()[-4000:].decode(errors="replace")
    except OSError:
        return ""


def run(args: argparse.Namespace) -> dict:
    """One fleet run; its figures."""
    root = args.keep or tempfile.mkdtemp(prefix="gpud-fleet-")
    os.makedirs(root, exist_ok=True)
    try:
        return _run(args, root)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def _run(args: argparse.Namespace, root: str) -> dict:
    jobs, tasks, gpus_asked = jobs_to_submit(args)
    capacity = args.nodes * args.gpus_per_node
    if gpus_asked > capacity:
        raise SystemExit(f"the {args.jobs} jobs ask for {gpus_asked:g} GPUs and the fleet has {capacity}: "
                         f"they could not all run at once; submit fewer")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    load_before = os.getloadavg()
    stretches = os.path.join(root, "loop_stretches.json") if args.stretches else None
    controller = start_controller(root, write_setup(root, args, port), url, args.cprofile, stretches, args.gc_census)
    # Which core the controller runs (in its directory, so an installed gpud wins over this checkout).
    compiled = subprocess.run([sys.executable, "-c", "import gpud.core; print(gpud.core.COMPILED)"], cwd=root,
                              capture_output=True, text=True).stdout.strip() == "True"
    with open(os.path.join(root, "state", "admin.token")) as f:
        api = Client(url, f.read().strip(), timeout=300)
    prober = Prober(url)
    emulators: list[tuple[subprocess.Popen, str, str]] = []
    spy = None
    figures: dict = {"nodes": args.nodes, "jobs": args.jobs}
    try:
        spy = profile(controller.pid, args.profile) if args.profile else None
        if stretches:
            os.kill(controller.pid, signal.SIGUSR1)  # the loop's callbacks from here on (not its start)
        cpu_start = cpu_seconds(controller.pid)
        began = time.time()
        prober.start()
        emulators = start_emulators(root, args, url)
        wait("every node to register", lambda: total(statuses(emulators, root), "connected") == args.nodes
             and prober.nodes == args.nodes, args.timeout)
        registered = time.time()
        cpu_registered = cpu_seconds(controller.pid)
        builds = metrics(url, ("gpud_scheduler_builds_total",)).get("gpud_scheduler_builds_total")
        builds = None if builds is None else int(builds)
        submit_began = time.time()
        for start in range(0, len(jobs), BATCH):
            api.post("jobs/batch", {"jobs": jobs[start:start + BATCH]})
        submitted = time.time()
        wait("every task to start", lambda: total(statuses(emulators, root), "started") >= tasks, args.timeout)
        filled = time.time()
        wait("every job to finish", lambda: prober.jobs == 0 and prober.samples[-1][0] > filled,
             args.timeout + args.task_s)
        drained = time.time()
        cpu_drained = cpu_seconds(controller.pid)
        prober.stopping.set()  # what follows is this script's own reading, not the controller's work
        # The emulators write their counts four times a second: let the last ends reach them (a task that did not
        # end is said below).
        with contextlib.suppress(SystemExit):
            wait("every task's end at its node", lambda: total(statuses(emulators, root), "ended") >= tasks, 10)
        if stretches:
            os.kill(controller.pid, signal.SIGUSR2)
            wait("the controller's loop figures", lambda: os.path.exists(stretches), 60)
        found = statuses(emulators, root)
        nodes = api.get("nodes")["nodes"]
        # The history answers at most MAX_HISTORY of the latest jobs; the emulators count every task's end.
        history = api.get("history", {"limit": min(args.jobs, MAX_HISTORY)})["jobs"]
        collector = metrics(url, ("gpud_gc_full_passes_total", "gpud_gc_full_pass_longest_seconds",
                                  "gpud_gc_freezes_total", "gpud_event_loop_info"))
    except ClientError as exc:
        raise SystemExit(f"fleet: {exc}\n{tail(root, 'controller.log')}") from None
    finally:
        prober.stopping.set()
        if spy is not None:
            os.kill(spy.pid, signal.SIGINT)
            spy.wait(120)
        for process, _, _ in emulators:
            stop(process)
        stop(controller, timeout=120.0)
    reports = []
    for _, _, report in emulators:
        with open(report) as f:
            reports.append(json.load(f))
    if stretches:
        with open(stretches) as f:
            loop = json.load(f)
        figures.update({"loop_callback_max_cpu_ms": loop["longest_ms"][0][0] if loop["longest_ms"] else None,
                        "loop_callbacks_over_10ms": loop["over_10ms"], "loop_callbacks_over_100ms": loop["over_100ms"],
                        "loop_cpu_s": loop["cpu_s"], "gc_full_passes": loop["gc_full"],
                        "gc_longest_ms_by_generation": loop["gc_longest_ms_by_generation"],
                        "gc_passes_by_generation": loop["gc_passes_by_generation"],
                        "gc_full_max_ms": loop["gc_full_max_ms"], "gc_full_s": loop["gc_full_s"],
                        "loop_longest": loop["longest_ms"][:args.stretches],
                        "loop_lag_max_ms": loop["lag"]["late_max_ms"],
                        "loop_stalls_over_100ms": loop["lag"]["stalls_over_100ms"],
                        "loop_held_cpu_ms": loop["lag"]["held_cpu_ms"], "gc_census": loop["gc_census"],
                        "loop_stalls": loop["lag"]["longest_stalls"][:args.stretches]})
    rtts = sorted(ms for r in reports for ms in r["heartbeat_rtt_ms_all"])
    probes = sorted(prober.since(began))
    first_end = min(s["first_end"] for s in found if s.get("first_end"))
    last_end = max(s["last_end"] for s in found if s.get("last_end"))
    completed = [j for j in history if j["state"] == "COMPLETED" and j.get("exit_code") == 0]
    heartbeats = summary(rtts)
    figures.update({
        "fill_s": round(filled - submit_began, 2), "drain_s": round(drained - first_end, 2),
        "controller_cpu_s": round(cpu_drained - cpu_registered, 2),
        "heartbeat_p99_ms": heartbeats["p99"], "healthz_max_ms": round(probes[-1], 1) if probes else None,
        "core_compiled": compiled, "event_loop": event_loop_of(collector), "gpus_per_node": args.gpus_per_node, "tasks": tasks, "gpus_asked": gpus_asked, "mix": args.mix,
        "task_s": args.task_s, "submit_s": round(submitted - submit_began, 2),
        "drain_lag_s": round(drained - last_end, 2), "register_s": round(registered - began, 2),
        "register_cpu_s": round(cpu_registered - cpu_start, 2), "register_builds": builds,
        "heartbeat_p50_ms": heartbeats["p50"], "heartbeat_max_ms": heartbeats["max"], "heartbeats": len(rtts),
        "healthz_p99_ms": round(percentile(probes, 0.99), 1) if probes else None,
        "healthz_max_ms_by_phase": {phase: round(max(prober.between(start, end), default=0.0), 1) for phase, start, end
                                    in (("register", began, registered), ("fill", submit_began, filled),
                                        ("drain", filled, drained))},
        "healthz_over_goal": sum(1 for ms in probes if ms >= GOAL_HEALTHZ_MS), "healthz_failures": prober.failures,
        "controller_loop_lag_max_ms": prober.loop_lag_ms,
        "nodes_not_up": sum(1 for n in nodes if n["state"] != "up"),
        "reconnects": sum(r["registrations"] for r in reports) - args.nodes,
        "lease_expiries": sum(r["lease_expiries"] for r in reports),
        "errors": sum(r["errors"] for r in reports), "error_texts": [t for r in reports for t in r["error_texts"]][:5],
        "completed_exit_0": len(completed), "emulators": len(emulators),
        "gc_full_passes_all": collector.get("gpud_gc_full_passes_total"),
        "gc_full_pass_longest_ms": round(collector["gpud_gc_full_pass_longest_seconds"] * 1000.0, 1)
        if "gpud_gc_full_pass_longest_seconds" in collector else None,
        "gc_freezes": collector.get("gpud_gc_freezes_total"),
        "emulator_cpu_s": round(sum(r["cpu_s"] for r in reports), 2), "emulator_nice": args.emulator_nice,
        "load_avg_before": [round(x, 2) for x in load_before], "load_avg_after": [round(x, 2) for x in os.getloadavg()],
    })
    problems = []
    if len(completed) != min(args.jobs, MAX_HISTORY):
        problems.append(f"{len(history) - len(completed)} of the {len(history)} latest jobs not COMPLETED with exit "
                        f"code 0")
    if total(found, "ended") < tasks or total(found, "stopped") or total(found, "fenced"):
        problems.append(f"of {tasks} tasks, {total(found, 'ended')} ran their time out, {total(found, 'stopped')} "
                        f"were stopped and {total(found, 'fenced')} ended with their lease")
    for key in ("nodes_not_up", "reconnects", "lease_expiries", "errors", "healthz_failures"):
        if figures[key]:
            problems.append(f"{key}: {figures[key]}")
    if problems:
        figures["problem"] = "; ".join(problems)
    return figures


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, run the fleet and print the figures; 1 when a job, a node or a message went wrong."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100, help="emulated nodes (default 100)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs of each node (default 8)")
    parser.add_argument("--jobs", type=int, default=None, help="jobs to submit (default: one per GPU)")
    parser.add_argument("--mix", action="store_true",
                        help="a rotation of one-GPU jobs, half-GPU fractions and gangs of 2 tasks x 4 GPUs")
    parser.add_argument("--task-s", type=float, default=60.0,
                        help="how long each task runs on its emulated node (default 60; longer than the fill, "
                             "or tasks end before the last ones start)")
    parser.add_argument("--emulators", type=int, default=0,
                        help=f"emulator processes (default: one per {NODES_PER_EMULATOR} nodes)")
    parser.add_argument("--emulator-nice", type=int, default=EMULATOR_NICE, metavar="N",
                        help=f"run the emulators at this niceness (default {EMULATOR_NICE}, the controller's; node "
                             f"hosts have CPUs of their own: 10 leaves the controller the CPU it would have beside "
                             f"them)")
    parser.add_argument("--heartbeat-s", type=float, default=5.0, help="the controller's heartbeat_s (default 5)")
    parser.add_argument("--node-timeout-s", type=float, default=60.0,
                        help="the controller's node_timeout_s (default 60)")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up on a phase after this (default 600 s)")
    parser.add_argument("--cprofile", metavar="FILE", help="run the controller under cProfile, writing FILE")
    parser.add_argument("--profile", metavar="FILE",
                        help="py-spy record the controller into FILE (.svg, .json, or .txt for collapsed stacks)")
    parser.add_argument("--stretches", type=int, default=0, metavar="N",
                        help="time the CPU of each of the controller loop's callbacks (bench/loop_stretches.py): "
                             "print the longest, how many took 10 ms and 100 ms or more, and the N longest")
    parser.add_argument("--gc-census", action="store_true",
                        help="with --stretches: after the first long passes of the collector, count the objects it "
                             "found alive by type (what its next passes walk); the counting stalls a little more")
    parser.add_argument("--keep", metavar="DIR", help="keep the state, logs and reports in DIR")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.jobs is None:
        args.jobs = args.nodes * args.gpus_per_node
    figures = run(args)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"fleet: {figures['nodes']} emulated nodes x {figures['gpus_per_node']} GPUs "
              f"({figures['emulators']} emulator processes), scheduling core "
              f"{'compiled' if figures['core_compiled'] else 'in Python'}, event loop {figures['event_loop']}, "
              f"{figures['jobs']} jobs "
              f"({'mixed' if figures['mix'] else 'one GPU each'}, {figures['tasks']} tasks, `sleep {args.task_s:g}`)")
        print(f"  registration: {figures['register_s']} s, controller CPU {figures['register_cpu_s']} s, "
              f"scheduler built anew {figures['register_builds']} times")
        print(f"  fill (first submit to every task started): {figures['fill_s']} s (goal < {GOAL_FILL_S:g} s; "
              f"submitting took {figures['submit_s']} s)")
        print(f"  drain (first task end to every job finished): {figures['drain_s']} s; "
              f"{figures['drain_lag_s']} s after the last task ended")
        print(f"  controller CPU from the first submit to the end of the drain: {figures['controller_cpu_s']} s "
              f"(emulators: {figures['emulator_cpu_s']} s, run at nice {figures['emulator_nice']})")
        print(f"  heartbeat -> lease answer: p50 {figures['heartbeat_p50_ms']} ms, p99 {figures['heartbeat_p99_ms']} "
              f"ms, max {figures['heartbeat_max_ms']} ms over {figures['heartbeats']} heartbeats")
        print(f"  /healthz every {PROBE_EVERY_S * 1000:.0f} ms: max {figures['healthz_max_ms']} ms, p99 "
              f"{figures['healthz_p99_ms']} ms, {figures['healthz_over_goal']} at or over {GOAL_HEALTHZ_MS:g} ms; "
              f"max by phase {figures['healthz_max_ms_by_phase']}; the controller's loop ran late by up to "
              f"{figures['controller_loop_lag_max_ms']} ms")
        print(f"  nodes not up: {figures['nodes_not_up']}, reconnects: {figures['reconnects']}, lease expiries: "
              f"{figures['lease_expiries']}, refused messages: {figures['errors']}; "
              f"latest jobs COMPLETED with exit 0: {figures['completed_exit_0']}/{min(figures['jobs'], MAX_HISTORY)}")
        print(f"  load average before {figures['load_avg_before']}, after {figures['load_avg_after']}")
        if args.stretches:
            print(f"  the controller loop's callbacks: longest {figures['loop_callback_max_cpu_ms']} ms of CPU, "
                  f"{figures['loop_callbacks_over_10ms']} of 10 ms or more, {figures['loop_callbacks_over_100ms']} "
                  f"of 100 ms or more, {figures['loop_cpu_s']} s in all; the collector's full passes: "
                  f"{figures['gc_full_passes']}, longest {figures['gc_full_max_ms']} ms, {figures['gc_full_s']} s in all "
                  f"(by generation, the longest pass: {figures['gc_longest_ms_by_generation']} ms; passes, of 10 ms "
                  f"or more and of 20 ms or more: {figures['gc_passes_by_generation']}); "
                  f"the longest callbacks:")
            for ms, what in figures["loop_longest"]:
                print(f"    {ms:8.1f} ms  {what}")
            print(f"  the loop's CPU between the probe's wake-ups (ms): {figures['loop_held_cpu_ms']}")
            print(f"  the loop woke late by up to {figures['loop_lag_max_ms']} ms, "
                  f"{figures['loop_stalls_over_100ms']} times by 100 ms or more; the longest, with what the "
                  f"process did meanwhile (CPU ms):")
            for stall in figures["loop_stalls"]:
                print(f"    {json.dumps(stall)}")
            for census in figures["gc_census"]:
                print(f"  after a pass of generation {census['generation']} ({census['ms']} ms, {census['thread']}): "
                      f"{census['survivors']} objects, most {census['types'][:8]}")
        if "problem" in figures:
            print(f"  PROBLEM: {figures['problem']}")
    return 1 if "problem" in figures else 0


if __name__ == "__main__":
    sys.exit(main())
