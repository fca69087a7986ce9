"""Cancel (or hold, then release) a large array while /healthz is polled: how long it takes and the worst latency.

Starts a real controller (its own process, SQLite store, synchronous=FULL)
on 127.0.0.1 with no nodes, submits one array of N held elements, then
cancels the array id while another thread asks /healthz every 10 ms on a
keep-alive connection (and during the submit). Prints the time of the
submit and of the cancel, and /healthz's latency during each.
    python bench/array_cancel.py [--elements 100000] [--verb cancel|hold]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

from kill_submits import Controller


def call(conn: http.client.HTTPConnection, method: str, path: str, token: str, body: object = None) -> tuple[int, dict]:
    """One request on ``conn``; the status and the JSON answer."""
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})
    answer = conn.getresponse()
    return answer.status, json.loads(answer.read() or b"null")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", type=int, default=100_000)
    parser.add_argument("--verb", choices=("cancel", "release"), default="cancel")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpud-array-") as tmp:
        controller = Controller(Path(tmp))
        controller.start()
        try:
            token = (Path(tmp) / "state" / "admin.token").read_text().strip()
            conn = http.client.HTTPConnection("127.0.0.1", controller.port, timeout=600)
            latencies: list[float] = []
            stop = threading.Event()

            def poll() -> None:
                health = http.client.HTTPConnection("127.0.0.1", controller.port, timeout=600)
                while not stop.is_set():
                    t0 = time.perf_counter()
                    health.request("GET", "/healthz")
                    health.getresponse().read()
                    latencies.append(time.perf_counter() - t0)
                    time.sleep(0.01)

            poller = threading.Thread(target=poll)
            poller.start()
            time.sleep(0.2)
            latencies.clear()
            began = time.perf_counter()
            status, answer = call(conn, "POST", "/api/v1/jobs", token,
                                  {"project": "bench", "workdir": "/tmp", "command": ["true"], "hold": True,
                                   "array": f"0-{args.elements - 1}"})
            assert status == 201, answer
            submitted = time.perf_counter() - began
            during_submit = list(latencies)
            array_id = answer["array_id"]
            time.sleep(1.0)
            latencies.clear()
            began = time.perf_counter()
            status, answer = call(conn, "POST", f"/api/v1/jobs/{array_id}/{args.verb}", token)
            took = time.perf_counter() - began
            stop.set()
            poller.join()
            assert status == 200 and len(answer["ids"]) == args.elements, (status, str(answer)[:200])
        finally:
            controller.stop()
    print(f"array of {args.elements} held elements: submit {submitted:.2f} s; {args.verb} {took:.2f} s")
    for phase, seen in (("submit", during_submit), (args.verb, latencies)):
        print(f"/healthz during the {phase}: {len(seen)} answers, median {statistics.median(seen) * 1000:.1f} ms, "
              f"99th percentile {statistics.quantiles(seen, n=100)[98] * 1000:.1f} ms, "
              f"worst {max(seen) * 1000:.1f} ms")

if __name__ == "__main__":
    main()
