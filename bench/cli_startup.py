"""Benchmark of a plain `gpuctl submit` and `gpuctl queue` against the Python start-up floor.

Runs, interleaved round by round so that machine load hits each alike:
  python -c pass                              the floor: this interpreter, its site-packages, nothing else;
  python -c "import gpud.cli.gpuctl"          importing the command line;
  gpuctl submit -p bench -- true              one submit, the way a shell loop calls it;
  gpuctl queue                                the job table (50 jobs);
  gpuctl submit --array 0-999 -- true         1,000 jobs in one call, per job.
gpuctl finds a stand-in controller in this process on 127.0.0.1 (canned answers, no store) through
a client.toml as `gpud up` writes it, so the figures are gpuctl's own cost: start-up, reading its
config, parsing, one HTTP exchange, printing.
Prints the median wall time of each and its minimum, the median CPU time (user + system: steadier on
a loaded machine), and each median minus the floor's.
    python bench/cli_startup.py [--runs 40] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

QUEUE = {"jobs": [{"id": str(i), "name": f"train-{i}", "user": "ann", "project": "bench",
                   "state": "RUNNING" if i < 8 else "PENDING", "started": time.time() - 60 * i if i < 8 else None,
                   "gpus": 1, "tasks": 1, "nodes": ["n1"] if i < 8 else [], "reason": "" if i < 8 else
                   "waiting for GPUs"} for i in range(50)]}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        path = self.path.partition("?")[0]
        if self.command == "POST" and body and body.get("array"):
            doc = {"ids": [f"1_{i}" for i in range(1000)], "array_id": "1"}
        elif self.command == "POST":
            doc = {"ids": ["1"]}
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


def gpuctl_argv(scratch: str) -> list[str]:
    """The installed gpuctl script beside this interpreter, else a script that does what it does."""
    script = os.path.join(os.path.dirname(sys.executable), "gpuctl")
    if os.path.exists(script):
        return [script]
    script = os.path.join(scratch, "gpuctl")
    with open(script, "w") as f:
        f.write("import sys\nfrom gpud.cli.gpuctl import main\nsys.exit(main())\n")
    return [sys.executable, script]


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as home:
        gpuctl = gpuctl_argv(home)
        # The client config as `gpud up` writes it: finding the controller reads it on every call.
        # (Not in the directory the commands run in: `python -c` would import that gpud/ folder as gpud.)
        config = os.path.join(home, "config")
        os.makedirs(os.path.join(config, "gpud"))
        with open(os.path.join(config, "gpud", "client.toml"), "w") as f:
            f.write(f'url = "http://127.0.0.1:{server.server_address[1]}"\ntoken = "t"\n')
        env = {**os.environ, "XDG_CONFIG_HOME": config}
        for name in ("GPUD_PROJECT", "GPUD_URL", "GPUD_TOKEN"):
            env.pop(name, None)
        cases = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "import gpud.cli.gpuctl": [sys.executable, "-c", "import gpud.cli.gpuctl"],
            "gpuctl submit": gpuctl + ["submit", "-p", "bench", "--", "true"],
            "gpuctl queue": gpuctl + ["queue"],
            "gpuctl submit --array 0-999": gpuctl + ["submit", "-p", "bench", "--array", "0-999", "--", "true"],
        }
        wall: dict[str, list[float]] = {name: [] for name in cases}
        cpu: dict[str, list[float]] = {name: [] for name in cases}
        for name, argv in cases.items():  # one untimed run each: page cache, .pyc files
            timed(argv, env, home)
        for _ in range(args.runs):
            for name, argv in cases.items():
                elapsed, used = timed(argv, env, home)
                wall[name].append(elapsed)
                cpu[name].append(used)
    server.shutdown()
    floor, cpu_floor = statistics.median(wall["python -c pass"]), statistics.median(cpu["python -c pass"])
    rows = []
    for name in cases:
        median, cpu_median = statistics.median(wall[name]), statistics.median(cpu[name])
        rows.append({"case": name, "median_ms": round(median, 1), "min_ms": round(min(wall[name]), 1),
                     "over_floor_ms": round(median - floor, 1), "cpu_median_ms": round(cpu_median, 1),
                     "cpu_over_floor_ms": round(cpu_median - cpu_floor, 1)})
    print(f"{args.runs} runs each, interleaved; wall time, and CPU time (user + system) of the process\n"
          f"{'':30} {'median':>8} {'min':>7} {'- floor':>8}   {'CPU med':>8} {'- floor':>8}", file=sys.stderr)
    for row in rows:
        print(f"{row['case']:30} {row['median_ms']:8.1f} {row['min_ms']:7.1f} {row['over_floor_ms']:+8.1f}   "
              f"{row['cpu_median_ms']:8.1f} {row['cpu_over_floor_ms']:+8.1f}", file=sys.stderr)
    array = next(r for r in rows if r["case"].endswith("0-999"))
    print(f"the array call submits 1,000 jobs: {array['median_ms'] / 1000:.3f} ms per job", file=sys.stderr)
    if args.json:
        print(json.dumps({"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                      "platform": platform.platform()}, "runs": args.runs, "cases": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
