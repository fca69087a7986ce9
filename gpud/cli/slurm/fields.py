"""How Slurm's commands write a job's fields: state codes, exit codes, times, and squeue's ``%`` formats.

Pure functions over the API's job objects (docs/api.md), so each command's
output is made in one place and tested without a cluster.
"""

from __future__ import annotations

import time

from gpud.hostlist import hostlist

TYPE_CHECKING = False  # typing (and collections, under collections.abc) is not imported at run time: squeue starts faster
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

STATE_CODES = {"PENDING": "PD", "RUNNING": "R", "COMPLETED": "CD", "FAILED": "F", "CANCELLED": "CA",
               "TIMEOUT": "TO", "PREEMPTED": "PR", "NODE_FAIL": "NF", "OUT_OF_MEMORY": "OOM"}
SQUEUE_DEFAULT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
SQUEUE_START = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %20Y %R"  # squeue --start


def exit_code(job: dict) -> str:
    """sacct's ExitCode, ``code:signal``: 0:0 for success, 1:0 for exit 1, 0:9 for a task killed by SIGKILL."""
    return f"{job.get('exit_code') or 0}:{job.get('term_signal') or 0}"


def clock(seconds: float | None, squeue: bool = False) -> str:
    """A duration as Slurm writes it: ``D-HH:MM:SS`` (sacct), or squeue's shorter ``M:SS``/``H:MM:SS``."""
    if seconds is None:
        return "UNLIMITED"
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if squeue and not hours:
        return f"{minutes}:{secs:02d}"
    if squeue:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"


def stamp(epoch: float | None, missing: str = "Unknown") -> str:
    """A time as Slurm prints it (local time, ``2026-11-29T04:21:03``), or ``missing``."""
    if not epoch:
        return missing
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def nodelist(job: dict) -> str:
    """The nodes a job runs (or ran) on, in hostlist form; ``None assigned`` when it has none."""
    nodes = job.get("nodes") or []
    return hostlist(sorted(nodes)) if nodes else "None assigned"


def why(job: dict) -> str:
    """squeue's ``%r``: a waiting job's reason in short (its leading clause, ``reason_short``), else ``None``."""
    return (job.get("reason_short") or "None") if job.get("state") == "PENDING" else "None"


def where_or_why(job: dict) -> str:
    """squeue's ``%R``: the node list of a running job, the reason in short in parentheses of a waiting one."""
    return f"({why(job)})" if job.get("state") == "PENDING" else nodelist(job)


def start(job: dict, missing: str = "N/A") -> str:
    """squeue's ``%S``: when a running job started, when a waiting one is expected to (``missing`` when there is
    no estimate)."""
    if job.get("state") == "PENDING":
        return stamp(job.get("estimated_start"), missing)
    return stamp(job.get("started"), missing)


def start_order(job: dict) -> tuple[bool, float]:
    """squeue ``--start``'s order: the earliest expected start first, jobs without an estimate last."""
    estimate = job.get("estimated_start")
    return (estimate is None, estimate or 0.0)


def pool(job: dict) -> str:
    """The job's pool, Slurm's partition (``default`` when it names none)."""
    return job.get("pool") or "default"


def _gres(job: dict) -> str:
    gpus = job.get("gpus") or 0
    return f"gres/gpu:{gpus:g}" if gpus else "N/A"


def _array_id(job: dict) -> str:
    return str(job.get("array_id") or job["id"])


def _array_index(job: dict) -> str:
    index = job.get("array_index")
    return "N/A" if index is None else str(index)


def _node_count(job: dict) -> str:
    return str(len(job.get("nodes") or []) or job.get("tasks") or 1)


# squeue's %-letters (squeue(1), "-o <output_format>") and what each shows of a job.
SQUEUE_FIELDS: dict[str, Callable[[dict], str]] = {
    "i": lambda j: str(j["id"]), "A": _array_id, "F": _array_id, "K": _array_index,
    "j": lambda j: j.get("name") or "", "u": lambda j: j.get("user") or "",
    "t": lambda j: STATE_CODES.get(j.get("state", ""), j.get("state", "")), "T": lambda j: j.get("state") or "",
    "P": pool, "a": lambda j: j.get("project") or "", "q": lambda j: str(j.get("priority_class") or ""),
    "M": lambda j: clock(j.get("elapsed_s") or 0, squeue=True), "l": lambda j: clock(j.get("time_limit_s"), True),
    "L": lambda j: "NOT_SET" if j.get("time_limit_s") is None or j.get("state") != "RUNNING"
    else clock(max(0.0, j["time_limit_s"] - (j.get("elapsed_s") or 0)), True),
    "D": _node_count, "C": lambda j: f"{(j.get('cpus') or 1) * (j.get('tasks') or 1):g}",
    "c": lambda j: f"{j.get('cpus') or 1:g}", "m": lambda j: f"{round((j.get('memory_gib') or 0) * 1024)}M",
    "R": where_or_why, "r": why, "N": lambda j: nodelist(j) if j.get("nodes") else "",
    "b": _gres, "V": lambda j: stamp(j.get("submitted")), "S": start,
    "e": lambda j: stamp(j.get("ended"), "N/A"), "Z": lambda j: j.get("workdir") or "",
    "o": lambda j: " ".join(j.get("command") or []) or "(script)", "Q": lambda j: str(j.get("priority") or 0),
    "p": lambda j: f"{(j.get('priority') or 0) / 1000:.8f}", "k": lambda j: "(null)", "n": lambda j: "",
    "Y": lambda j: hostlist(sorted(j["start_nodes"])) if j.get("start_nodes") else "(null)", "%": lambda j: "%",
}
# The job fields each %-letter reads: squeue asks the controller for only those its format shows.
SQUEUE_NEEDS: dict[str, tuple[str, ...]] = {
    "i": ("id",), "A": ("array_id", "id"), "F": ("array_id", "id"), "K": ("array_index",), "j": ("name",),
    "u": ("user",), "t": ("state",), "T": ("state",), "P": ("pool",), "a": ("project",), "q": ("priority_class",),
    "M": ("elapsed_s",), "l": ("time_limit_s",), "L": ("time_limit_s", "state", "elapsed_s"), "D": ("nodes", "tasks"),
    "C": ("cpus", "tasks"), "c": ("cpus",), "m": ("memory_gib",), "R": ("state", "reason_short", "nodes"),
    "r": ("state", "reason_short"), "N": ("nodes",), "b": ("gpus",), "V": ("submitted",),
    "S": ("state", "started", "estimated_start"), "e": ("ended",), "Z": ("workdir",), "o": ("command",), "Q": ("priority",), "p": ("priority",), "k": (), "n": (),
    "Y": ("start_nodes",), "%": (),
}
# The heading squeue prints over each %-letter.
SQUEUE_HEADINGS = {"i": "JOBID", "A": "ARRAY_JOB_ID", "F": "ARRAY_JOB_ID", "K": "ARRAY_TASK_ID", "j": "NAME",
                   "u": "USER", "t": "ST", "T": "STATE", "P": "PARTITION", "a": "ACCOUNT", "q": "QOS",
                   "M": "TIME", "l": "TIME_LIMIT", "L": "TIME_LEFT", "D": "NODES", "C": "CPUS", "c": "MIN_CPUS",
                   "m": "MIN_MEMORY", "R": "NODELIST(REASON)", "r": "REASON", "N": "NODELIST",
                   "b": "TRES_PER_NODE", "V": "SUBMIT_TIME", "S": "START_TIME", "e": "END_TIME",
                   "Z": "WORK_DIR", "o": "COMMAND", "Q": "PRIORITY", "p": "PRIORITY", "k": "COMMENT",
                   "n": "REQ_NODES", "Y": "SCHEDNODES", "%": "%"}


def squeue_line(fmt: str, job: dict | None) -> str:
    """One line of squeue's ``-o`` format ``fmt`` for ``job``, or its heading when ``job`` is None.

    ``%.10M`` right-justifies in 10 columns, ``%10M`` left-justifies, a bare
    ``%M`` takes what it needs; an unknown letter raises ValueError.
    """
    out: list[str] = []
    pos = 0
    for start, end, right, width, letter in format_items(fmt):
        out.append(fmt[pos:start])
        pos = end
        if letter not in SQUEUE_FIELDS:
            raise ValueError(f"squeue: unknown format field %{letter}")
        text = SQUEUE_HEADINGS[letter] if job is None else SQUEUE_FIELDS[letter](job)
        if width:
            size = int(width)
            text = text[:size].rjust(size) if right else text[:size].ljust(size)
        out.append(text)
    out.append(fmt[pos:])
    return "".join(out)


def squeue_needs(fmt: str) -> set[str]:
    """The job fields squeue's ``-o`` format ``fmt`` shows (an unknown letter needs none: squeue_line refuses it)."""
    return {name for *_, letter in format_items(fmt) for name in SQUEUE_NEEDS.get(letter, ())}


def format_items(fmt: str) -> Iterator[tuple[int, int, bool, str, str]]:
    """Each ``%`` item of squeue's format ``fmt``, in order: where it starts and ends, whether it is right-justified
    (``%.``), its width (digits, maybe none) and its letter (A-Z, a-z or ``%``); a ``%`` that starts no item is
    text. The items the pattern ``%(\\.)?(\\d*)([A-Za-z%])`` finds, read without importing re."""
    pos = fmt.find("%")
    while pos >= 0:
        begin = pos + 1 + (fmt[pos + 1:pos + 2] == ".")
        end = begin
        while end < len(fmt) and fmt[end].isdecimal():
            end += 1
        letter = fmt[end:end + 1]
        if letter == "%" or (letter.isascii() and letter.isalpha()):
            yield pos, end + 1, begin > pos + 1, fmt[begin:end], letter
            pos = fmt.find("%", end + 1)
        else:
            pos = fmt.find("%", pos + 1)


# sacct's fields (sacct --helpformat), lower-cased, and what each shows of a job.
SACCT_FIELDS: dict[str, Callable[[dict], str]] = {
    "jobid": lambda j: str(j["id"]), "jobidraw": lambda j: str(j["id"]), "jobname": lambda j: j.get("name") or "",
    "state": lambda j: j.get("state") or "", "exitcode": exit_code, "derivedexitcode": exit_code,
    "nodelist": nodelist, "partition": pool, "account": lambda j: j.get("project") or "",
    "user": lambda j: j.get("user") or "", "alloccpus": lambda j: f"{(j.get('cpus') or 1) * (j.get('tasks') or 1):g}",
    "ncpus": lambda j: f"{(j.get('cpus') or 1) * (j.get('tasks') or 1):g}", "nnodes": _node_count,
    "ntasks": lambda j: str(j.get("tasks") or 1), "elapsed": lambda j: clock(j.get("elapsed_s") or 0),
    "elapsedraw": lambda j: str(int(j.get("elapsed_s") or 0)), "timelimit": lambda j: clock(j.get("time_limit_s")),
    "submit": lambda j: stamp(j.get("submitted")), "start": lambda j: stamp(j.get("started")),
    "end": lambda j: stamp(j.get("ended")), "workdir": lambda j: j.get("workdir") or "",
    "restarts": lambda j: str(j.get("restart_count") or 0), "reason": lambda j: j.get("reason") or "None",
    "reqmem": lambda j: f"{round((j.get('memory_gib') or 0) * 1024 * (j.get('tasks') or 1))}M",
    "maxrss": lambda j: f"{(j.get('max_rss_bytes') or 0) // 1024}K" if j.get("max_rss_bytes") else "",
    "totalcpu": lambda j: clock(j.get("cpu_s") or 0), "alloctres": lambda j: _tres(j), "reqtres": lambda j: _tres(j),
    "qos": lambda j: str(j.get("priority_class") or ""), "priority": lambda j: str(j.get("priority") or 0),
    "comment": lambda j: "", "cluster": lambda j: "gpud", "qostime": lambda j: "",
}
SACCT_DEFAULT = ("JobID", "JobName", "Partition", "Account", "AllocCPUS", "State", "ExitCode")


def _tres(job: dict) -> str:
    tasks = job.get("tasks") or 1
    parts = [f"cpu={(job.get('cpus') or 1) * tasks:g}", f"mem={round((job.get('memory_gib') or 0) * 1024 * tasks)}M",
             f"node={_node_count(job)}"]
    if job.get("gpus"):
        parts.append(f"gres/gpu={(job['gpus'] or 0) * tasks:g}")
    return ",".join(parts)


def sacct_fields(spec: str) -> list[str]:
    """The field names of sacct's ``-o``/``--format`` (``JobID,State%20``); ValueError for an unknown one."""
    names = []
    for item in spec.split(","):
        name = item.strip().split("%")[0]
        if not name:
            continue
        if name.lower() not in SACCT_FIELDS:
            raise ValueError(f"Invalid field requested: \"{name}\"")
        names.append(name)
    return names
