"""The submit loop on SQLite beside PostgreSQL: jobs/s through `gpud controller`'s API with either store.

Starts a throwaway PostgreSQL server (gpud/testing/pg_server.py, every
commit fsync'd, as SQLite's synchronous=FULL is), then, --repeat times and
alternating the stores so that both see the same load, a fresh `gpud
controller` (bench/submit.py's: its own state directory; with PostgreSQL a
new database, the controller leading it) and submits --jobs jobs one per
request: from one client over one keep-alive connection, then from
--clients processes at once. Every submit is acknowledged only once its job
is committed. Prints each store's medians, PostgreSQL / SQLite ratios and
the load average as JSON.

    python bench/submit_stores.py [--jobs 1000] [--clients 8] [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from submit import Controller, one_client_http_client, processes_submit  # noqa: E402

from gpud.testing.pg_server import Server  # noqa: E402


def measure(root: Path, name: str, server: Server | None, jobs: int, clients: int) -> dict:
    """Fresh controllers on SQLite (``server`` None) or each on a new database of ``server``: jobs/s from one
    client, then from ``clients``."""
    rates = []
    for how, submit in (("one", one_client_http_client), ("many", lambda c, n: processes_submit(c, n, clients))):
        url = server.database() if server is not None else None
        ctrl = Controller(root, f"{name}-{how}", store=url)
        try:
            rates.append(submit(ctrl, jobs))
        finally:
            ctrl.stop()
            if server is not None and url is not None:
                server.drop(url)
    return {"one_client_jobs_per_s": rates[0], "clients_jobs_per_s": rates[1], "load_1m": os.getloadavg()[0]}


def main() -> int:
    """Run the submits on both stores, alternating, and print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs per measure (default 1000)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    parser.add_argument("--repeat", type=int, default=3, help="measures of each store (default 3)")
    parser.add_argument("--quick", action="store_true", help="200 jobs, one measure of each: a smoke test")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.repeat = min(args.jobs, 200), 1
    runs: dict[str, list[dict]] = {"sqlite": [], "postgresql": []}
    server = Server(durable=True)
    try:
        with tempfile.TemporaryDirectory(prefix="gpud-submit-stores-") as tmp:
            root = Path(tmp)
            for attempt in range(max(1, args.repeat)):
                runs["sqlite"].append(measure(root, f"sqlite-{attempt}", None, args.jobs, args.clients))
                runs["postgresql"].append(measure(root, f"pg-{attempt}", server, args.jobs, args.clients))
    finally:
        server.stop()
    medians = {side: {key: round(statistics.median(run[key] for run in found), 1)
                      for key in ("one_client_jobs_per_s", "clients_jobs_per_s")} | {
                          "one_client_each": [round(run["one_client_jobs_per_s"], 1) for run in found],
                          "clients_each": [round(run["clients_jobs_per_s"], 1) for run in found],
                          "load_1m_each": [round(run["load_1m"], 2) for run in found]}
               for side, found in runs.items()}
    ratio = {key: round(medians["postgresql"][key] / medians["sqlite"][key], 3)
             for key in ("one_client_jobs_per_s", "clients_jobs_per_s")}
    print(json.dumps({"jobs": args.jobs, "clients": args.clients, "repeat": args.repeat,
                      "machine_cpus": os.cpu_count(), **medians, "postgresql_over_sqlite": ratio}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
