"""How long listing many active jobs stalls the controller: /healthz latency while GET /api/v1/jobs runs.

Starts a real controller on 127.0.0.1 (its own process, a temporary state
directory), submits an array of JOBS held jobs, then lists every job by
following next_cursor (``--limit`` per page; an answer without next_cursor
is taken whole) while another thread asks /healthz as fast as it answers.
Prints the listing's time, the pages, and /healthz's median, p99 and worst
latency while the listing ran (the worst is the longest the event loop was
held); round 0 is /healthz alone, with nothing listed, for comparison.

With ``--history`` the jobs are cancelled first and each round reads them
back from GET /api/v1/history (at most 10,000, ``--limit`` capped there)
instead: ended jobs are decoded from the store.

    python bench/list_stall.py [--jobs 100000] [--limit 1000] [--rounds 3] [--idle-s 20] [--history]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

POLICY = '[[projects]]\nname = "bench"\ngpu_quota = 8\n'


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(port: int, method: str, path: str, token: str | None = None, body: dict | None = None,
         timeout: float = 600) -> tuple[int, dict]:
    """One request on its own connection; (status, JSON answer)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        connection.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read() or b"null")
    finally:
        connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--limit", type=int, default=1000, help="jobs per page asked for")
    parser.add_argument("--rounds", type=int, default=3, help="full listings measured")
    parser.add_argument("--idle-s", type=float, default=20.0,
                        help="first, /healthz alone for this long (round 0): the latency no listing causes")
    parser.add_argument("--history", action="store_true",
                        help="cancel the jobs and read them back with GET /api/v1/history?limit=LIMIT")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpud-list-stall-") as root_text:
        root = Path(root_text)
        port = free_port()
        (root / "policy.toml").write_text(POLICY)
        (root / "work").mkdir()
        log = open(root / "controller.log", "wb")
        process = subprocess.Popen([sys.executable, "-m", "gpud.cli.gpud_main", "controller", "--listen",
                                    f"127.0.0.1:{port}", "--state-dir", str(root / "state"), "--policy",
                                    str(root / "policy.toml"), "--init", "--allow-root"], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if call(port, "GET", "/healthz", timeout=2)[0] == 200:
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise SystemExit("the controller did not start") from None
                    time.sleep(0.05)
            token = (root / "state" / "admin.token").read_text().strip()
            status, answer = call(port, "POST", "/api/v1/jobs", token, {
                "project": "bench", "workdir": str(root / "work"), "command": ["true"], "hold": True, "gpus": 0,
                "array": f"0-{args.jobs - 1}"})
            if status != 201:
                raise SystemExit(f"the submit failed: {status} {answer}")
            if args.history:
                status, cancelled = call(port, "POST", f"/api/v1/jobs/{answer['array_id']}/cancel", token, {})
                if status != 200:
                    raise SystemExit(f"the cancel failed: {status} {cancelled}")
            if args.idle_s:
                measure(port, token, args.limit, args.jobs, 0, idle_s=args.idle_s)
            for round_ in range(args.rounds):
                measure(port, token, args.limit, args.jobs, round_ + 1, history=args.history)
        finally:
            os.kill(process.pid, signal.SIGTERM)
            process.wait(60)
            log.close()


def measure(port: int, token: str, limit: int, jobs: int, round_: int, idle_s: float = 0.0,
            history: bool = False) -> None:
    """One full listing (or one read of the history) with /healthz asked throughout (or, with ``idle_s``,
    none); prints its figures."""
    latencies: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            began = time.perf_counter()
            call(port, "GET", "/healthz", timeout=60)
            latencies.append(time.perf_counter() - began)

    prober = threading.Thread(target=probe)
    prober.start()
    began = time.perf_counter()
    listed, pages, cursor = 0, 0, None
    while idle_s:
        time.sleep(idle_s)
        break
    while history and not idle_s:
        status, answer = call(port, "GET", f"/api/v1/history?limit={min(limit, 10_000)}", token)
        if status != 200:
            raise SystemExit(f"reading the history failed: {status} {answer}")
        listed, pages = len(answer["jobs"]), 1
        break
    while not idle_s and not history:
        path = f"/api/v1/jobs?limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        status, answer = call(port, "GET", path, token)
        if status != 200:
            raise SystemExit(f"listing failed: {status} {answer}")
        listed += len(answer["jobs"])
        pages += 1
        cursor = answer.get("next_cursor")
        if not cursor:
            break
    took = time.perf_counter() - began
    done.set()
    prober.join()
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(json.dumps({"round": round_, "active_jobs": jobs, "listed": listed, "pages": pages,
                      "list_s": round(took, 2), "healthz_probes": len(latencies),
                      "healthz_median_ms": round(statistics.median(latencies) * 1000, 1),
                      "healthz_p99_ms": round(p99 * 1000, 1),
                      "healthz_max_ms": round(latencies[-1] * 1000, 1)}), flush=True)


if __name__ == "__main__":
    main()
