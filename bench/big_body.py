"""Send 63 MB bodies of `{}` objects to a real controller and report its peak RSS (VmHWM) before and after.

Three clients at once, each a 63 MB batch body: with a Content-Length, then
chunked (so the controller must refuse it while it streams), then a body
just under the cap (4 MiB by default) packed with values. Prints each
answer's status, the controller's peak RSS before and after, and the worst
/healthz latency meanwhile.
    python bench/big_body.py
"""

from __future__ import annotations

import http.client
import sys
import tempfile
import threading
import time
from pathlib import Path

from kill_submits import Controller

SIZE = 63 * 1000 * 1000


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory so far, in MiB."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def send(port: int, token: str, body: bytes, chunked: bool, statuses: list) -> None:
    """POST ``body`` to /api/v1/jobs/batch and note the status (0 when the controller hung up first)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    try:
        if chunked:
            pieces = (body[i:i + 1 << 20] for i in range(0, len(body), 1 << 20))
            conn.request("POST", "/api/v1/jobs/batch", body=pieces, headers=headers, encode_chunked=True)
        else:
            conn.request("POST", "/api/v1/jobs/batch", body=body, headers=headers)
        statuses.append(conn.getresponse().status)
    except OSError:
        statuses.append(0)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="gpud-body-") as tmp:
        controller = Controller(Path(tmp))
        controller.start()
        try:
            token = (Path(tmp) / "state" / "admin.token").read_text().strip()
            pid = controller.process.pid
            before = peak_rss_mib(pid)
            big = b'{"jobs": [' + b"{}," * (SIZE // 3) + b"{}]}"
            small = b'{"jobs": [' + b"{}," * (4 * 1024 * 1024 // 3 - 10) + b"{}]}"
            worst = [0.0]
            stop = threading.Event()

            def poll() -> None:
                health = http.client.HTTPConnection("127.0.0.1", controller.port, timeout=60)
                while not stop.is_set():
                    t0 = time.perf_counter()
                    health.request("GET", "/healthz")
                    health.getresponse().read()
                    worst[0] = max(worst[0], time.perf_counter() - t0)
                    time.sleep(0.01)

            poller = threading.Thread(target=poll)
            poller.start()
            for label, body, chunked in (("63 MB with Content-Length", big, False), ("63 MB chunked", big, True),
                                         (f"{len(small) / 1e6:.1f} MB of values", small, False)):
                statuses: list = []
                clients = [threading.Thread(target=send, args=(controller.port, token, body, chunked, statuses))
                           for _ in range(3)]
                for client in clients:
                    client.start()
                for client in clients:
                    client.join()
                print(f"{label}, 3 at once: answers {sorted(statuses)}; peak RSS {peak_rss_mib(pid):.0f} MiB")
            stop.set()
            poller.join()
            print(f"controller peak RSS before {before:.0f} MiB, after {peak_rss_mib(pid):.0f} MiB; "
                  f"worst /healthz meanwhile {worst[0] * 1000:.0f} ms")
        finally:
            controller.stop()


if __name__ == "__main__":
    sys.exit(main())
