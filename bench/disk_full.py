"""Fill the controller's disk while clients submit: count acknowledged jobs lost and refused jobs that ran.

Each run mounts a small tmpfs (root only) as a real controller's state
directory, starts the controller and a node daemon with fake GPUs (their
other files elsewhere), fills the tmpfs to within FREE_KIB of full, and lets
WORKERS threads submit JOBS small jobs each (every job writes a marker file
named after itself when it runs) while the store runs out of space. Then it
frees the space, checks that a submit succeeds again, lets the jobs run,
stops the controller cleanly, reads the store and starts the controller
again. Per run:
  acknowledged    submits answered 201;
  refused         submits answered 503 (the store error named);
  lost            acknowledged jobs absent from the store after the restart;
  refused_stored  refused jobs present in the store;
  refused_ran     refused jobs that ran (their marker file exists).

    sudo python bench/disk_full.py [--runs 20] [--workers 6] [--jobs 40] [--size-kib 4096] [--free-kib 1200]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

POLICY = 'grace_period = 1\nmin_runtime = 0\n[[projects]]\nname = "bench"\ngpu_quota = 8\n'
PAD = "x" * 6000          # each job's record is a few KiB, so the store fills in a few hundred submits


class MountError(RuntimeError):
    """The tmpfs could not be mounted (not root, or no mount permission here)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mount_tmpfs(path: Path, size_kib: int) -> None:
    """Mount a tmpfs of ``size_kib`` at ``path``; MountError when that is impossible."""
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0700", "tmpfs", str(path)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise MountError(f"cannot mount a tmpfs at {path}: {result.stderr.strip() or result.returncode}")


def unmount(path: Path) -> None:
    """Unmount ``path`` (lazily, so a file still open never keeps it)."""
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(directory: Path, leave_kib: int) -> Path:
    """Write a filler file in ``directory`` until at most ``leave_kib`` KiB are free; returns its path."""
    filler = directory / "filler"
    stats = os.statvfs(directory)
    free = stats.f_bavail * stats.f_frsize
    with open(filler, "wb") as out:
        out.write(b"\0" * max(0, free - leave_kib * 1024))
    return filler


class Daemon:
    """A gpud process (controller or node) started by this script and stopped by pid."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.out = open(log, "ab")
        self.process = subprocess.Popen([sys.executable, "-m", "gpud.cli.gpud_main", *argv],
                                        stdout=self.out, stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        """True while it runs."""
        return self.process.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """Signal it and wait (SIGKILL after 30 s); its exit status."""
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self.out.close()
        return self.process.returncode


class Scene:
    """One run's files: the tmpfs state directory, the node's directory, the markers, the configs."""

    def __init__(self, root: Path, size_kib: int) -> None:
        self.root, self.size_kib = root, size_kib
        self.state = root / "state"
        self.markers = root / "markers"
        self.work = root / "work"
        for path in (self.markers, self.work):
            path.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (root / "policy.toml").write_text(POLICY)
        (root / "controller.toml").write_text(
            f'listen = "127.0.0.1:{self.port}"\nstate_dir = "{self.state}"\npolicy = "{root / "policy.toml"}"\n'
            f"[scheduler]\ninterval_s = 1\nheartbeat_s = 0.5\n")
        (root / "node.toml").write_text(
            f'controller_url = "{self.url}"\ncluster_key_file = "{self.state}/cluster.key"\n'
            f'state_dir = "{root / "node"}"\nname = "n1"\ngpu_backend = "fake"\nfake_gpus = 2\ncpus = 64\n'
            f"memory_gib = 64\n")
        self.controller: Daemon | None = None
        self.node: Daemon | None = None
        self.token = ""
        self.answers: dict[int, Any] = {}

    def start_controller(self) -> None:
        """Start the controller (a new cluster the first time) and wait until it answers."""
        first = [] if (self.state / "gpud.sqlite").exists() else ["--init", "--allow-root"]
        self.controller = Daemon(["controller", "--config", str(self.root / "controller.toml"), *first],
                                 self.root / "controller.log")
        wait(lambda: self.healthy(), "the controller to answer", self.root / "controller.log")
        self.token = (self.state / "admin.token").read_text().strip()

    def start_node(self) -> None:
        """Start the node daemon and wait until the controller lists it up."""
        self.node = Daemon(["node", "--config", str(self.root / "node.toml")], self.root / "node.log")
        wait(lambda: any(n["state"] == "up" for n in self.api("GET", "/api/v1/nodes")[1].get("nodes", [])),
             "the node to register", self.root / "node.log")

    def healthy(self) -> bool:
        """True when /healthz answers 200."""
        if self.controller is not None and not self.controller.alive():
            raise SystemExit(f"the controller exited; see {self.root / 'controller.log'}")
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Call the API as the admin; (status, decoded answer)."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Authorization": f"Bearer {self.token}",
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.status, json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def job(self, name: str) -> dict:
        """A small CPU-only job that writes its marker file when it runs."""
        return {"project": "bench", "workdir": str(self.work), "name": name, "gpus": 0, "cpus": 0.1,
                "memory_gib": 0.05, "env": {"PAD": PAD}, "output": "/dev/null", "error": "/dev/null",
                "command": ["sh", "-c", f"echo ran > {self.markers / name}"]}

    def stored_names(self) -> set[str]:
        """The names of every job in the store (read with the controller stopped)."""
        with sqlite3.connect(self.state / "gpud.sqlite") as db:
            return {json.loads(record).get("name") for (record,) in db.execute("SELECT record FROM jobs")}

    def close(self) -> None:
        """Stop the daemons this run started."""
        for daemon in (self.node, self.controller):
            if daemon is not None:
                daemon.stop(signal.SIGKILL if daemon is self.node else signal.SIGTERM)


def wait(check, what: str, log: Path, timeout: float = 60.0) -> None:
    """Poll ``check`` until true; SystemExit naming ``what`` and the log after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}; see {log}")


def churn(directory: Path, kib: int, stop: threading.Event) -> None:
    """Take ``kib`` KiB of ``directory`` and give it back, again and again until ``stop``: another program's
    scratch files, so the store's writes fail and succeed in turn instead of once failing for good."""
    path = directory / "churn"
    while not stop.is_set():
        try:
            with open(path, "wb") as out:
                out.write(b"\0" * kib * 1024)
        except OSError:
            pass
        stop.wait(0.03)
        path.unlink(missing_ok=True)
        stop.wait(0.03)


def submit_all(scene: Scene, workers: int, jobs: int, tag: str) -> dict[str, int]:
    """Every job's answer status (by name) from ``workers`` threads submitting ``jobs`` jobs each.

    The first answer of each status other than 201 is kept in ``scene.answers``.
    """
    statuses: dict[str, int] = {}
    lock = threading.Lock()

    def worker(w: int) -> None:
        for i in range(jobs):
            name = f"{tag}w{w}j{i}"
            try:
                status, body = scene.api("POST", "/api/v1/jobs", scene.job(name))
            except OSError as exc:
                status, body = -1, str(exc)
            with lock:
                statuses[name] = status
                if status != 201:
                    scene.answers.setdefault(status, body)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses


def one_run(root: Path, workers: int, jobs: int, size_kib: int, free_kib: int) -> dict[str, Any]:
    """One run in ``root`` (the tmpfs mounted and unmounted here); its counts."""
    scene = Scene(root, size_kib)
    mount_tmpfs(scene.state, size_kib)
    try:
        scene.start_controller()
        scene.start_node()
        filler = fill(scene.state, free_kib)
        stop = threading.Event()
        churner = threading.Thread(target=churn, args=(scene.state, free_kib // 2, stop))
        churner.start()
        try:
            statuses = submit_all(scene, workers, jobs, "a")
        finally:
            stop.set()
            churner.join()
        alive_when_full = scene.controller is not None and scene.controller.alive() and scene.healthy()
        filler.unlink()
        after = submit_all(scene, 1, 3, "b")     # space freed: submits are accepted again
        statuses.update(after)
        acked = {name for name, status in statuses.items() if status == 201}
        refused = {name for name, status in statuses.items() if status == 503}
        other = {status: scene.answers[status] for status in set(statuses.values()) - {201, 503}}
        # Let every acknowledged job run, so a refused one that would run has had its chance too.
        wait(lambda: all((scene.markers / name).exists() for name in acked), "the acknowledged jobs to run",
             root / "node.log", timeout=180.0)
        assert scene.controller is not None
        scene.controller.stop()
        stored = scene.stored_names()
        scene.start_controller()                 # and it starts again on what it wrote
        # Whatever it read back runs now: a refused job that was written anyway would run here.
        wait(lambda: not scene.api("GET", "/api/v1/jobs")[1]["jobs"], "the restored jobs to end",
             root / "controller.log", timeout=180.0)
        ran = {path.name for path in scene.markers.iterdir()}
        return {"acknowledged": len(acked), "refused": len(refused), "other": other,
                "lost": len(acked - stored), "refused_stored": len(refused & stored),
                "refused_ran": len(refused & ran), "recovered": all(after[name] == 201 for name in after),
                "alive_when_full": alive_when_full, "refusal": scene.answers.get(503)}
    finally:
        scene.close()
        unmount(scene.state)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--jobs", type=int, default=40, help="jobs each worker submits")
    parser.add_argument("--size-kib", type=int, default=4096, help="the tmpfs's size")
    parser.add_argument("--free-kib", type=int, default=1200, help="space left free when the submits begin")
    args = parser.parse_args()
    totals = {"runs": 0, "acknowledged": 0, "refused": 0, "lost": 0, "refused_stored": 0, "refused_ran": 0}
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="gpud-disk-full-") as root:
            result = one_run(Path(root), args.workers, args.jobs, args.size_kib, args.free_kib)
        print(f"run {run + 1}: {json.dumps(result)}", flush=True)
        totals["runs"] += 1
        for key in ("acknowledged", "refused", "lost", "refused_stored", "refused_ran"):
            totals[key] += result[key]
    print(json.dumps(totals))


if __name__ == "__main__":
    try:
        main()
    except MountError as exc:
        raise SystemExit(str(exc)) from None
