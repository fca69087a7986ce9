"""``gpuctl queue`` and ``gpuctl history``: jobs waiting and running, and jobs that ended."""

from __future__ import annotations

import time

from gpud.cli import render
from gpud.cli.common import UsageError, client, print_json
from gpud.cli.options import Options, Verb

TYPE_CHECKING = False  # argparse is imported only for help, errors and `gpuctl history`
if TYPE_CHECKING:
    import argparse

STATES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL")
SHORT_STATES = {"PD": "PENDING", "R": "RUNNING", "CD": "COMPLETED", "F": "FAILED", "CA": "CANCELLED",
                "TO": "TIMEOUT", "PR": "PREEMPTED", "NF": "NODE_FAIL"}
NAME_WIDTH = 24
# The job fields each table shows or folds arrays by: asked for alone, the answer is a fraction of every job
# object, quicker for the controller to write and for gpuctl to read (--json keeps the whole objects).
QUEUE_FIELDS = ("id", "name", "user", "project", "state", "reason", "elapsed_s", "started", "ended", "gpus",
                "gpu_memory_gib", "tasks", "nodes", "array_id", "array_index")
START_FIELDS = ("id", "name", "user", "project", "state", "gpus", "gpu_memory_gib", "tasks", "submitted",
                "estimated_start", "reserved_start", "start_nodes", "no_estimate")

QUEUE_DESCRIPTION = """\
List jobs, as squeue does: pending and running jobs of every user by default,
with the reason each pending job waits (`gpuctl why JOB` explains it in full).
TIME is how long a job has run; GPUS is per task, as TASKSxGPUS for gangs.
An array job is one line, 42_[0-49], with its jobs counted by state
(`gpuctl show 42` lists them); --array prints one line per job, as 42_7.
--start lists pending jobs with the time each is expected to start, as
squeue --start does, and the nodes where room is held for it (a reservation).
"""

QUEUE_EXAMPLES = """\
  gpuctl queue
  gpuctl queue --me
  gpuctl queue --array                    # every job of an array on its own line
  gpuctl queue --project vision --state PENDING
  gpuctl queue --all --user alice         # every state, finished jobs too
  gpuctl queue --start                    # when each pending job is expected to start
  gpuctl queue --json | jq '.jobs[].id'
"""

HISTORY_DESCRIPTION = """\
List finished jobs, newest first, as sacct does: when they started and ended,
where they ran, the GPU-hours they used and how they ended (exit code or
signal). --since takes a time ago (2h, 1d, 90m) or a date (2024-05-01,
"2024-05-01 14:00").
"""

HISTORY_EXAMPLES = """\
  gpuctl history --me
  gpuctl history --since 1d --project vision
  gpuctl history --user alice --limit 20
  gpuctl history --since 2024-05-01 --json
"""


def add_parsers(subparsers) -> None:
    """Register ``queue`` and ``history`` on the gpuctl sub-command parser."""
    from gpud.cli.parsing import add_verb
    from gpud.cli.units import parse_when
    VERB.add_to(subparsers)
    history = add_verb(subparsers, "history", help="list finished jobs", description=HISTORY_DESCRIPTION,
                       examples=HISTORY_EXAMPLES, func=run_history, json_flag=True)
    _add_filters(history)
    history.add_argument("-S", "--since", type=parse_when, metavar="WHEN", help="only jobs that ended since then")
    history.add_argument("-l", "--limit", type=int, metavar="N", help="at most N jobs")


def _add_filters(parser: argparse.ArgumentParser | Options) -> None:
    parser.add_argument("-u", "--user", help="only this user's jobs")
    parser.add_argument("-p", "--project", help="only this project's jobs")
    parser.add_argument("--me", action="store_true", help="only my jobs")


def run_queue(args: argparse.Namespace) -> int:
    """Print the job list (pending and running unless --all or --state)."""
    api = client()
    fields = None if args.json else ",".join(START_FIELDS if args.start else QUEUE_FIELDS)
    answer = api.get_all("jobs", {"state": ",".join(args.state) if args.state else None, "all": args.all,
                                  "user": _user(api, args), "project": args.project, "fields": fields})
    if args.json:
        print_json(answer)
        return 0
    jobs = answer.get("jobs", [])
    if args.start:
        print(start_table([j for j in jobs if j.get("state") == "PENDING"], time.time()))
        return 0
    print(queue_table(jobs if args.array else collapse_arrays(jobs, answer.get("arrays") or {}, time.time()),
                      time.time()))
    return 0


def queue_table(jobs: list[dict], now: float) -> str:
    """The squeue-like table of jobs (an array's row carries its own TIME text)."""
    return render.table(
        ["ID", "NAME", "USER", "PROJECT", "STATE", "TIME", "GPUS", "NODES", "REASON"],
        [[job.get("id"), _short(job.get("name")), job.get("user"), job.get("project"), job.get("state"),
          job.get("time_text") or render.elapsed(job, now), render.gpus(job), render.nodes(job),
          job.get("reason") or ""]
         for job in jobs])


def start_table(jobs: list[dict], now: float) -> str:
    """Pending jobs in the order they are expected to start (those with no estimate last), with when."""
    ordered = sorted(jobs, key=lambda j: (j.get("estimated_start") is None, j.get("estimated_start") or 0.0,
                                          j.get("submitted") or 0.0))
    return render.table(
        ["ID", "NAME", "USER", "PROJECT", "GPUS", "START", "NODES"],
        [[job.get("id"), _short(job.get("name")), job.get("user"), job.get("project"), render.gpus(job),
          render.when(job["estimated_start"], now) if job.get("estimated_start") is not None
          else render.start_text(job, now), ",".join(job.get("start_nodes") or []) or "-"]
         for job in ordered])


def collapse_arrays(jobs: list[dict], arrays: dict, now: float) -> list[dict]:
    """The listing with each array's jobs folded into one row where its first job was.

    The row's id is ``42_[0-9,12]`` (the indices listed), its state
    RUNNING while one runs, its reason the counts by state (from ``arrays``,
    which counts ended jobs too) and why its first pending job waits.
    """
    groups: dict[str, list[dict]] = {}
    for job in jobs:
        if job.get("array_id") is not None:
            groups.setdefault(job["array_id"], []).append(job)
    rows, done = [], set()
    for job in jobs:
        array_id = job.get("array_id")
        if array_id is None:
            rows.append(job)
            continue
        if array_id in done:
            continue
        done.add(array_id)
        members = sorted(groups[array_id], key=lambda j: j.get("array_index") or 0)
        states = (arrays.get(array_id) or {}).get("states") or _counts(members)
        running = [j for j in members if j.get("state") == "RUNNING"]
        pending = next((j for j in members if j.get("state") == "PENDING"), None)
        reason = render.counts_text(states)
        if pending is not None and pending.get("reason"):
            reason += f"; {pending['id']}: {pending['reason']}"
        longest = max((render.elapsed(j, now) for j in running), key=lambda t: (len(t), t), default="0:00")
        rows.append({**members[0], "id": f"{array_id}_[{_ranges([j.get('array_index') for j in members])}]",
                     "state": "RUNNING" if running else members[0].get("state"), "time_text": longest,
                     "nodes": [n for j in running for n in j.get("nodes") or []], "reason": reason})
    return rows


def _counts(members: list[dict]) -> dict[str, int]:
    counts: dict = {}  # by the answer's state as it is (typing is not imported: gpuctl starts faster)
    for job in members:
        counts[job.get("state")] = counts.get(job.get("state"), 0) + 1
    return counts


def _ranges(indices: list) -> str:
    """``0-9,12,15-16`` for the indices 0..9, 12, 15, 16."""
    numbers = sorted(i for i in indices if isinstance(i, int))
    parts: list[str] = []
    start = prev = None
    for n in numbers + [None]:
        if prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = n
    return ",".join(parts)


def run_history(args: argparse.Namespace) -> int:
    """Print finished jobs, newest first."""
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be at least 1")
    api = client()
    answer = api.get("history", {"since": args.since, "user": _user(api, args), "project": args.project,
                                 "limit": args.limit})
    if args.json:
        print_json(answer)
        return 0
    print(history_table(answer.get("jobs", []), time.time()))
    return 0


def history_table(jobs: list[dict], now: float) -> str:
    """The sacct-like table of finished jobs."""
    return render.table(
        ["ID", "NAME", "USER", "PROJECT", "STATE", "STARTED", "ENDED", "ELAPSED", "NODES", "GPU-HOURS", "MAXRSS",
         "TOTALCPU", "EXIT"],
        [[job.get("id"), _short(job.get("name")), job.get("user"), job.get("project"), job.get("state"),
          render.stamp(job.get("started")), render.stamp(job.get("ended")),
          render.elapsed(job, now), render.nodes(job), render.gpu_hours(job.get("gpu_hours")),
          render.max_rss(job.get("max_rss_bytes")), render.cpu_time(job.get("cpu_s")), render.exit_status(job)]
         for job in jobs])


def _user(api, args: argparse.Namespace) -> str | None:
    if args.me and args.user:
        raise UsageError("give --me or --user, not both")
    if args.me:
        return api.get("whoami")["user"]
    return args.user


def _short(name) -> str:
    name = "" if name is None else str(name)
    return name if len(name) <= NAME_WIDTH else name[:NAME_WIDTH - 1] + "~"


def _states(text: str) -> list[str]:
    states = []
    for part in text.upper().split(","):
        state = SHORT_STATES.get(part.strip(), part.strip())
        if state not in STATES:
            import argparse  # argparse alone calls a type with a value it refuses; it is loaded then
            raise argparse.ArgumentTypeError(f"unknown state {part!r} (states: {', '.join(STATES)})")
        states.append(state)
    return states




# `gpuctl queue` as data, after the functions it names: argparse's parser and the quick reader are both made from it.
VERB = Verb("queue", help="list pending and running jobs", description=QUEUE_DESCRIPTION, examples=QUEUE_EXAMPLES,
            func=run_queue, json_flag=True)
_add_filters(VERB)
VERB.add_argument("-t", "--state", type=_states, metavar="STATE[,STATE]",
                  help=f"only these states ({', '.join(STATES)}; PD, R, ... work too)")
VERB.add_argument("-a", "--all", action="store_true", help="jobs in every state, finished ones too")
VERB.add_argument("-r", "--array", action="store_true", help="one line per job of an array, not per array")
VERB.add_argument("--start", action="store_true", help="pending jobs with their expected start times")
