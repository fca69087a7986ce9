"""Benchmark of one `gpuctl submit`, `gpuctl queue`, `sbatch --parsable` and `squeue` call against Python's start-up.

gpuctl is installed the regular way (not editable) into a temporary venv, `pip install --no-deps .` from
this checkout (GPUD_COMPILE=1 in the environment compiles the core, as for a real install), with pip
first upgraded as a regular install does: the console script a current pip (24.x on) writes imports
nothing, where the one of the pip bundled with Python 3.11's venv (23.x) imports re; the pip version is
printed. --python names an installed one instead (the current venv: --python .venv/bin/python). The Slurm shims are
written by that gpuctl (`gpuctl slurm-shims`). A real controller (`gpud controller`, SQLite store in a
temporary directory, run by the interpreter running this script) serves on 127.0.0.1, found through a
client.toml as `gpud up` writes it; --stand-in answers from this process instead (canned answers, no
store), which leaves gpuctl's own cost alone.

Runs, interleaved round by round so that machine load hits each alike:
  python -c pass                    the floor: the install's interpreter, its site-packages, nothing else;
  argparse + json                   one option parsed by argparse, one JSON answer read by json: the least
                                    any client built on them does (both import re, and argparse gettext);
  gpuctl submit -p bench -- true    one submit, the way a shell loop calls it;
  gpuctl queue                      the job table (50 jobs and more);
  sbatch --parsable --wrap true     one submit through the Slurm shim;
  squeue                            the job table through the Slurm shim.
Prints the median wall time of each, its minimum, the median CPU time (user + system of the process:
steadier on a loaded machine), and each median minus the floor's; with --instructions, the instructions
each executes once (valgrind) and their ratio to the floor's, which load does not move: wall time on a
quiet machine goes nearly as that ratio. A baseline's rows are named "baseline: ..." and compared with
its own floor. --json prints one JSON document.
    python bench/cli_startup.py [--runs 20] [--python PATH] [--baseline PATH] [--stand-in] [--instructions]
                                [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICY = """\
[[projects]]
name = "bench"
gpu_quota = 100000
cpu_quota = 10000000
memory_quota_gib = 100000000
"""
# The least a command-line client built on argparse and json does: parse one option, read one JSON answer.
ARGPARSE_JSON = ("import argparse, json; parser = argparse.ArgumentParser(prog='x'); parser.add_argument('-p'); "
                 "parser.parse_args(['-p', 'x']); json.loads('{\"ids\": [\"1\"]}')")
QUEUE = {"jobs": [{"id": str(i), "name": f"train-{i}", "user": "ann", "project": "bench",
                   "state": "RUNNING" if i < 8 else "PENDING", "started": time.time() - 60 * i if i < 8 else None,
                   "gpus": 1, "tasks": 1, "nodes": ["n1"] if i < 8 else [], "reason": "" if i < 8 else
                   "waiting for GPUs"} for i in range(50)]}


class _StandIn(BaseHTTPRequestHandler):
    """Canned answers: a submit gets id 1, a listing the 50 jobs of QUEUE."""

    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        path = self.path.partition("?")[0]
        if self.command == "POST":
            doc: dict = {"ids": ["1"]}
        elif path == "/api/v1/jobs":
            doc = QUEUE
        else:
            doc = {"error": "no such route"}
        data = json.dumps(doc).encode()
        self.send_response(201 if self.command == "POST" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


class Controller:
    """A real `gpud controller` process with its own state directory on 127.0.0.1, stopped by pid."""

    def __init__(self, root: str) -> None:
        self.dir = os.path.join(root, "controller")
        os.makedirs(self.dir)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        with open(os.path.join(self.dir, "policy.toml"), "w") as f:
            f.write(POLICY)
        config = os.path.join(self.dir, "controller.toml")
        with open(config, "w") as f:
            f.write(f'listen = "127.0.0.1:{self.port}"\nstate_dir = "state"\npolicy = "policy.toml"\n')
        self.log = open(os.path.join(self.dir, "controller.log"), "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpud.cli.gpud_main", "controller", "--config", config,
             "--log-level", "warning", "--init", "--allow-root"], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                with open(os.path.join(self.dir, "controller.log")) as f:
                    raise SystemExit(f"the controller did not start:\n{f.read()}")
            time.sleep(0.05)
        with open(os.path.join(self.dir, "state", "admin.token")) as f:
            self.token = f.read().strip()
        self.url = f"http://127.0.0.1:{self.port}"

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as answer:
                return answer.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM the controller, SIGKILL it if it is still there 20 s later, and reap it."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.close()


def install(scratch: str) -> str:
    """A temporary venv with gpud installed from this checkout the regular way; returns its python."""
    venv = os.path.join(scratch, "venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    upgraded = subprocess.run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if upgraded.returncode != 0:
        print(f"could not upgrade pip; the bundled one writes gpuctl's script:\n{upgraded.stderr.strip()}",
              file=sys.stderr)
    print(f"installing gpud from {ROOT} into {venv} ...", file=sys.stderr)
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", ROOT], check=True,
                   stdout=subprocess.DEVNULL)
    return python


def pip_version(python: str) -> str | None:
    """The version of the pip installed beside ``python`` (whose console scripts it wrote), or None."""
    done = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True, cwd="/")
    return done.stdout.split()[1] if done.returncode == 0 and len(done.stdout.split()) > 1 else None


def compiled_core(python: str) -> bool:
    """Whether the gpud that ``python`` imports has its core compiled by mypyc (a C extension beside it)."""
    done = subprocess.run([python, "-c", "import gpud, os; print(os.path.dirname(gpud.__file__))"],
                          capture_output=True, text=True, cwd="/", check=True)
    package = done.stdout.strip()
    return any(name.endswith(".so") for folder in (package, os.path.join(package, "core"))
               for name in os.listdir(folder))


def instructions(argv: list[str], env: dict[str, str], cwd: str) -> int | None:
    """Instructions the process executes, counted by valgrind (steady however loaded the machine); None without it."""
    try:
        done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv], env=env,
                              cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except FileNotFoundError:
        return None
    counted = [line.rsplit(":", 1)[1] for line in done.stderr.splitlines() if "Collected :" in line]
    return int(counted[0]) if done.returncode == 0 and counted else None


def timed(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """Milliseconds from start to exit of one process, and the CPU time (user + system) it used; raises when it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = (time.perf_counter() - started) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode().strip()}")
    return elapsed, (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000


def measure(pythons: dict[str, str], url: str, token: str, home: str, runs: int, count: bool) -> list[dict]:
    """Run every case of every install (``pythons``: a prefix for its case names -> its interpreter) ``runs``
    times, interleaved; one row of figures per case."""
    # The client config as `gpud up` writes it: finding the controller reads it on every call.
    # (Not in the directory the commands run in: `python -c` would import a gpud/ folder there as gpud.)
    config = os.path.join(home, "config")
    os.makedirs(os.path.join(config, "gpud"))
    with open(os.path.join(config, "gpud", "client.toml"), "w") as f:
        f.write(f'url = "{url}"\ntoken = "{token}"\n')
    env = {**os.environ, "XDG_CONFIG_HOME": config}
    for name in ("GPUD_PROJECT", "GPUD_URL", "GPUD_TOKEN", "GPUD_RETRY", "GPUD_TIMEOUT", "PYTHONPATH"):
        env.pop(name, None)
    work = os.path.join(home, "work")
    os.makedirs(work)
    cases: dict[str, list[str]] = {}
    floors: dict[str, str] = {}  # each case's floor: its own install's `python -c pass`
    for prefix, python in pythons.items():
        gpuctl = os.path.join(os.path.dirname(python), "gpuctl")
        shims = os.path.join(home, f"shims{len(cases)}")
        subprocess.run([gpuctl, "slurm-shims", "--dir", shims], env=env, check=True, stdout=subprocess.DEVNULL)
        install_cases = {
            "python -c pass": [python, "-c", "pass"],
            "argparse + json": [python, "-c", ARGPARSE_JSON],
            "gpuctl submit": [gpuctl, "submit", "-p", "bench", "--", "true"],
            "gpuctl queue": [gpuctl, "queue"],
            "sbatch --parsable": [os.path.join(shims, "sbatch"), "--parsable", "-A", "bench", "--wrap", "true"],
            "squeue": [os.path.join(shims, "squeue")],
        }
        for name, argv in install_cases.items():
            cases[prefix + name] = argv
            floors[prefix + name] = prefix + "python -c pass"
    # A queue worth listing: 50 pending jobs before the first timed call.
    subprocess.run([*cases["gpuctl submit"][:-2], "--array", "0-49", "--", "true"], env=env, cwd=work,
                   check=True, stdout=subprocess.DEVNULL)
    wall: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for name, argv in cases.items():  # one untimed run each: page cache, .pyc files
        timed(argv, env, work)
    for _ in range(runs):
        for name, argv in cases.items():
            elapsed, used = timed(argv, env, work)
            wall[name].append(elapsed)
            cpu[name].append(used)
    rows = []
    for name in cases:
        median, cpu_median = statistics.median(wall[name]), statistics.median(cpu[name])
        floor, cpu_floor = statistics.median(wall[floors[name]]), statistics.median(cpu[floors[name]])
        rows.append({"case": name, "median_ms": round(median, 1), "min_ms": round(min(wall[name]), 1),
                     "over_floor_ms": round(median - floor, 1), "cpu_median_ms": round(cpu_median, 1),
                     "cpu_over_floor_ms": round(cpu_median - cpu_floor, 1)})
    if count:
        counted = {name: instructions(argv, env, work) for name, argv in cases.items()}
        for row in rows:
            row["instructions"] = counted[row["case"]]
            floor_count = counted[floors[row["case"]]]
            row["instructions_x_floor"] = round(row["instructions"] / floor_count, 2) \
                if floor_count and row["instructions"] else None
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="timed runs of each case (default 20)")
    parser.add_argument("--python", metavar="PATH",
                        help="the interpreter of an installed gpud, with gpuctl beside it (default: install "
                             "this checkout into a temporary venv)")
    parser.add_argument("--baseline", metavar="PATH",
                        help="the interpreter of a second installed gpud, with gpuctl beside it, whose calls run "
                             "beside these, interleaved (rows named 'baseline: ...')")
    parser.add_argument("--stand-in", action="store_true",
                        help="answer from this process (canned answers) instead of a real controller")
    parser.add_argument("--instructions", action="store_true",
                        help="also count each case's instructions once with valgrind, and their ratio to the "
                             "floor's: figures a loaded machine does not move")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        python = os.path.abspath(args.python) if args.python else install(home)
        pythons = {"": python}
        if args.baseline:
            pythons["baseline: "] = os.path.abspath(args.baseline)
        for one in pythons.values():
            if not os.path.exists(os.path.join(os.path.dirname(one), "gpuctl")):
                raise SystemExit(f"no gpuctl beside {one}: install gpud there")
        server = controller = None
        try:
            if args.stand_in:
                server = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
                threading.Thread(target=server.serve_forever, daemon=True).start()
                url, token = f"http://127.0.0.1:{server.server_address[1]}", "t"
            else:
                controller = Controller(home)
                url, token = controller.url, controller.token
            rows = measure(pythons, url, token, home, args.runs, args.instructions)
            compiled = compiled_core(python)
            pips = {prefix or "install": pip_version(one) for prefix, one in pythons.items()}
        finally:
            if server is not None:
                server.shutdown()
            if controller is not None:
                controller.stop()
    server_kind = "a stand-in in this process" if args.stand_in else "a real controller"
    print("pip that wrote gpuctl's script: " + ", ".join(f"{name.rstrip(': ')} {version}"
                                                         for name, version in pips.items()), file=sys.stderr)
    print(f"{args.runs} runs each, interleaved, {server_kind} on 127.0.0.1; wall time, and CPU time (user + system) "
          f"of the process\n{'':30} {'median':>8} {'min':>7} {'- floor':>8}   {'CPU med':>8} {'- floor':>8}",
          file=sys.stderr)
    for row in rows:
        counted = f"   {row['instructions'] / 1e6:7.1f} M instructions, {row['instructions_x_floor']:.2f} x the floor" \
            if row.get("instructions") else ""
        print(f"{row['case']:30} {row['median_ms']:8.1f} {row['min_ms']:7.1f} {row['over_floor_ms']:+8.1f}   "
              f"{row['cpu_median_ms']:8.1f} {row['cpu_over_floor_ms']:+8.1f}{counted}", file=sys.stderr)
    if args.json:
        print(json.dumps({"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                      "platform": platform.platform(), "load": os.getloadavg()},
                          "install": "given" if args.python else "temporary venv, pip install --no-deps",
                          "compiled_core": compiled, "pip": pips,
                          "baseline": os.path.abspath(args.baseline) if args.baseline else None,
                          "controller": "stand-in" if args.stand_in else "real",
                          "runs": args.runs, "cases": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
