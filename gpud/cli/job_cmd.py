"""``gpuctl show``, ``why``, ``cancel``, ``hold``, ``release`` and ``requeue``: one job at a time."""

from __future__ import annotations

import argparse
import time
from typing import Any

from gpud.cli import render
from gpud.cli.common import client, for_each, print_json
from gpud.cli.parsing import add_verb
from gpud.cli.units import format_duration, format_number, format_size_gib

SHOW_EXAMPLES = """\
  gpuctl show 42
  gpuctl show 42                # array job 42: its counts by state and every element
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
  gpuctl why 42                 # array job 42: why its first pending element waits
  gpuctl why 42 --json
"""

ACTIONS = {
    "cancel": ("cancel jobs (an array id cancels every element)", "cancelled",
               "  gpuctl cancel 42\n  gpuctl cancel 42 43 44\n  gpuctl cancel 42      # array 42: every element\n"
               "  gpuctl cancel 42_3    # one element\n"
               "  gpuctl queue --me --json | jq -r '.jobs[].id' | xargs gpuctl cancel\n"),
    "hold": ("keep pending jobs from starting (an array id holds its pending elements)", "held",
             "  gpuctl hold 42\n  gpuctl hold 42 43\n"),
    "release": ("let held jobs start again (an array id releases its held elements)", "released",
                "  gpuctl release 42\n  gpuctl release 42 43\n"),
    "requeue": ("stop running jobs and queue them again (an array id requeues its running elements)", "requeued",
                "  gpuctl requeue 42     # starts again with GPUD_RESTART_COUNT one higher, its checkpoint\n"
                "                        # directory kept; a job submitted with --no-requeue is refused\n"
                "  # in a job script with --signal USR1@120: checkpoint before the time limit, run again\n"
                "  trap 'save_checkpoint; gpuctl requeue \"$GPUD_JOB_ID\"' USR1\n"
                "  scontrol requeue \"$SLURM_JOB_ID\"     # the same, through the Slurm shims\n"),
}


def add_parsers(subparsers) -> None:
    """Register ``show``, ``why``, ``cancel``, ``hold``, ``release`` and ``requeue`` on gpuctl's sub-command
    parser."""
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
            if answer.get("ended") and isinstance(answer.get("array"), dict):
                print(f"array {job_id} has already ended ({render.counts_text(answer['array'].get('states') or {})}); "
                      f"nothing to {verb}")
                return
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
    """One job for people, as scontrol show job prints it; an array with a table of its elements."""
    if isinstance(job.get("array"), dict):
        return array_text(job, now)
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
        ("Signal", _warn_signal(job.get("signal"))),
        ("Checkpoints", _checkpoints(job.get("checkpoints"))),
        ("GPU-h lost", render.gpu_hours(job["lost_gpu_hours"]) if job.get("lost_gpu_hours") else None),
        ("Submitted", render.stamp(job.get("submitted"))),
        ("Est. start", render.start_text(job, now) if job.get("state") == "PENDING" else None),
        ("Started", render.stamp(job.get("started")) if job.get("started") else None),
        ("Ended", render.stamp(job.get("ended")) if job.get("ended") else None),
        ("Elapsed", render.elapsed(job, now) if job.get("started") else None),
        ("Restarts", job.get("restart_count") or None),
        ("Exit", render.exit_status(job) if job.get("ended") else None),
        ("GPU-hours", render.gpu_hours(job["gpu_hours"]) if job.get("gpu_hours") else None),
        ("MaxRSS", render.max_rss(job["max_rss_bytes"]) if job.get("max_rss_bytes") is not None else None),
        ("TotalCPU", render.cpu_time(job["cpu_s"]) if job.get("cpu_s") is not None else None),
        ("Limits", render.limits(job)),
        ("Compute", _compute(job.get("sharing"))), ("GPU memory", _memory(job.get("sharing"))),
        ("Output", output_path(job, job.get("output") or "gpud-%j.out")),
        ("Error", output_path(job, job["error"]) if job.get("error") else None),
        ("Env", ", ".join(sorted(job.get("env") or {})) or None),
        ("Command", "not shown: only its owner and admins see its command, environment and paths"
         if job.get("confidential") else None),
    ]
    width = max(len(key) for key, value in rows if value not in (None, ""))
    out = [f"{key + ':':<{width + 1}} {value}" for key, value in rows if value not in (None, "")]
    placements = job.get("placements") or []
    if any(placements):
        out += ["", "Tasks:", _placements_table(placements)]
    events = job.get("events") or []
    if events:
        out += ["", "Events:"] + [f"  {_event(e, now)}" for e in events]
    return "\n".join(out)


def array_text(view: dict, now: float) -> str:
    """A whole array job: what each element runs, its counts by state, then one row per element."""
    array = view["array"]
    limit = f", at most {array['limit']} at once" if array.get("limit") else ""
    what = " ".join(view["command"]) if view.get("command") else _first_line(view.get("script"))
    rows = [("Array", f"{view.get('id')} ({array.get('elements')} jobs {view.get('id')}_N{limit})"),
            ("Name", view.get("name")), ("User", view.get("user")), ("Project", view.get("project")),
            ("State", f"{view.get('state')} ({render.counts_text(array.get('states') or {})})"),
            ("Reason", view.get("reason")), ("Command" if view.get("command") else "Script", what),
            ("Workdir", view.get("workdir")), ("GPUs", render.gpus(view)), ("CPUs", format_number(view.get("cpus"))),
            ("Memory", format_size_gib(view.get("memory_gib"))),
            ("Submitted", render.stamp(view.get("submitted"))),
            ("GPU-hours", render.gpu_hours(view["gpu_hours"]) if view.get("gpu_hours") else None),
            ("Output", view.get("output"))]
    width = max(len(key) for key, _ in rows)
    out = [f"{key + ':':<{width + 1}} {value}" for key, value in rows if value not in (None, "")]
    table = render.table(["ID", "STATE", "TIME", "NODES", "EXIT", "REASON"],
                         [[e.get("id"), e.get("state"), render.elapsed(e, now), render.nodes(e),
                           render.exit_status(e) if e.get("ended") else "-",
                           "" if e.get("state") in ("RUNNING", "COMPLETED") else e.get("reason") or ""]
                          for e in view.get("elements", [])])
    return "\n".join(out + ["", "Jobs:"] + ["  " + line for line in table.splitlines()])


def output_path(job: dict, pattern: str) -> str:
    """Where an output pattern puts the job's file: ``%j`` the job id, ``%t`` the task, ``%%`` a percent sign,
    inside the workdir. A gang's ``%t`` stays, with the range of tasks it stands for."""
    tasks = job.get("tasks") or 1
    out, i, per_task = [], 0, False
    while i < len(pattern):
        code = pattern[i:i + 2]
        if code == "%j":
            out.append(str(job.get("id")))
        elif code == "%t":
            out.append("0" if tasks == 1 else "%t")
            per_task = tasks > 1
        elif code == "%%":
            out.append("%")
        else:
            out.append(pattern[i])
            i += 1
            continue
        i += 2
    path = "".join(out)
    if not path.startswith("/") and job.get("workdir"):
        path = job["workdir"].rstrip("/") + "/" + path
    return path + (f" (%t: each task, 0 to {tasks - 1})" if per_task else "")


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


EVENTS_NAMING_THEIR_NODE = {"started"}  # the controller's "started on NODES" says where already


def _event(event: Any, now: float) -> str:
    if not isinstance(event, dict):
        return str(event)
    if isinstance(event.get("kind"), str) and isinstance(event.get("message"), str):
        named = event.get("node") and event["kind"] not in EVENTS_NAMING_THEIR_NODE
        node = f" (on {event['node']})" if named else ""
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


def worded(item: Any) -> str:
    """A blocker or condition the controller gave as data with its words: the words; anything else, described."""
    if isinstance(item, dict) and isinstance(item.get("message"), str) and ("rule" in item or "condition" in item):
        return str(item["message"])
    return describe(item)


def expected_text(item: Any) -> str:
    """Something the controller expects to happen for a waiting job, with the local time it is due."""
    text = worded(item)
    at = item.get("at") if isinstance(item, dict) else None
    return f"{text} (at {render.when(at)})" if isinstance(at, (int, float)) else text


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
    array = answer.get("array")
    if isinstance(array, dict):
        out.insert(0, f"array {array.get('id')}: {array.get('elements')} jobs, {render.counts_text(array.get('states') or {})}")
        if not array.get("states", {}).get("PENDING"):
            return "\n".join(out[:1] + ["no job of it waits"])
    blockers = answer.get("blockers") or []
    if blockers:
        out += ["", "Blocked by:"] + [f"  - {worded(b)}" for b in blockers]
    standing = answer.get("standing") or []
    if standing:
        out += ["", "Where it stands:"] + [f"  - {worded(s)}" for s in standing]
    expected = answer.get("expected") or []
    if expected:
        out += ["", "Expected:"] + [f"  - {expected_text(e)}" for e in expected]
    hints = answer.get("would_start") or []
    if answer.get("never"):
        out += ["", "It can never start under the policy as it stands"
                + (". Only these changes would let it:" if hints else ".")]
        out += [f"  - {worded(h)}{_by(h)}" for h in hints]
    elif hints:
        out += ["", "It would start if:"] + [f"  - {worded(h)}{_by(h)}" for h in hints]
    start = answer.get("start") or {}
    if state == "PENDING" and start:
        out += ["", f"Expected to start: {render.start_text(start)}"]
    if state == "PENDING" and not blockers and not answer.get("reason"):
        out.append("(no scheduling cycle has looked at it yet)")
    return "\n".join(out)


def _warn_signal(signal: dict | None) -> str | None:
    """``--signal SIG@LEAD`` as a person reads it."""
    if not signal:
        return None
    who = "its first process" if signal.get("batch_only") else "the task"
    return (f"SIG{signal['signal']} to {who} {format_duration(signal['lead_s'])} before the time limit, "
            f"and at once when preempted")


def _checkpoints(checkpoints: list | None) -> str | None:
    """Each checkpoint recorded (time, how, which run), the latest last."""
    if not checkpoints:
        return None
    return f"{len(checkpoints)}: " + ", ".join(
        f"{render.stamp(c.get('at'))} ({c.get('source')}, restart {c.get('restart')})" for c in checkpoints[-5:])
