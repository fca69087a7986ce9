"""``gpuctl show``, ``why``, ``cancel``, ``hold`` and ``release``: one job at a time."""

from __future__ import annotations

import argparse
import time
from typing import Any

from gpud.cli import render
from gpud.cli.common import add_verb, client, for_each, print_json
from gpud.cli.units import format_duration, format_number, format_size_gib

SHOW_EXAMPLES = """\
  gpuctl show 42
  gpuctl show 42_7              # one element of array job 42
  gpuctl show 42 --json | jq .placements
"""

WHY_DESCRIPTION = """\
Explain why a job waits: every blocker the last scheduling cycle found, with
its numbers (quota, fair share, free GPUs, matching nodes), and what would let
the job start.
"""

WHY_EXAMPLES = """\
  gpuctl why 42
  gpuctl why 42 --json
"""

ACTIONS = {
    "cancel": ("cancel jobs (an array id cancels every element)", "cancelled",
               "  gpuctl cancel 42\n  gpuctl cancel 42 43 44\n  gpuctl cancel 42      # array 42: every element\n"
               "  gpuctl cancel 42_3    # one element\n"
               "  gpuctl queue --me --json | jq -r '.jobs[].id' | xargs gpuctl cancel\n"),
    "hold": ("keep pending jobs from starting", "held",
             "  gpuctl hold 42\n  gpuctl hold 42 43\n"),
    "release": ("let held jobs start again", "released",
                "  gpuctl release 42\n  gpuctl release 42 43\n"),
}


def add_parsers(subparsers) -> None:
    """Register ``show``, ``why``, ``cancel``, ``hold`` and ``release`` on the gpuctl sub-command parser."""
    show = add_verb(subparsers, "show", help="everything about one job",
                    description="Show one job: its request, state, where its tasks run, and its events.",
                    examples=SHOW_EXAMPLES, func=run_show, json_flag=True)
    show.add_argument("job", help="job id")
    why = add_verb(subparsers, "why", help="why a job waits and what would let it start",
                   description=WHY_DESCRIPTION, examples=WHY_EXAMPLES, func=run_why, json_flag=True)
    why.add_argument("job", help="job id")
    for verb, (summary, done, examples) in ACTIONS.items():
        parser = add_verb(subparsers, verb, help=summary, description=summary[0].upper() + summary[1:] + ".",
                          examples=examples, func=_action(verb, done))
        parser.add_argument("jobs", nargs="+", metavar="JOB", help="job id")


def _action(verb: str, done: str):
    def run(args: argparse.Namespace) -> int:
        from gpud.client import job_path
        api = client()

        def act(job_id: str) -> None:
            answer = api.post(job_path(job_id, verb)) or {}
            ids = [str(i) for i in answer.get("ids", [])] or [job_id]
            print(f"{done} {' '.join(ids)}")
        return for_each(verb, args.jobs, act)
    run.__doc__ = f"{verb.capitalize()} every job named; returns 1 if the controller refused any."
    return run


def run_show(args: argparse.Namespace) -> int:
    """Print one job as ``Key: value`` lines, then its events."""
    from gpud.client import job_path
    job = client().get(job_path(args.job))
    if args.json:
        print_json(job)
    else:
        print(show_text(job, time.time()))
    return 0


def show_text(job: dict, now: float) -> str:
    """One job for people, as scontrol show job prints it."""
    priority = job.get("priority_class") or ""
    if job.get("priority") is not None:
        priority = f"{priority} ({job['priority']})" if priority else str(job["priority"])
    what = " ".join(job["command"]) if job.get("command") else _first_line(job.get("script"))
    rows = [
        ("Job", job.get("id")), ("Name", job.get("name")), ("User", job.get("user")),
        ("Project", job.get("project")), ("State", job.get("state")), ("Reason", job.get("reason")),
        ("Priority", priority), ("Command" if job.get("command") else "Script", what),
        ("Workdir", job.get("workdir")),
        ("GPUs", render.gpus(job) + (" (tasks x per task)" if (job.get("tasks") or 1) > 1 else "")),
        ("Tasks", _tasks(job)), ("CPUs", format_number(job.get("cpus"))),
        ("Memory", format_size_gib(job.get("memory_gib"))),
        ("Constraint", _pairs(job.get("constraint"))), ("Pool", job.get("pool")),
        ("Time limit", format_duration(job.get("time_limit_s")) if job.get("time_limit_s") else None),
        ("Array", _array(job)), ("Depends", ", ".join(job.get("depends") or []) or None),
        ("Held", "yes" if job.get("hold") else None),
        ("Requeue", "no" if job.get("requeue") is False else None),
        ("Stop signal", job.get("stop_signal")),
        ("Submitted", render.when(job.get("submitted"), now)),
        ("Started", render.when(job.get("started"), now) if job.get("started") else None),
        ("Ended", render.when(job.get("ended"), now) if job.get("ended") else None),
        ("Elapsed", render.elapsed(job, now) if job.get("started") else None),
        ("Restarts", job.get("restart_count") or None),
        ("Exit", render.exit_status(job) if job.get("ended") else None),
        ("GPU-hours", render.gpu_hours(job["gpu_hours"]) if job.get("gpu_hours") else None),
        ("Compute", _compute(job.get("sharing"))), ("GPU memory", _memory(job.get("sharing"))),
        ("Output", job.get("output")), ("Error", job.get("error")),
        ("Env", ", ".join(sorted(job.get("env") or {})) or None),
    ]
    width = max(len(key) for key, _ in rows)
    out = [f"{key + ':':<{width + 1}} {value}" for key, value in rows if value not in (None, "")]
    placements = job.get("placements") or []
    if any(placements):
        out += ["", "Tasks:", _placements_table(placements)]
    events = job.get("events") or []
    if events:
        out += ["", "Events:"] + [f"  {_event(e, now)}" for e in events]
    return "\n".join(out)


def _compute(sharing: dict | None) -> str | None:
    """How a shared GPU's compute is kept: the share, enforced or advisory, and by what."""
    compute = (sharing or {}).get("compute")
    if not compute:
        return None
    request, limit = compute.get("request") or 0.0, compute.get("limit") or 0.0
    share = f"{request:.0%}" if abs(limit - request) < 1e-9 else f"{request:.0%}..{limit:.0%}"
    return f"{share} of the GPU, {'enforced' if compute.get('enforced') else 'advisory'} ({compute.get('how')})"


def _memory(sharing: dict | None) -> str | None:
    """How a shared GPU's memory slice is kept."""
    memory = (sharing or {}).get("memory")
    if not memory:
        return None
    size = f"{memory['limit_gib']:g} GiB slice" if memory.get("limit_gib") else "a slice"
    return f"{size}, {'enforced' if memory.get('enforced') else 'advisory'} ({memory.get('how')})"


def _tasks(job: dict) -> str:
    tasks = job.get("tasks") or 1
    minimum = job.get("min_tasks")
    return f"{tasks} (at least {minimum})" if minimum and minimum != tasks else str(tasks)


def _array(job: dict) -> str | None:
    if job.get("array_id") is None:
        return None
    text = f"element {job.get('array_index')} of {job['array_id']}"
    return text + (f", at most {job['array_limit']} at once" if job.get("array_limit") else "")


def _placements_table(placements: list) -> str:
    rows = []
    for index, placed in enumerate(placements):
        if not placed:
            rows.append([index, "-", "-", "-"])
            continue
        share = placed.get("share")
        rows.append([index, placed.get("node"), ",".join(map(str, placed.get("gpus") or [])) or "-",
                     "-" if share is None else format_number(share)])
    return "\n".join("  " + line for line in render.table(["TASK", "NODE", "GPUS", "SHARE"], rows).splitlines())


def _event(event: Any, now: float) -> str:
    if not isinstance(event, dict):
        return str(event)
    if isinstance(event.get("kind"), str) and isinstance(event.get("message"), str):
        node = f" (on {event['node']})" if event.get("node") else ""
        return f"{render.when(event.get('time'), now)}  {event['kind']}: {event['message']}{node}"
    stamp = next((event[k] for k in ("time", "at", "ts") if isinstance(event.get(k), (int, float))), None)
    rest = {k: v for k, v in event.items() if k not in ("time", "at", "ts")}
    return f"{render.when(stamp, now)}  {describe(rest)}" if stamp is not None else describe(rest)


def _first_line(script: str | None) -> str | None:
    if not script:
        return None
    lines = [ln for ln in script.splitlines() if ln.strip() and not ln.startswith("#")]
    return (lines[0] + (" ..." if len(lines) > 1 else "")) if lines else "(script)"


def _pairs(mapping: dict | None) -> str | None:
    return ", ".join(f"{k}={v}" for k, v in mapping.items()) if mapping else None


def describe(item: Any) -> str:
    """One line for a blocker, a hint or an event: its message first, then its other fields as key=value."""
    if not isinstance(item, dict):
        return str(item)
    text_key = next((k for k in ("message", "reason", "text", "kind", "type") if isinstance(item.get(k), str)), None)
    head = item[text_key] if text_key else ""
    rest = ", ".join(f"{k}={_value(v)}" for k, v in item.items() if k != text_key)
    return f"{head} ({rest})" if head and rest else head or rest


def _value(value: Any) -> str:
    if isinstance(value, float):
        return format_number(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return ",".join(_value(v) for v in value)
    return str(value)


def _worded(item: Any) -> str:
    """A blocker or condition the controller gave as data with its words: the words; anything else, described."""
    if isinstance(item, dict) and isinstance(item.get("message"), str) and ("rule" in item or "condition" in item):
        return str(item["message"])
    return describe(item)


_WHO = {"owner": "you", "project": "the project's users", "admin": "an admin", "cluster": "jobs ending"}


def _by(item: Any) -> str:
    """Who can bring a condition about, in words ("" when not said)."""
    who = item.get("who") if isinstance(item, dict) else None
    return f" [{_WHO.get(who, who)}]" if isinstance(who, str) else ""


def run_why(args: argparse.Namespace) -> int:
    """Print why a job waits: each blocker and what would let it start."""
    from gpud.client import job_path
    answer = client().get(job_path(args.job, "why"))
    if args.json:
        print_json(answer)
    else:
        print(why_text(answer))
    return 0


def why_text(answer: dict) -> str:
    """The why-answer for people."""
    state = answer.get("state")
    head = f"job {answer.get('id')} is {state}"
    if answer.get("reason"):
        head += f": {answer['reason']}"
    out = [head]
    blockers = answer.get("blockers") or []
    if blockers:
        out += ["", "Blocked by:"] + [f"  - {_worded(b)}" for b in blockers]
    hints = answer.get("would_start") or []
    if answer.get("never"):
        out += ["", "It can never start under the policy as it stands."]
    if hints:
        out += ["", "It would start if:"] + [f"  - {_worded(h)}{_by(h)}" for h in hints]
    if state == "PENDING" and not blockers and not answer.get("reason"):
        out.append("(no scheduling cycle has looked at it yet)")
    return "\n".join(out)
