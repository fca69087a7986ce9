"""Kill -9 the controller again and again while clients submit with retries: count jobs lost and duplicated.

Starts a real controller (its own process, SQLite store, synchronous=FULL) on
127.0.0.1; WORKERS threads submit N held jobs through gpud.client.Client
with ``idempotent=True`` (what ``gpuctl submit`` does: one Idempotency-Key per
call, sent again while the connection is lost), while the controller is
killed with SIGKILL every KILL_EVERY seconds and started again. Then:
  lost        jobs a client was told were submitted that the controller does not have;
  duplicated  jobs the controller has more than once (one name each);
  refused     calls refused before anything was sent (controller down), sent again with a new key.
    python bench/kill_submits.py [--jobs 10000] [--workers 16] [--kill-every 1.0]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpud.client import Client, Unreachable  # noqa: E402

POLICY = '[[projects]]\nname = "bench"\ngpu_quota = 100\n'


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Controller:
    """A `gpud controller` process on 127.0.0.1 with its state in ``root``."""

    def __init__(self, root: Path) -> None:
        self.root, self.port = root, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (root / "policy.toml").write_text(POLICY)
        (root / "controller.toml").write_text(f'listen = "127.0.0.1:{self.port}"\nstate_dir = "{root / "state"}"\n'
                                              f'policy = "{root / "policy.toml"}"\n')
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        """Start it and wait until /healthz answers."""
        log = open(self.root / "controller.log", "ab")
        self.process = subprocess.Popen([sys.executable, "-m", "gpud.cli.gpud_main", "controller", "--config",
                                         str(self.root / "controller.toml"),
                                         *([] if (self.root / "state" / "gpud.sqlite").exists() else ["--init", "--allow-root"])],
                                        stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1):
                    return
            except OSError:
                time.sleep(0.02)
        raise SystemExit("the controller did not start; see " + str(self.root / "controller.log"))

    def kill(self) -> None:
        """SIGKILL it and reap it."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        """SIGTERM it and wait."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            self.process.wait(30)


def run(root: Path, jobs: int, workers: int, kill_every: float) -> dict:
    """Submit ``jobs`` held jobs from ``workers`` threads while the controller is killed; the counts."""
    controller = Controller(root)
    controller.start()
    token = (root / "state" / "admin.token").read_text().strip()
    told: dict[str, list[str]] = {}
    refused = errors = 0
    lock = threading.Lock()
    names = iter(range(jobs))
    done = threading.Event()

    def worker() -> None:
        nonlocal refused, errors
        client = Client(controller.url, token, timeout=10.0, retry_s=120.0)
        while True:
            with lock:
                index = next(names, None)
            if index is None:
                return
            body = {"project": "bench", "workdir": "/tmp", "command": ["true"], "hold": True, "name": f"j{index}"}
            while True:
                try:
                    answer = client.post("jobs", body, idempotent=True)
                    break
                except Unreachable as exc:
                    if not exc.refused:
                        raise
                    with lock:
                        refused += 1
                    time.sleep(0.05)
            with lock:
                told[f"j{index}"] = answer["ids"]

    def killer() -> None:
        kills = 0
        while not done.wait(kill_every):
            controller.kill()
            kills += 1
            controller.start()
        stats["kills"] = kills

    stats: dict = {}
    began = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(workers)]
    murderer = threading.Thread(target=killer)
    murderer.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    murderer.join()
    elapsed = time.monotonic() - began
    client = Client(controller.url, token, timeout=60.0)
    queue = client.get("jobs", {"state": "PENDING"})["jobs"]
    controller.stop()
    by_name = collections.Counter(job["name"] for job in queue)
    ids = {job["id"] for job in queue}
    stats.update(jobs=jobs, acknowledged=len(told), lost=sum(1 for name, got in told.items()
                                                             if not set(got) <= ids),
                 duplicated=sum(count - 1 for count in by_name.values() if count > 1),
                 unacknowledged_in_queue=sum(1 for name in by_name if name not in told),
                 refused_before_sending=refused, seconds=round(elapsed, 1))
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--kill-every", type=float, default=1.0, help="seconds between kills")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpud-kill-") as tmp:
        stats = run(Path(tmp), args.jobs, args.workers, args.kill_every)
    if args.json:
        print(json.dumps(stats))
        return
    print(f"{stats['jobs']} submits from {args.workers} clients with retries, controller killed with SIGKILL "
          f"{stats['kills']} times in {stats['seconds']} s:")
    print(f"  acknowledged {stats['acknowledged']}, lost {stats['lost']}, duplicated {stats['duplicated']}, "
          f"refused before sending {stats['refused_before_sending']}")


if __name__ == "__main__":
    main()
