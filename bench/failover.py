"""Kill -9 the leading controller again and again while clients submit: how long until submits succeed again.

Starts a throwaway PostgreSQL server (tests/pg_server.py), two `gpud
controller` processes on it (the default lease: renewed every 1 s, taken
over after 6 s), and a node daemon given both URLs running one long job.
CLIENTS threads submit held jobs through gpud.client.Client given both
URLs, with ``idempotent=True`` as `gpuctl submit` does. KILLS times, the
leader is killed with SIGKILL; once the other leads, the killed one is
started again (it comes back as a standby) for the next round. Prints
JSON:
  resume_s      per kill, from the kill to the first submit acknowledged after it (median, worst)
  first_cycle_s per takeover, from taking the lease to the new leader's first scheduling cycle
  lost          acknowledged jobs the cluster does not have
  duplicated    jobs the cluster has more than once (one name each)
  restarted     how often the long job was restarted (its restart count), and whether it still runs

    python bench/failover.py [--kills 20] [--clients 8] [--lease-timeout 6] [--renew 1]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

from daemons import wait_for  # noqa: E402
from ha_cluster import HaCluster  # noqa: E402
from gpud.testing.pg_server import Server  # noqa: E402

from gpud.client import Client, ClientError  # noqa: E402


def main() -> int:
    """Run the kills and print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--lease-timeout", type=float, default=6.0, help="[leader] lease_timeout_s (default 6)")
    parser.add_argument("--renew", type=float, default=1.0, help="[leader] renew_s (default 1)")
    args = parser.parse_args()
    server = Server()
    root = Path(tempfile.mkdtemp(prefix="gpud-failover-"))
    ha = HaCluster(root, server.database(), lease_timeout_s=args.lease_timeout, renew_s=args.renew,
                   node_timeout_s=60.0, heartbeat_s=1.0)
    try:
        return run(ha, args)
    finally:
        ha.close()
        server.stop()


def run(ha: HaCluster, args: argparse.Namespace) -> int:
    ha.start_controller(0, init=True)
    ha.wait_leader(0)
    ha.start_controller(1)
    wait_for(lambda: ha.role(1) == "standby", "c1 to stand by")
    ha.start_node("n1", gpus=2)
    client = ha.client()
    long_id = client.post("jobs", {"project": "alpha", "workdir": str(ha.workdir), "command": ["sleep", "100000"],
                                   "gpus": 1, "name": "long"}, idempotent=True)["ids"][0]
    wait_for(lambda: client.get(f"jobs/{long_id}")["state"] == "RUNNING", "the long job to run")

    stop = threading.Event()
    acks: list[tuple[float, str]] = []   # (monotonic instant acknowledged, job id)
    failures: list[str] = []
    lock = threading.Lock()

    def submit(worker: int) -> None:
        mine = Client(ha.url_list, ha.admin_token, timeout=5.0, retry_s=120.0, connect_retry_s=120.0)
        index = 0
        while not stop.is_set():
            body = {"project": "alpha", "workdir": str(ha.workdir), "command": ["true"], "hold": True,
                    "name": f"w{worker}-{index}"}
            try:
                job_id = mine.post("jobs", body, idempotent=True)["ids"][0]
            except ClientError as exc:
                failures.append(str(exc))
                continue
            with lock:
                acks.append((time.monotonic(), job_id))
            index += 1

    workers = [threading.Thread(target=submit, args=(w,), daemon=True) for w in range(args.clients)]
    for worker in workers:
        worker.start()
    resume: list[float] = []
    first_cycle: list[float] = []
    leader = 0
    try:
        for round_ in range(args.kills):
            wait_for(lambda: len(acks) > 0 and acks[-1][0] > time.monotonic() - 1, "submits to flow", 60)
            standby = 1 - leader
            ha.kill(leader)
            killed = time.monotonic()
            wait_for(lambda: any(at > killed for at, _ in acks[-args.clients * 4:]),
                     f"a submit after kill {round_ + 1}", 120)
            resume.append(min(at for at, _ in acks if at > killed) - killed)
            health = ha.wait_leader(standby, timeout=60)
            first_cycle.append(health["takeover"]["first_cycle_s"])
            print(f"kill {round_ + 1}: submits again after {resume[-1]:.2f} s (term {health['term']}, first cycle "
                  f"{first_cycle[-1]:.3f} s after the takeover)", file=sys.stderr)
            ha.start_controller(leader)
            wait_for(lambda: ha.role(leader) == "standby", "the killed controller to stand by again", 60)
            leader = standby
    finally:
        stop.set()
        for worker in workers:
            worker.join(180)
    ids = [job_id for _, job_id in acks]
    listed = ha.client().get_all("jobs", {"state": "PENDING"})["jobs"]
    have = {job["id"] for job in listed}
    names = collections.Counter(job["name"] for job in listed)
    long = ha.client().get(f"jobs/{long_id}")
    result = {
        "kills": len(resume), "clients": args.clients, "lease_timeout_s": args.lease_timeout,
        "renew_s": args.renew,
        "resume_s": {"median": round(statistics.median(resume), 3), "worst": round(max(resume), 3),
                     "each": [round(r, 3) for r in resume]},
        "first_cycle_s": {"median": round(statistics.median(first_cycle), 3), "worst": round(max(first_cycle), 3)},
        "acknowledged": len(ids), "lost": len(set(ids) - have), "acknowledged_twice": len(ids) - len(set(ids)),
        "duplicated": sum(count - 1 for count in names.values() if count > 1),
        "client_errors": len(failures),
        "long_job": {"state": long["state"], "restart_count": long["restart_count"]},
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
