"""Checking a submitted job (the API's JSON) against the policy and the cluster, and expanding arrays.

Every refusal is a SubmitError naming the field and saying what is wrong,
so a person can fix the request without reading code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpud.jobs import Dependency, Job
from gpud import slurm_names
from gpud.policy import Policy
from gpud.tomlcheck import suggestion
from gpud.wire.fields import WireError
from gpud.wire.job import JOB_FIELDS, MAX_TASKS, JobRequest

__all__ = ["JOB_FIELDS", "MAX_TASKS", "Capacity", "JobRequest", "SubmitError", "Submission", "admit",
           "is_job_id", "parse_array", "read_job"]

MAX_ARRAY_ELEMENTS = 100_000
DEV_NULL = "/dev/null"  # the one output path outside the workdir: Slurm users discard output with it
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ARRAY_PART = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")
_JOB_ID = re.compile(r"^\d+(?:_\d+)?$")
GANG_OUTPUT = "gpud-%j.%t.out"  # a gang's tasks write a file each, so `gpuctl logs --task N` shows rank N
DEPENDENCY_KINDS = ("afterok", "afterany", "afternotok")


class SubmitError(WireError):
    """A job the controller refuses: ``status`` is the HTTP status, ``field`` the culprit (or None)."""


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


def read_job(payload: Any) -> JobRequest:
    """The job request in a submit's JSON, each field checked alone; a SubmitError naming the field otherwise."""
    return JobRequest.decode(payload, error=SubmitError)


def admit(request: JobRequest, *, user: str, admin: bool, policy: Policy, capacity: Capacity) -> Submission:
    """The job ``request`` asks for, checked against the policy and the cluster; a SubmitError naming the field
    at fault when the policy refuses it or no node could ever run it."""
    try:
        request, notes = slurm_names.resolve(request, policy)
    except WireError as exc:
        raise SubmitError(str(exc), exc.field) from None
    _check_project(request.project, user, admin, policy)
    command = list(request.command) if request.command is not None else None
    interactive_shell = request.interactive and command is None and request.script is None
    gpus = float(int(request.gpus)) if request.gpus >= 1 else request.gpus
    job = Job(id="", user=user, project=request.project, workdir=request.workdir, command=command,
              script=request.script, env=_env(request.env), interactive=request.interactive,
              name=request.name or ("shell" if interactive_shell else _default_name(command)),
              gpus=gpus, gpu_memory_gib=request.gpu_memory_gib, tasks=request.tasks, min_tasks=request.min_tasks,
              cpus=request.cpus, memory_gib=request.memory_gib)
    _sharing(request, job)
    _check_fits(job, capacity)
    _priority(request.priority, job, policy)
    if not admin and (request.priority is not None or job.interactive):
        # An interactive job's default class is checked as if it had been asked for: no escalation by default.
        _priority_allowed(job, policy, chosen=request.priority is not None)
    job.constraint = dict(request.constraint)
    _check_labels(job.constraint, capacity)
    _check_fits_matching(job, capacity)
    job.pool = request.pool
    known_pools = set(policy.pools) | {policy.default_pool}
    if job.pool is not None and job.pool not in known_pools:
        raise SubmitError(f"unknown node pool {job.pool!r}{suggestion(job.pool, known_pools)}; pools: "
                          f"{', '.join(sorted(known_pools))}", "pool")
    # A job that asks for no limit runs under its class's or pool's default (the policy's
    # [reservations]), which is enforced like one it asked for; never above the pool's maximum.
    job.time_limit_s = policy.time_limit_for(job.pool or policy.default_pool, job.priority_class,
                                             request.time_limit_s)
    job.depends = [_dependency(text) for text in request.depends]
    job.hold, job.requeue, job.stop_signal = request.hold, request.requeue, request.stop_signal
    if request.warn_signal is not None:
        assert request.warn_lead_s is not None  # JobRequest.check: a warn_signal comes with its lead
        job.warn_signal, job.warn_lead_s = request.warn_signal, request.warn_lead_s
    job.warn_batch_only = request.warn_batch_only
    job.output = _relative_path("output", request.output) or (GANG_OUTPUT if job.tasks > 1 else "gpud-%j.out")
    job.error = _relative_path("error", request.error)
    if job.interactive and (job.tasks != 1 or request.array is not None):
        raise SubmitError("an interactive job is one task with one terminal; for a gang or an array, submit a "
                          "batch job and use `gpuctl run --in JOB` in it", "tasks" if job.tasks != 1 else "array")
    if request.array is None:
        return Submission(job, notes=tuple(notes))
    indices, limit = parse_array(request.array)
    return Submission(job, tuple(indices), limit, tuple(notes))


def _check_project(project: str, user: str, admin: bool, policy: Policy) -> None:
    """Refuse a project the policy does not have (422), or whose users the submitter is not one of (403)."""
    if project not in policy.projects:
        raise SubmitError(f"unknown project {project!r}{suggestion(project, policy.projects)}; the policy "
                          f"has {', '.join(sorted(policy.projects)) or 'no projects'}", "project")
    allowed = policy.projects[project].users
    if allowed and not admin and user not in allowed:
        raise SubmitError(f"user {user!r} may not submit to project {project!r} (its users: "
                          f"{', '.join(allowed)})", "project", status=403)


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


def _default_name(command: list[str] | None) -> str:
    if command:
        return command[0].rsplit("/", 1)[-1][:64]
    return "script"


def _env(env: dict[str, str]) -> dict[str, str]:
    for name in env:
        if not _ENV_NAME.match(name):
            raise SubmitError(f"env: {name!r} is not a valid environment variable name", "env")
    return dict(env)


def _sharing(request: JobRequest, job: Job) -> None:
    """Refuse gangs on shared GPUs; check a shared job's own compute request and limit."""
    shared = job.gpu_memory_gib is not None or 0 < job.gpus < 1
    if shared and job.tasks > 1:
        what = f"gpu_memory_gib {job.gpu_memory_gib:g}" if job.gpu_memory_gib is not None else f"gpus {job.gpus:g}"
        raise SubmitError(f"a job of {job.tasks} tasks cannot share GPUs ({what}): time-slicing freezes each "
                          f"task at its own times, so its peers would wait on it and their collective timeouts "
                          f"fire; ask for whole GPUs (gpus = 1) or run a single task", "tasks")
    asked, limit = request.gpu_compute_request, request.gpu_compute_limit
    if asked is None and limit is None:
        return
    field_name = "gpu_compute_request" if asked is not None else "gpu_compute_limit"
    if not shared:
        raise SubmitError(f"{field_name} applies only to a job sharing a GPU (a fraction in gpus, or "
                          f"gpu_memory_gib); a whole GPU is the job's alone", field_name)
    if limit is not None and limit > 1:
        raise SubmitError(f"gpu_compute_limit must be at most 1 (the whole GPU), not {limit:g}", "gpu_compute_limit")
    if asked is not None and job.gpu_memory_gib is None and asked > job.gpus:
        raise SubmitError(f"gpu_compute_request {asked:g} is more than the job's share of the GPU "
                          f"({job.gpus:g}): a guarantee cannot exceed what the job is charged for",
                          "gpu_compute_request")
    if asked is not None and asked > 1:
        raise SubmitError(f"gpu_compute_request must be at most 1, not {asked:g}", "gpu_compute_request")
    if asked is None and limit is not None and job.gpu_memory_gib is None and limit < job.gpus:
        raise SubmitError(f"gpu_compute_limit {limit:g} is below the job's share of the GPU ({job.gpus:g}), "
                          f"its compute request unless gpu_compute_request says otherwise", "gpu_compute_limit")
    if asked is not None and limit is not None and limit < asked:
        raise SubmitError(f"gpu_compute_limit {limit:g} is below gpu_compute_request {asked:g}",
                          "gpu_compute_limit")
    job.gpu_compute_request, job.gpu_compute_limit = asked, limit


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


def _priority(value: str | int | None, job: Job, policy: Policy) -> None:
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
    else:
        job.priority_class, job.priority = str(value), value


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


def _dependency(text: str) -> Dependency:
    kind, _, target = text.partition(":")
    if kind not in DEPENDENCY_KINDS or not is_job_id(target):
        raise SubmitError(f"bad dependency {text!r}: write afterok:ID, afterany:ID or afternotok:ID",
                          "depends")
    return Dependency(kind, target)


def _relative_path(key: str, path: str | None) -> str | None:
    if path is None:
        return None
    parts = path.split("/")
    if path == DEV_NULL:
        return path
    if path.startswith("/") or ".." in parts or not path.strip():
        raise SubmitError(f"{key} must be a path inside workdir (relative, no '..') or {DEV_NULL}, not "
                          f"{path!r}", key)
    return path
