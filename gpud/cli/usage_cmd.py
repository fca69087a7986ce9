"""``gpuctl usage`` (decayed usage and standing, as Slurm's sshare) and ``gpuctl report`` (as sreport)."""

from __future__ import annotations

import argparse
import csv
import io

from gpud.cli import render
from gpud.cli.common import client, print_json
from gpud.cli.parsing import add_verb
from gpud.cli.units import format_duration, format_number, parse_when

GROUPINGS = ("user", "project", "department", "node")

USAGE_DESCRIPTION = """\
Show, per node pool, each department, the projects inside it and the users
of each project: the GPU quota, the fair share of the last scheduling cycle,
the decayed usage in GPU-hours (and CPU-hours and memory GiB-hours), and the
standing.

Usage is charged while jobs run (GPUs held: a fraction counts its fraction, a
GPU-memory slice its share of the GPU) and decays with the policy's
usage_half_life (7 days unless set): an hour used a half-life ago counts half
an hour now.

STANDING = entitlement share / usage share, among siblings (departments of a
pool, projects of a department, users of a project). A queue's entitlement is
its GPU quota (its over-quota weight when no sibling has a quota); a
project's users are entitled equally. Above 1: it used less than its share;
below 1: more; "-": it used nothing. Users other than you are shown to
admins only.
"""

USAGE_EXAMPLES = """\
  gpuctl usage
  gpuctl usage -p vision
  gpuctl usage -u alice --pool h100
  gpuctl usage --json | jq '.rows[] | select(.level == "project")'
"""

REPORT_DESCRIPTION = """\
Account for jobs over a window, grouped by user, project, department or node:
GPU-hours, CPU-hours (CPUs allocated times time run), jobs, mean and 95th
percentile wait (submit to start), and GPU efficiency: the mean utilisation
of the jobs' GPUs and the most GPU memory a job held on one GPU, as sampled
by the nodes' GPU backend (NVML) while the jobs ran ("-" where nothing was
sampled).

A job counts in the window it ended in; jobs still running count, with their
use so far, when the window reaches now (no --until). --since and --until
take a date (2026-11-01, '2026-11-01 14:00', local time) or a time ago
(2h, 7d). Admins see every job; others their own.
"""

REPORT_EXAMPLES = """\
  gpuctl report                                   # by user, the last 30 days
  gpuctl report --by project --since 2026-11-01 --until 2026-12-01
  gpuctl report --by node --since 7d --csv > nodes.csv
  gpuctl report --by department --json
"""


def add_parsers(subparsers) -> None:
    """Register ``usage`` and ``report`` on the gpuctl sub-command parser."""
    usage = add_verb(subparsers, "usage", help="decayed usage and fair-share standing (as sshare)",
                     description=USAGE_DESCRIPTION, examples=USAGE_EXAMPLES, func=run_usage, json_flag=True)
    usage.add_argument("-p", "--project", help="only this project (and its department)")
    usage.add_argument("-u", "--user", help="only this user (admins: anyone; others: themselves)")
    usage.add_argument("--pool", help="only this node pool")
    report = add_verb(subparsers, "report", help="GPU-hours, waits and GPU efficiency over a window (as sreport)",
                      description=REPORT_DESCRIPTION, examples=REPORT_EXAMPLES, func=run_report, json_flag=True)
    report.add_argument("--by", type=_grouping, default="user", metavar="GROUP",
                        help=f"group by {', '.join(GROUPINGS)} (user)")
    report.add_argument("-S", "--since", type=parse_when, metavar="WHEN", help="jobs that ended since then (30 days ago)")
    report.add_argument("-E", "--until", type=parse_when, metavar="WHEN", help="and before then (now)")
    report.add_argument("-p", "--project", help="only this project's jobs")
    report.add_argument("-u", "--user", help="only this user's jobs")
    report.add_argument("--csv", action="store_true", help="print comma-separated values with a header row")


def _grouping(text: str) -> str:
    if text not in GROUPINGS:
        raise argparse.ArgumentTypeError(f"cannot group by {text!r}: use one of {', '.join(GROUPINGS)}")
    return text


def run_usage(args: argparse.Namespace) -> int:
    """Print the usage table."""
    query = {"project": args.project, "user": args.user, "pool": args.pool}
    answer = client().get("usage", {k: v for k, v in query.items() if v is not None})
    if args.json:
        print_json(answer)
    else:
        print(usage_table(answer.get("rows", [])))
    return 0


def usage_table(rows: list[dict]) -> str:
    """Departments, their projects indented under them, and each project's users under it."""
    lines = []
    for row in rows:
        indent = {"department": "", "project": "  ", "user": "    "}.get(row.get("level") or "", "")
        label = row.get("user") if row.get("level") == "user" else row.get("name")
        lines.append([row.get("pool"), indent + str(label), row.get("level"), _num(row.get("quota")),
                      _num(row.get("fair_share")), _hours(row.get("gpu_hours")), _hours(row.get("cpu_hours")),
                      _hours(row.get("memory_gib_hours")), _share(row.get("entitlement_share")),
                      _share(row.get("usage_share")), _num(row.get("standing"))])
    return render.table(["POOL", "NAME", "LEVEL", "QUOTA", "FAIR SHARE", "GPU-H", "CPU-H", "MEM-GIB-H",
                         "ENTITLED", "USED", "STANDING"], lines)


def run_report(args: argparse.Namespace) -> int:
    """Print the report as a table, JSON or CSV."""
    if args.since is not None and args.until is not None and args.until <= args.since:
        from gpud.cli.common import UsageError
        raise UsageError("--until must be after --since")
    query = {"by": args.by, "since": args.since, "until": args.until, "project": args.project, "user": args.user}
    answer = client().get("report", {k: v for k, v in query.items() if v is not None})
    rows = answer.get("rows", [])
    if args.json:
        print_json(answer)
    elif args.csv:
        print(report_csv(rows, args.by), end="")
    else:
        print(report_table(rows, args.by))
    return 0


# New fields go last, so that scripts reading the CSV by position keep working.
REPORT_FIELDS = ("gpu_hours", "cpu_hours", "jobs", "mean_wait_s", "p95_wait_s", "gpu_utilization",
                 "gpu_memory_peak_gib", "lost_gpu_hours")


def report_table(rows: list[dict], by: str) -> str:
    """The report as an aligned table."""
    lines = [[row.get(by), _hours(row.get("gpu_hours")), _hours(row.get("lost_gpu_hours")), _hours(row.get("cpu_hours")),
              row.get("jobs"),
              format_duration(row.get("mean_wait_s")) if row.get("mean_wait_s") is not None else "-",
              format_duration(row.get("p95_wait_s")) if row.get("p95_wait_s") is not None else "-",
              "-" if row.get("gpu_utilization") is None else f"{row['gpu_utilization']:.0f}%",
              "-" if row.get("gpu_memory_peak_gib") is None else f"{row['gpu_memory_peak_gib']:.1f} GiB"]
             for row in rows]
    return render.table([by.upper(), "GPU-H", "LOST GPU-H", "CPU-H", "JOBS", "MEAN WAIT", "P95 WAIT", "GPU UTIL", "GPU MEM PEAK"],
                        lines)


def report_csv(rows: list[dict], by: str) -> str:
    """The report as CSV: a header row of field names, then one row per group, numbers unrounded."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([by, *REPORT_FIELDS])
    for row in rows:
        writer.writerow([row.get(by), *("" if row.get(f) is None else row.get(f) for f in REPORT_FIELDS)])
    return out.getvalue()


def _num(value: float | None) -> str:
    return "-" if value is None else format_number(round(value, 2))


def _hours(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0 or value >= 10:
        return f"{value:.1f}" if value else "0"
    return f"{value:.3g}"  # three significant digits: a few GPU-seconds still show


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"
