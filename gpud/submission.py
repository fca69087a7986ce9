"""Checking a submitted job (the API's JSON) against the policy and the cluster, and expanding arrays.

Every refusal is a SubmitError naming the field and saying what is wrong,
so a person can fix the request without reading code.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from gpud.jobs import Dependency, Job
from gpud import slurm_names
from gpud.policy import Policy
from gpud.tomlcheck import suggestion

JOB_FIELDS = frozenset({
    "project", "command", "script", "name", "workdir", "env", "gpus", "gpu_memory_gib", "tasks",
    "min_tasks", "cpus", "memory_gib", "priority", "constraint", "pool", "time_limit_s", "array",
    "depends", "hold", "requeue", "stop_signal", "output", "error", "gpu_compute_request", "gpu_compute_limit",
    "interactive", "partition", "qos", "warn_signal", "warn_lead_s", "warn_batch_only"})
WARN_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "URG", "CONT", "WINCH", "ALRM")
MAX_WARN_LEAD_S = 65535.0
DEPENDENCY_KINDS = ("afterok", "afterany", "afternotok")
STOP_SIGNALS = ("TERM", "INT", "HUP", "USR1", "USR2", "QUIT", "KILL")
MAX_ARRAY_ELEMENTS = 100_000
MAX_TASKS = 10_000
MAX_STRING = 65_536
MAX_SCRIPT = 4 * 1024 * 1024
DEV_NULL = "/dev/null"  # the one output path outside the workdir: Slurm users discard output with it
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ARRAY_PART = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")
_JOB_ID = re.compile(r"^\d+(?:_\d+)?$")
GANG_OUTPUT = "gpud-%j.%t.out"  # a gang's tasks write a file each, so `gpuctl logs --task N` shows rank N


class SubmitError(ValueError):
    """A job the controller refuses: ``status`` is the HTTP status, ``field`` the culprit (or None)."""

    def __init__(self, message: str, field: str | None = None, status: int = 422) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


@dataclass(frozen=True, slots=True)
class Capacity:
    """The largest node the cluster has and the labels its nodes carry, to refuse jobs no node could ever
    run (None: no node known)."""

    max_gpus: int | None = None
    max_gpu_memory_gib: float | None = None
    max_cpus: float | None = None
    max_memory_gib: float | None = None
    labels: tuple[tuple[tuple[str, str], ...], ...] | None = None  # each distinct set of node labels
    # Each distinct set of node labels with the largest node carrying it: (labels, GPUs, GPU memory, CPUs, memory).
    sized: tuple[tuple[tuple[tuple[str, str], ...], int, float, float, float], ...] | None = None


@dataclass(frozen=True, slots=True)
class Submission:
    """A checked job (id, seq and submit time not yet given) and, for an array, its indices and limit."""

    job: Job
    array_indices: tuple[int, ...] | None = None
    array_limit: int | None = None
    notes: tuple[dict[str, str], ...] = ()  # how a Slurm partition or QOS was taken (gpud.slurm_names)


def check_job(payload: Any, *, user: str, admin: bool, policy: Policy, capacity: Capacity) -> Submission:
    """A checked submission from a submit request's JSON, or a SubmitError naming the field at fault."""
    if not isinstance(payload, dict):
        raise SubmitError("a job must be a JSON object", status=400)
    unknown = sorted(set(payload) - JOB_FIELDS)
    if unknown:
        raise SubmitError(f"unknown field {unknown[0]!r}{suggestion(unknown[0], JOB_FIELDS)}", unknown[0])
    try:
        payload, notes = slurm_names.resolve(payload, policy)
    except ValueError as exc:
        raise SubmitError(str(exc), str(exc).split()[0]) from None
    r = _Reader(payload)
    project = r.string("project", required=True)
    assert project is not None  # required
    if project not in policy.projects:
        raise SubmitError(f"unknown project {project!r}{suggestion(project, policy.projects)}; the policy "
                          f"has {', '.join(sorted(policy.projects)) or 'no projects'}", "project")
    allowed = policy.projects[project].users
    if allowed and not admin and user not in allowed:
        raise SubmitError(f"user {user!r} may not submit to project {project!r} (its users: "
                          f"{', '.join(allowed)})", "project", status=403)
    interactive = r.boolean("interactive", False)
    command, script = (None, None) if interactive and "command" not in payload and "script" not in payload \
        else _command(r)
    workdir = r.string("workdir", required=True)
    assert workdir is not None  # required
    if not workdir.startswith("/"):
        raise SubmitError(f"workdir must be an absolute path, not {workdir!r}", "workdir")
    job = Job(id="", user=user, project=project, workdir=workdir, command=command, script=script,
              name=r.string("name") or ("shell" if interactive and not command and script is None
                                        else _default_name(command, script)),
              env=_env(r), interactive=interactive)
    _resources(r, job, capacity)
    _priority(r, job, policy)
    if not admin and (payload.get("priority") is not None or job.interactive):
        # An interactive job's default class is checked as if it had been asked for: no escalation by default.
        _priority_allowed(job, policy, chosen=payload.get("priority") is not None)
    job.constraint = r.labels("constraint")
    _check_labels(job.constraint, capacity)
    _check_fits_matching(job, capacity)
    job.pool = r.string("pool")
    known_pools = set(policy.pools) | {policy.default_pool}
    if job.pool is not None and job.pool not in known_pools:
        raise SubmitError(f"unknown node pool {job.pool!r}{suggestion(job.pool, known_pools)}; pools: "
                          f"{', '.join(sorted(known_pools))}", "pool")
    job.time_limit_s = r.number("time_limit_s", positive=True)
    job.depends = [_dependency(text) for text in r.strings("depends")]
    job.hold = r.boolean("hold", False)
    job.requeue = r.boolean("requeue", True)
    job.stop_signal = r.string("stop_signal") or "TERM"
    if job.stop_signal.removeprefix("SIG") not in STOP_SIGNALS:
        raise SubmitError(f"stop_signal must be one of {', '.join(STOP_SIGNALS)}", "stop_signal")
    job.stop_signal = job.stop_signal.removeprefix("SIG")
    _warn_signal(r, job)
    job.output = _relative_path(r, "output") or (GANG_OUTPUT if job.tasks > 1 else "gpud-%j.out")
    job.error = _relative_path(r, "error")
    array = r.string("array")
    if job.interactive and (job.tasks != 1 or array is not None):
        raise SubmitError("an interactive job is one task with one terminal; for a gang or an array, submit a "
                          "batch job and use `gpuctl run --in JOB` in it", "tasks" if job.tasks != 1 else "array")
    if array is None:
        return Submission(job, notes=tuple(notes))
    indices, limit = parse_array(array)
    return Submission(job, tuple(indices), limit, tuple(notes))


def parse_array(text: str) -> tuple[list[int], int | None]:
    """The indices and the running limit of an array spec such as "0-99%8" or "1,3,5-7"."""
    spec, _, limit_text = text.partition("%")
    limit = None
    if limit_text:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise SubmitError(f"array limit after % must be a positive integer, not {limit_text!r}", "array")
        limit = int(limit_text)
    indices: set[int] = set()
    for part in spec.split(","):
        match = _ARRAY_PART.match(part.strip())
        if match is None:
            raise SubmitError(f"bad array range {part!r}: write 0-99, 1,3,5-7, 0-98:2 or 0-99%8", "array")
        first = int(match[1])
        last = int(match[2]) if match[2] else first
        step = int(match[3]) if match[3] else 1
        if last < first or step < 1:
            raise SubmitError(f"bad array range {part!r}: the end is before the start", "array")
        if (last - first) // step + 1 + len(indices) > MAX_ARRAY_ELEMENTS:
            raise SubmitError(f"an array has at most {MAX_ARRAY_ELEMENTS} elements", "array")
        indices.update(range(first, last + 1, step))
    return sorted(indices), limit


def is_job_id(text: str) -> bool:
    """True for a job id ("42") or an array element id ("42_7")."""
    return bool(_JOB_ID.match(text))


def _command(r: _Reader) -> tuple[list[str] | None, str | None]:
    command = r.strings("command", default=None)
    script = r.string("script", limit=MAX_SCRIPT)
    if (command is None) == (script is None):
        raise SubmitError("give exactly one of command (an argv list) and script (a script's text)",
                          "command")
    if command is not None and not command:
        raise SubmitError("command must not be empty", "command")
    return command, script


def _default_name(command: list[str] | None, script: str | None) -> str:
    if command:
        return command[0].rsplit("/", 1)[-1][:64]
    return "script"


def _env(r: _Reader) -> dict[str, str]:
    env = r.labels("env")
    for name in env:
        if not _ENV_NAME.match(name):
            raise SubmitError(f"env: {name!r} is not a valid environment variable name", "env")
    return env


def _resources(r: _Reader, job: Job, capacity: Capacity) -> None:
    job.gpus = r.number("gpus", default=0.0, minimum=0.0)
    job.gpu_memory_gib = r.number("gpu_memory_gib", positive=True)
    if job.gpu_memory_gib is not None and job.gpus:
        raise SubmitError("give gpus or gpu_memory_gib, not both", "gpu_memory_gib")
    if job.gpus > 1 and not float(job.gpus).is_integer():
        raise SubmitError(f"gpus must be a whole number or a fraction below 1, not {job.gpus:g}", "gpus")
    if job.gpus >= 1:
        job.gpus = float(int(job.gpus))
    job.tasks = r.integer("tasks", default=1, minimum=1, maximum=MAX_TASKS)
    job.min_tasks = r.integer("min_tasks", minimum=1, maximum=job.tasks)
    job.cpus = r.number("cpus", default=1.0, minimum=0.0)  # 0: a task that asks for no CPU of its own
    job.memory_gib = r.number("memory_gib", default=1.0, positive=True)
    _sharing(r, job)
    job.runs = []
    job.__post_init__()
    _check_fits(job, capacity)


def _sharing(r: _Reader, job: Job) -> None:
    """Refuse gangs on shared GPUs; check a shared job's own compute request and limit."""
    shared = job.gpu_memory_gib is not None or 0 < job.gpus < 1
    if shared and job.tasks > 1:
        what = f"gpu_memory_gib {job.gpu_memory_gib:g}" if job.gpu_memory_gib is not None else f"gpus {job.gpus:g}"
        raise SubmitError(f"a job of {job.tasks} tasks cannot share GPUs ({what}): time-slicing freezes each "
                          f"task at its own times, so its peers would wait on it and their collective timeouts "
                          f"fire; ask for whole GPUs (gpus = 1) or run a single task", "tasks")
    request = r.number("gpu_compute_request", minimum=0.0)
    limit = r.number("gpu_compute_limit", minimum=0.0)
    if request is None and limit is None:
        return
    field_name = "gpu_compute_request" if request is not None else "gpu_compute_limit"
    if not shared:
        raise SubmitError(f"{field_name} applies only to a job sharing a GPU (a fraction in gpus, or "
                          f"gpu_memory_gib); a whole GPU is the job's alone", field_name)
    if limit is not None and limit > 1:
        raise SubmitError(f"gpu_compute_limit must be at most 1 (the whole GPU), not {limit:g}", "gpu_compute_limit")
    if request is not None and job.gpu_memory_gib is None and request > job.gpus:
        raise SubmitError(f"gpu_compute_request {request:g} is more than the job's share of the GPU "
                          f"({job.gpus:g}): a guarantee cannot exceed what the job is charged for",
                          "gpu_compute_request")
    if request is not None and request > 1:
        raise SubmitError(f"gpu_compute_request must be at most 1, not {request:g}", "gpu_compute_request")
    if request is None and limit is not None and job.gpu_memory_gib is None and limit < job.gpus:
        raise SubmitError(f"gpu_compute_limit {limit:g} is below the job's share of the GPU ({job.gpus:g}), "
                          f"its compute request unless gpu_compute_request says otherwise", "gpu_compute_limit")
    if request is not None and limit is not None and limit < request:
        raise SubmitError(f"gpu_compute_limit {limit:g} is below gpu_compute_request {request:g}",
                          "gpu_compute_limit")
    job.gpu_compute_request, job.gpu_compute_limit = request, limit


def _check_fits(job: Job, capacity: Capacity) -> None:
    if capacity.max_gpus is not None and job.gpus >= 1 and job.gpus > capacity.max_gpus:
        raise SubmitError(f"each task asks for {job.gpus:g} GPUs but the largest node has "
                          f"{capacity.max_gpus}; use more tasks with fewer GPUs each", "gpus")
    if (capacity.max_gpu_memory_gib is not None and job.gpu_memory_gib is not None
            and job.gpu_memory_gib > capacity.max_gpu_memory_gib):
        raise SubmitError(f"gpu_memory_gib {job.gpu_memory_gib:g} is more than the largest GPU's "
                          f"{capacity.max_gpu_memory_gib:g} GiB", "gpu_memory_gib")
    if capacity.max_cpus is not None and job.cpus > capacity.max_cpus:
        raise SubmitError(f"each task asks for {job.cpus:g} CPUs but the largest node has "
                          f"{capacity.max_cpus:g}", "cpus")
    if capacity.max_memory_gib is not None and job.memory_gib > capacity.max_memory_gib:
        raise SubmitError(f"each task asks for {job.memory_gib:g} GiB of memory but the largest node "
                          f"has {capacity.max_memory_gib:g} GiB", "memory_gib")


def _check_fits_matching(job: Job, capacity: Capacity) -> None:
    """Refuse a job whose tasks fit no node its constraint matches, naming the constraint (422)."""
    wanted = {k: v for k, v in job.constraint.items() if k != "pool"}
    if not wanted or not capacity.sized:
        return
    matching = [size for size in capacity.sized if all(pair in size[0] for pair in wanted.items())]
    if not matching:
        return  # _check_labels says no node has the labels
    gpus = max(m[1] for m in matching)
    gpu_memory = max(m[2] for m in matching)
    cpus = max(m[3] for m in matching)
    memory = max(m[4] for m in matching)
    chosen = ", ".join(f"{k}={v}" for k, v in wanted.items())
    if job.gpus >= 1 and job.gpus > gpus:
        raise SubmitError(f"each task asks for {job.gpus:g} GPUs but the largest node with {chosen} has {gpus}; "
                          "use more tasks with fewer GPUs each, or another --constraint", "constraint")
    if job.gpus > 0 and gpus == 0:
        raise SubmitError(f"the job asks for GPUs but no node with {chosen} has any", "constraint")
    if job.gpu_memory_gib is not None and job.gpu_memory_gib > gpu_memory:
        raise SubmitError(f"gpu_memory_gib {job.gpu_memory_gib:g} is more than the largest GPU's "
                          f"{gpu_memory:g} GiB on the nodes with {chosen}", "constraint")
    if job.cpus > cpus:
        raise SubmitError(f"each task asks for {job.cpus:g} CPUs but the largest node with {chosen} has "
                          f"{cpus:g}", "constraint")
    if job.memory_gib > memory:
        raise SubmitError(f"each task asks for {job.memory_gib:g} GiB of memory but the largest node with "
                          f"{chosen} has {memory:g} GiB", "constraint")


def _check_labels(constraint: dict[str, str], capacity: Capacity) -> None:
    """Refuse a constraint no node has ever had; "pool" is a node's pool, which the policy may change."""
    wanted = {k: v for k, v in constraint.items() if k != "pool"}
    if not wanted or capacity.labels is None:
        return
    if any(all(pair in labels for pair in wanted.items()) for labels in capacity.labels):
        return
    have = sorted({f"{k}={v}" for labels in capacity.labels for k, v in labels})
    shown = ", ".join(have[:20]) + (f" and {len(have) - 20} more" if len(have) > 20 else "")
    raise SubmitError(f"no node has {', '.join(f'{k}={v}' for k, v in wanted.items())}; the labels nodes have: "
                      f"{shown or 'none'}", "constraint")


def _priority(r: _Reader, job: Job, policy: Policy) -> None:
    value = r.raw("priority")
    if value is None:
        default = policy.default_class(job.project, job.interactive)
        value = default if default in policy.priority_classes else None
    if value is None:
        job.priority_class, job.priority = "", 50
    elif isinstance(value, str):
        if value not in policy.priority_classes:
            raise SubmitError(f"unknown priority class {value!r}{suggestion(value, policy.priority_classes)};"
                              f" classes: {', '.join(policy.priority_classes)}, or an integer", "priority")
        job.priority_class, job.priority = value, policy.priority_classes[value]
    elif isinstance(value, int) and not isinstance(value, bool) and -10**6 <= value <= 10**6:
        job.priority_class, job.priority = str(value), value
    else:
        raise SubmitError("priority must be a priority class name or an integer", "priority", status=400)


def _priority_allowed(job: Job, policy: Policy, *, chosen: bool = True) -> None:
    """Refuse a priority the policy does not let the users of the job's project ask for (403).

    ``chosen`` is False for the class an interactive job gets by default, which passes the same check.
    """
    classes, highest = policy.allowed_priorities(job.project)
    named = job.priority_class in policy.priority_classes
    if (job.priority_class in classes) if named else job.priority <= highest:
        return
    asked = f"priority class {job.priority_class!r}" if named else f"priority {job.priority}"
    if not chosen:
        asked += " (the policy's interactive_class, which interactive jobs get unless they name one)"
    raise SubmitError(f"project {job.project!r} does not allow {asked}; its users may use the classes "
                      f"{', '.join(classes) or '(none)'} or an integer up to {highest} (admins may set any)"
                      + ("" if chosen else "; name one with --priority"), "priority", status=403)


def _warn_signal(r: Any, job: Job) -> None:
    """``warn_signal``, ``warn_lead_s``, ``warn_batch_only``: what ``--signal SIG@LEAD`` asked for."""
    name = r.string("warn_signal")
    lead = r.number("warn_lead_s")
    job.warn_batch_only = r.boolean("warn_batch_only", False)
    if name is None:
        if lead is not None or job.warn_batch_only:
            raise SubmitError("warn_lead_s and warn_batch_only go with warn_signal (--signal SIG@LEAD)",
                              "warn_signal")
        return
    name = name.removeprefix("SIG")
    if name not in WARN_SIGNALS:
        raise SubmitError(f"warn_signal must be one of {', '.join(WARN_SIGNALS)}", "warn_signal")
    if lead is None or not 0 <= lead <= MAX_WARN_LEAD_S:
        raise SubmitError(f"warn_lead_s must be 0 to {MAX_WARN_LEAD_S:g} seconds", "warn_lead_s")
    job.warn_signal, job.warn_lead_s = name, float(lead)


def _dependency(text: str) -> Dependency:
    kind, _, target = text.partition(":")
    if kind not in DEPENDENCY_KINDS or not is_job_id(target):
        raise SubmitError(f"bad dependency {text!r}: write afterok:ID, afterany:ID or afternotok:ID",
                          "depends")
    return Dependency(kind, target)


def _relative_path(r: _Reader, key: str) -> str | None:
    path = r.string(key)
    if path is None:
        return None
    parts = path.split("/")
    if path == DEV_NULL:
        return path
    if path.startswith("/") or ".." in parts or not path.strip():
        raise SubmitError(f"{key} must be a path inside workdir (relative, no '..') or {DEV_NULL}, not "
                          f"{path!r}", key)
    return path


def _check_text(key: str, *texts: str) -> None:
    """400 naming ``key`` when a text holds a lone surrogate (JSON's "\\ud800"): no argv, variable or file
    name can carry one, and the store writes only valid UTF-8."""
    for text in texts:
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise SubmitError(f"{key} must be valid Unicode text (it holds a lone surrogate)", key,
                                  status=400) from None


class _Reader:
    """Typed reads of a payload's fields; a wrong type is a 400 naming the field."""

    def __init__(self, payload: dict) -> None:
        self.payload = payload

    def raw(self, key: str) -> Any:
        return self.payload.get(key)

    def string(self, key: str, *, required: bool = False, limit: int = MAX_STRING) -> str | None:
        value = self.payload.get(key)
        if value is None:
            if required:
                raise SubmitError(f"{key} is required", key)
            return None
        if not isinstance(value, str):
            raise SubmitError(f"{key} must be a string", key, status=400)
        if len(value) > limit or "\0" in value:
            raise SubmitError(f"{key} is longer than {limit} characters or holds a NUL byte", key)
        _check_text(key, value)
        return value

    def strings(self, key: str, default: Any = ()) -> Any:
        value = self.payload.get(key)
        if value is None:
            return list(default) if default is not None else None
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise SubmitError(f"{key} must be a list of strings", key, status=400)
        if sum(len(item) for item in value) > MAX_STRING or any("\0" in item for item in value):
            raise SubmitError(f"{key} is longer than {MAX_STRING} characters or holds a NUL byte", key)
        _check_text(key, *value)
        return list(value)

    def labels(self, key: str) -> dict[str, str]:
        value = self.payload.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise SubmitError(f"{key} must be an object of strings", key, status=400)
        if sum(len(k) + len(v) for k, v in value.items()) > MAX_STRING:
            raise SubmitError(f"{key} is larger than {MAX_STRING} characters", key)
        _check_text(key, *value, *value.values())
        return dict(value)

    def boolean(self, key: str, default: bool) -> bool:
        value = self.payload.get(key, default)
        if not isinstance(value, bool):
            raise SubmitError(f"{key} must be true or false", key, status=400)
        return value

    def number(self, key: str, default: Any = None, *, positive: bool = False,
               minimum: float | None = None) -> Any:
        value = self.payload.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SubmitError(f"{key} must be a number", key, status=400)
        try:
            number = float(value)
        except OverflowError:
            raise SubmitError(f"{key} is too large", key) from None
        if not math.isfinite(number):
            raise SubmitError(f"{key} must be a number", key, status=400)
        if positive and number <= 0:
            raise SubmitError(f"{key} must be above 0, not {value}", key)
        if minimum is not None and number < minimum:
            raise SubmitError(f"{key} must be at least {minimum:g}, not {value}", key)
        return number

    def integer(self, key: str, default: Any = None, *, minimum: int, maximum: int) -> Any:
        value = self.payload.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise SubmitError(f"{key} must be an integer", key, status=400)
        if not minimum <= value <= maximum:
            raise SubmitError(f"{key} must be between {minimum} and {maximum}, not {value}", key)
        return value
