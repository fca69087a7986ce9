"""Plain-text tables for people, the way squeue and sinfo print them, and the cells that go in them."""

from __future__ import annotations

import time

from gpud.cli.units import format_duration, format_number, format_size_gib

TYPE_CHECKING = False  # typing (and collections, under collections.abc) is not imported at run time: gpuctl starts faster
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces, with a header line."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def when(timestamp: float | None, now: float | None = None) -> str:
    """A Unix time for people: ``14:03:12`` today, ``2024-05-01 14:03`` otherwise; ``-`` for None."""
    if timestamp is None:
        return "-"
    now = time.time() if now is None else now
    local = time.localtime(timestamp)
    if time.localtime(now)[:3] == local[:3]:
        return time.strftime("%H:%M:%S", local)
    return time.strftime("%Y-%m-%d %H:%M", local)


def stamp(timestamp: float | None) -> str:
    """A local time with its date, as sacct prints it, for records read later: ``2024-05-01T14:03:12``; ``-`` for None."""
    if timestamp is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(timestamp))


def elapsed(job: Mapping[str, Any], now: float | None = None) -> str:
    """How long a job has run (or ran), over all its runs: ``1:02:03``; ``0:00`` when it never started.

    Takes the controller's ``elapsed_s`` when the job has it (a requeued job
    waiting again does not count its wait as run time).
    """
    if isinstance(job.get("elapsed_s"), (int, float)):
        return format_duration(job["elapsed_s"])
    started = job.get("started")
    if started is None:
        return "0:00"
    ended = job.get("ended")
    end = ended if ended is not None else (time.time() if now is None else now)
    return format_duration(end - started)


def gpus(job: Mapping[str, Any]) -> str:
    """A job's GPU request: ``2``, ``0.5``, ``20G`` (memory slice), ``4x8`` (tasks x per task)."""
    if job.get("gpu_memory_gib"):
        per_task = format_size_gib(job["gpu_memory_gib"])
    else:
        per_task = format_number(job.get("gpus") or 0)
    tasks = job.get("tasks") or 1
    return f"{tasks}x{per_task}" if tasks > 1 else per_task


def nodes(job: Mapping[str, Any]) -> str:
    """The nodes a job runs (or ran) on, each once, in order; ``-`` for none."""
    names = [n for n in dict.fromkeys(job.get("nodes") or []) if n]
    return ",".join(names) or "-"


def exit_status(job: Mapping[str, Any]) -> str:
    """How a job ended: ``0``, ``1``, ``signal 9``; ``-`` when unknown."""
    if job.get("term_signal"):
        return f"signal {job['term_signal']}"
    code = job.get("exit_code")
    return "-" if code is None else str(code)


def gpu_hours(value: float | None) -> str:
    """GPU-hours to two decimals: ``12.5``, ``<0.01`` for a little use, ``0`` for none, ``-`` when unknown."""
    if value is None:
        return "-"
    if 0 < value < 0.005:
        return "<0.01"
    return format_number(round(value, 2))


def counts_text(states: Mapping[str, int]) -> str:
    """Counts by state for people: ``3 running, 5 pending, 2 completed``."""
    return ", ".join(f"{n} {state.lower()}" for state, n in states.items()) or "no jobs"


def max_rss(value: int | None) -> str:
    """A job's peak memory (sacct's MaxRSS): ``180M``; ``-`` when not measured."""
    if value is None:
        return "-"
    return f"{max(1, round(value / 2**20))}M" if value < 2**30 else f"{value / 2**30:.1f}G"


def cpu_time(seconds: float | None) -> str:
    """CPU time as sacct's TotalCPU prints it: ``MM:SS.mmm`` (``H:MM:SS`` past an hour); ``-`` when not measured."""
    if seconds is None:
        return "-"
    if seconds >= 3600:
        whole = int(seconds)
        return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"
    return f"{int(seconds) // 60:02d}:{seconds % 60:06.3f}"


def limits(job: dict) -> str | None:
    """What holds a job to what it asked for: the limits its nodes' cgroups enforce, or "not enforced"."""
    found = job.get("limits")
    if not isinstance(found, dict):
        return None
    if not found.get("enforced"):
        return "not enforced (no usable cgroups on its node)"
    how = f" ({found['how']})" if found.get("how") else ""
    return f"{', '.join(found['enforced'])}{how}"


NO_ESTIMATE = {
    "held": "it is held",
    "dependency": "it waits for a dependency",
    "queue_rule": "it waits on its project's quota or limits, or on other projects' jobs",
    "no_time_limits": "the jobs it waits on have no time limit",
    "not_planned": "it is beyond the jobs the scheduler plans a start for each cycle",
    "not_pending": "it is not pending",
}


def start_text(job: Mapping[str, Any], now: float | None = None) -> str:
    """When a pending job is expected to start, for people: ``14:05:00 (holds room on n1)``, or why
    there is no estimate; "" for a job the controller gave no start for."""
    if "no_estimate" not in job and "estimated_start" not in job:
        return ""
    estimate, reserved = job.get("estimated_start"), job.get("reserved_start")
    if estimate is None:
        why = NO_ESTIMATE.get(job.get("no_estimate") or "", job.get("no_estimate") or "")
        return f"no estimate: {why}" if why else "no estimate"
    text = when(estimate, now)
    if reserved is not None:
        nodes = ", ".join(job.get("start_nodes") or [])
        text += f" (room held on {nodes} from {when(reserved, now)})" if nodes else " (room held)"
    return text
