"""squeue, sacct, scancel, scontrol and sinfo over gpud's API, printing what Slurm's own print."""

from __future__ import annotations

import sys

from gpud.cli.options import Options
from gpud.cli.slurm import fields

TYPE_CHECKING = False  # argparse is imported only where a command line needs it (not by a plain squeue)
if TYPE_CHECKING:
    import argparse
    from typing import Any


def _parser(prog: str) -> argparse.ArgumentParser:
    # -h means --noheader to squeue, sacct and sinfo, so argparse's own -h is off. gpuctl's Formatter knows
    # the terminal's width without importing shutil.
    import argparse

    from gpud.cli.parsing import Formatter
    parser = argparse.ArgumentParser(prog=prog, add_help=False, formatter_class=Formatter)
    parser.add_argument("--help", action="help", help="show this help and exit")
    return parser


def _warn_unknown(prog: str, extra: list[str]) -> None:
    for word in extra:
        if word.startswith("-"):
            print(f"{prog}: warning: {word} is not supported by gpud's {prog} and is ignored", file=sys.stderr)


def _ids(values: list[str] | None) -> list[str]:
    return [i.strip() for value in values or [] for i in value.split(",") if i.strip()]


def _client():
    from gpud.cli.common import client
    return client()


def _me(api) -> str:
    return str(api.get("whoami")["user"])


def _listed(api, users: list[str], all_states: bool, shown: set[str] | None = None) -> list[dict]:
    """The jobs of ``users`` (everyone's when none), active ones or all; with ``shown``, only those fields."""
    query = {"all": "1"} if all_states else {}
    if len(users) == 1:
        query["user"] = users[0]
    if shown:
        query["fields"] = ",".join(sorted(shown | {"user"}))
    jobs = api.get_all("jobs", query)["jobs"]
    return [job for job in jobs if not users or job.get("user") in users]


def _job_rows(api, job_id: str) -> list[dict]:
    """The jobs ``job_id`` names: one job, an array element, or every element of an array (none if unknown)."""
    from gpud.client import ApiError
    try:
        found = api.get(f"jobs/{job_id}")
    except ApiError as exc:
        if exc.status == 404:
            return []
        raise
    if not found.get("elements"):
        return [found]
    return [{**found, **element, "array_id": found["id"], "array_index": element.get("index")}
            for element in found["elements"]]


# squeue's options, declared once: a plain command line is read from this without argparse, any other by argparse.
SQUEUE = Options()
SQUEUE.add_argument("-j", "--jobs", action="append")
SQUEUE.add_argument("-u", "--user", action="append")
SQUEUE.add_argument("--me", action="store_true")
SQUEUE.add_argument("-t", "--states", "--state")
SQUEUE.add_argument("-p", "--partition")
SQUEUE.add_argument("-A", "--account")
SQUEUE.add_argument("-o", "--format")
SQUEUE.add_argument("-h", "--noheader", action="store_true")
SQUEUE.add_argument("-a", "--all", action="store_true")
SQUEUE.add_argument("-r", "--array", action="store_true")
SQUEUE.add_argument("-n", "--name")
SQUEUE.add_argument("--start", action="store_true")


def squeue(argv: list[str]) -> int:
    """``squeue``: waiting and running jobs, with ``-j``, ``-u``, ``--me``, ``-t``, ``-p``, ``-A``, ``-o``, ``-h``, and
    ``--start`` (waiting jobs with their expected start, the soonest first)."""
    args: Any = SQUEUE.quick_parse(argv)
    if args is None:  # --help, an unknown option (warned about and ignored, as gpud's squeue always did), ...
        args, extra = SQUEUE.apply(_parser("squeue")).parse_known_args(argv)
        _warn_unknown("squeue", extra)
    fmt = args.format or (fields.SQUEUE_START if args.start else fields.SQUEUE_DEFAULT)
    if args.start:  # as Slurm's: waiting jobs alone, the soonest to start first
        args.states = args.states or "PENDING"
    api = _client()
    users = _ids(args.user) + ([_me(api)] if args.me else [])
    if args.jobs:
        jobs = [row for job_id in _ids(args.jobs) for row in _job_rows(api, job_id)]
        jobs = [job for job in jobs if job.get("state") in ("PENDING", "RUNNING")]
        jobs = [job for job in jobs if not users or job.get("user") in users]
    else:
        filters = {"pool": args.partition, "project": args.account, "name": args.name}
        shown = fields.squeue_needs(fmt) | {"state"} | {name for name, given in filters.items() if given}
        if args.start:
            shown.add("estimated_start")
        jobs = _listed(api, users, all_states=False, shown=shown)
    if args.states:
        wanted = {_state_name(s) for s in args.states.split(",")}
        if "ALL" not in wanted:
            jobs = [job for job in jobs if job.get("state") in wanted]
    if args.partition:
        jobs = [job for job in jobs if fields.pool(job) in args.partition.split(",")]
    if args.account:
        jobs = [job for job in jobs if job.get("project") in args.account.split(",")]
    if args.name:
        jobs = [job for job in jobs if job.get("name") in args.name.split(",")]
    if args.start:
        jobs.sort(key=fields.start_order)
    lines = [] if args.noheader else [fields.squeue_line(fmt, None)]
    lines.extend(fields.squeue_line(fmt, job) for job in jobs)
    if lines:
        print("\n".join(lines))
    return 0


def _state_name(text: str) -> str:
    text = text.strip().upper()
    by_code = {code: name for name, code in fields.STATE_CODES.items()}
    return by_code.get(text, text)


def sacct(argv: list[str]) -> int:
    """``sacct``: jobs with their states and exit codes, ``-j``, ``--name``, ``-o``, ``--parsable2``, ``-n``, ``-X``,
    and the time window ``-S``/``-E`` (today's jobs by default, as Slurm's sacct)."""
    parser = _parser("sacct")
    parser.add_argument("-j", "--jobs", action="append")
    parser.add_argument("-u", "--user", action="append")
    parser.add_argument("-a", "--allusers", action="store_true")
    parser.add_argument("-o", "--format")
    parser.add_argument("-P", "--parsable2", action="store_true")
    parser.add_argument("-p", "--parsable", action="store_true")
    parser.add_argument("-n", "--noheader", action="store_true")
    parser.add_argument("-X", "--allocations", action="store_true")
    parser.add_argument("-s", "--state")
    parser.add_argument("-S", "--starttime")
    parser.add_argument("-E", "--endtime")
    parser.add_argument("-b", "--brief", action="store_true")
    parser.add_argument("--name")
    args, extra = parser.parse_known_args(argv)
    _warn_unknown("sacct", extra)
    names = ["JobID", "State", "ExitCode"] if args.brief else (
        fields.sacct_fields(args.format) if args.format else list(fields.SACCT_DEFAULT))
    since, until = _window(args)
    api = _client()
    if args.jobs:
        jobs = [row for job_id in _ids(args.jobs) for row in _job_rows(api, job_id)]
    else:
        users = [] if args.allusers else (_ids(args.user) or [_me(api)])
        jobs = _listed(api, users, all_states=True)
    if args.state:
        wanted = {_state_name(s) for s in args.state.split(",")}
        jobs = [job for job in jobs if job.get("state") in wanted]
    if args.name:
        jobs = [job for job in jobs if job.get("name") in args.name.split(",")]
    jobs = [job for job in jobs if _in_window(job, since, until)]
    rows = [[fields.SACCT_FIELDS[name.lower()](job) for name in names] for job in jobs]
    if args.parsable2 or args.parsable:
        end = "|" if args.parsable and not args.parsable2 else ""
        lines = [] if args.noheader else ["|".join(names) + end]
        lines.extend("|".join(row) + end for row in rows)
    else:
        widths = [max(10, len(name)) for name in names]
        lines = [] if args.noheader else [" ".join(n.rjust(w) for n, w in zip(names, widths)),
                                          " ".join("-" * w for w in widths)]
        lines.extend(" ".join(v[:w].rjust(w) for v, w in zip(row, widths)) for row in rows)
    if lines:
        print("\n".join(lines))
    return 0


def _window(args: argparse.Namespace) -> tuple[float | None, float | None]:
    """sacct's time window: from -S (by default today's midnight, or no bound with -j or -s) to -E (now)."""
    import time

    from gpud.cli.slurm.when import slurm_time
    now = time.time()
    if args.starttime is not None:
        start: float | None = slurm_time(args.starttime, now)
    else:
        start = None if args.jobs or args.state else slurm_time("today", now)
    return start, None if args.endtime is None else slurm_time(args.endtime, now)


def _in_window(job: dict, start: float | None, end: float | None) -> bool:
    """Whether the job was eligible or running at some moment from ``start`` to ``end`` (either may be open)."""
    submitted, ended = job.get("submitted"), job.get("ended")
    if end is not None and submitted is not None and submitted > end:
        return False
    return start is None or ended is None or ended >= start


def scancel(argv: list[str]) -> int:
    """``scancel ID...``: cancel jobs, array elements (``12_3``) or whole arrays; ``-u USER`` all of a user's."""
    parser = _parser("scancel")
    parser.add_argument("ids", nargs="*")
    parser.add_argument("-u", "--user")
    parser.add_argument("--me", action="store_true")
    parser.add_argument("-s", "--signal")
    parser.add_argument("-b", "--batch", action="store_true")
    parser.add_argument("-Q", "--quiet", action="store_true")
    parser.add_argument("-n", "--name", "--jobname")
    args, extra = parser.parse_known_args(argv)
    _warn_unknown("scancel", extra)
    api = _client()
    if args.signal and args.signal.upper().removeprefix("SIG") not in ("KILL", "TERM", "INT"):
        print(f"scancel: warning: gpud cannot send {args.signal} to a job; nothing is done", file=sys.stderr)
        return 0
    ids = _expand_ids(args.ids)
    if args.user or args.me or (args.name and not ids):
        user = _me(api) if args.me else args.user
        ids += [job["id"] for job in _listed(api, [user] if user else [], all_states=False)
                if not args.name or job.get("name") == args.name]
    if not ids:
        print("scancel: error: no job identification provided", file=sys.stderr)
        return 1
    from gpud.client import ApiError
    status = 0
    for job_id in ids:
        try:
            api.post(f"jobs/{job_id}/cancel")
        except ApiError as exc:
            if exc.status == 409:  # already ended: scancel says nothing
                continue
            print(f"scancel: error: Kill job error on job id {job_id}: {exc.message}", file=sys.stderr)
            status = 1
    return status


def _expand_ids(words: list[str]) -> list[str]:
    """Job ids, with Slurm's array forms ``12_[1-3,5]`` written out one element each."""
    out: list[str] = []
    for word in words:
        for part in _split_outside_brackets(word):
            base, sep, rest = part.partition("_[")
            if not sep:
                out.append(part)
                continue
            for item in rest.rstrip("]").split("%")[0].split(","):
                low, _, high = item.partition("-")
                out.extend(f"{base}_{i}" for i in range(int(low), int(high or low) + 1))
    return out


def _split_outside_brackets(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p for p in parts if p]


def scontrol(argv: list[str]) -> int:
    """``scontrol show job ID``, ``scontrol show hostnames [LIST]``, ``scontrol requeue|hold|release ID``."""
    words = [w for w in argv if not w.startswith("-")]
    if len(words) >= 2 and words[0] == "show" and words[1] in ("hostnames", "hostname"):
        import os
        from gpud.hostlist import expand_hostlist
        text = words[2] if len(words) > 2 else os.environ.get("SLURM_JOB_NODELIST", "")
        for name in expand_hostlist(text):
            print(name)
        return 0
    if len(words) >= 2 and words[0] == "show" and words[1] in ("job", "jobs", "jobid"):
        api = _client()
        rows = [row for job_id in words[2:] for row in _job_rows(api, job_id)] if len(words) > 2 \
            else _listed(api, [], all_states=False)
        if not rows and len(words) > 2:
            print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
            return 1
        print("\n\n".join(_show_job(job) for job in rows))
        return 0
    if words and words[0] in CHANGES:
        return _change(words[0], words[1:])
    print(f"scontrol: error: gpud's scontrol knows `show job [ID]`, `show hostnames [LIST]`, `requeue ID`, "
          f"`hold ID` and `release ID`, not {' '.join(argv) or 'nothing'}", file=sys.stderr)
    return 1


# scontrol's verbs that change jobs, and gpud's for each.
CHANGES = {"requeue": "requeue", "hold": "hold", "release": "release", "uhold": "hold"}


def _change(verb: str, words: list[str]) -> int:
    """``scontrol requeue|hold|release ID[,ID...]``: each job (an array id: its elements) as gpuctl's verb does;
    1 when any was refused, with Slurm's words."""
    from gpud.client import ApiError, job_path
    ids = _ids(words)
    if not ids:
        print(f"scontrol: error: {verb}: a job id is required", file=sys.stderr)
        return 1
    api = _client()
    status = 0
    for job_id in ids:
        try:
            api.post(job_path(job_id, CHANGES[verb]))
        except ApiError as exc:
            print(f"scontrol: error: {verb} {job_id}: {exc.message}", file=sys.stderr)
            status = 1
    return status


def _show_job(job: dict) -> str:
    pairs = [
        ("JobId", str(job["id"])), ("JobName", job.get("name") or ""),
        ("UserId", job.get("user") or ""), ("Account", job.get("project") or ""),
        ("QOS", str(job.get("priority_class") or "")), ("Priority", str(job.get("priority") or 0)),
        ("JobState", job.get("state") or ""), ("Reason", (job.get("reason") or "None").replace(" ", "_")),
        ("Requeue", "1" if job.get("requeue", True) else "0"), ("Restarts", str(job.get("restart_count") or 0)),
        ("ExitCode", fields.exit_code(job)), ("RunTime", fields.clock(job.get("elapsed_s") or 0)),
        ("TimeLimit", fields.clock(job.get("time_limit_s"))),
        # A waiting job's StartTime is when it is expected to start, as Slurm's.
        ("SubmitTime", fields.stamp(job.get("submitted"))), ("StartTime", fields.start(job, "Unknown")),
        ("EndTime", fields.stamp(job.get("ended"))), ("Partition", fields.pool(job)),
        ("NodeList", fields.nodelist(job) if job.get("nodes") else "(null)"),
        ("NumNodes", fields._node_count(job)), ("NumTasks", str(job.get("tasks") or 1)),
        ("CPUs/Task", f"{job.get('cpus') or 1:g}"), ("TRES", fields._tres(job)),
        ("WorkDir", job.get("workdir") or ""),
    ]
    if job.get("array_id"):
        pairs[1:1] = [("ArrayJobId", str(job["array_id"])), ("ArrayTaskId", str(job.get("array_index")))]
    lines, line = [], "  "
    for key, value in pairs:
        item = f"{key}={value}"
        if len(line) + len(item) > 90 and line.strip():
            lines.append(line.rstrip())
            line = "   "
        line += item + " "
    lines.append(line.rstrip())
    return "\n".join(lines).lstrip()


def sinfo(argv: list[str]) -> int:
    """``sinfo``: each pool (partition) with its nodes by state, as Slurm's default table; ``-h`` drops the heading."""
    parser = _parser("sinfo")
    parser.add_argument("-h", "--noheader", action="store_true")
    parser.add_argument("-p", "--partition")
    parser.add_argument("-N", "--Node", action="store_true")
    args, extra = parser.parse_known_args(argv)
    _warn_unknown("sinfo", extra)
    from gpud.hostlist import hostlist
    nodes = _client().get("nodes")["nodes"]
    groups: dict[tuple[str, str], list[str]] = {}
    for node in nodes:
        state = _node_state(node)
        if args.partition and node.get("pool") not in args.partition.split(","):
            continue
        key = (node.get("pool") or "default", state)
        groups.setdefault(key, []).append(node["name"])
    lines = [] if args.noheader else ["PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST"]
    for (pool, state), names in sorted(groups.items()):
        lines.append(f"{pool:<9} {'up':>5} {'infinite':>10} {len(names):>6} {state:>6} {hostlist(names)}")
    if lines:
        print("\n".join(lines))
    return 0


def _node_state(node: dict) -> str:
    """A node's state in sinfo's words: down, drain(ing), idle, mix (partly used) or alloc (all GPUs used)."""
    state = node.get("state")
    if state in ("down", "unknown"):
        return "down"
    if state == "drained":
        return "drain"
    if state == "draining":
        return "drng"
    gpus = len(node.get("gpus") or [])
    if not node.get("gpus_used") and not node.get("cpus_used"):
        return "idle"
    return "alloc" if gpus and not node.get("gpus_idle") else "mix"
