"""The controller's record of a job: what was asked, where its tasks run, and how it ended."""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
from dataclasses import dataclass, field
from typing import Any

from gpud.lifecycle import PENDING, RUN_NONE, RUNNING, check_run_transition, check_transition
from gpud.model import JobSpec, TaskPlacement, TaskRequest
from gpud.wire.task import ExitCause

SUBMITTED_FIELDS = ("id", "name", "user", "project", "command", "script", "workdir", "env", "gpus",
                    "gpu_memory_gib", "tasks", "min_tasks", "cpus", "memory_gib", "priority_class",
                    "priority", "constraint", "pool", "time_limit_s", "array_id", "array_index",
                    "array_limit", "depends", "requeue", "stop_signal", "warn_signal", "warn_lead_s",
                    "warn_batch_only", "output", "error", "gpu_compute_request",
                    "gpu_compute_limit", "interactive", "submitted", "seq")


@dataclass(slots=True)
class Dependency:
    """``kind`` (afterok, afterany, afternotok) on job ``job``; ``met`` once decided (True/False)."""

    kind: str
    job: str
    met: bool | None = None


@dataclass(slots=True)
class TaskRun:
    """One task's current incarnation: where it runs, which attempt, what the node said about it."""

    placement: TaskPlacement | None = None
    attempt: int = -1
    state: str = RUN_NONE        # none | starting | running | exited: see gpud.lifecycle.RUN_TRANSITIONS
    pid: int | None = None
    exit_code: int | None = None
    term_signal: int | None = None
    reason: str = ""  # why it ended, in the node's words, for people
    since: float | None = None
    cause: ExitCause | None = None  # why it ended, as the node decided it (None until it has)

    def move_to(self, state: str) -> str:
        """Change state along an allowed edge of the task-run table; returns the edge's name."""
        event = check_run_transition(self.state, state)
        self.state = state
        return event


@dataclass(slots=True)
class Job:
    """A job as the controller keeps it; ``state`` changes only through ``move_to``."""

    id: str
    user: str
    project: str
    workdir: str
    name: str = ""
    command: list[str] | None = None
    script: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    gpus: float = 0.0
    gpu_memory_gib: float | None = None
    tasks: int = 1
    min_tasks: int | None = None
    cpus: float = 1.0
    memory_gib: float = 1.0
    priority_class: str = "train"
    priority: int = 50
    constraint: dict[str, str] = field(default_factory=dict)
    pool: str | None = None
    time_limit_s: float | None = None
    array_id: str | None = None
    array_index: int | None = None
    array_limit: int | None = None
    depends: list[Dependency] = field(default_factory=list)
    hold: bool = False
    requeue: bool = True
    stop_signal: str = "TERM"
    # --signal SIG@LEAD: SIG goes LEAD seconds before the time limit, and at once when the job is a victim.
    warn_signal: str | None = None
    warn_lead_s: float = 0.0
    warn_batch_only: bool = False  # "B:": the task's leader process alone hears it
    output: str = "gpud-%j.out"
    error: str | None = None
    gpu_compute_request: float | None = None
    gpu_compute_limit: float | None = None
    allow_root: bool = False     # submitted with a token that may run jobs as uid 0
    interactive: bool = False   # a terminal attaches to it (gpuctl run); no command means the login shell
    submitted: float = 0.0
    seq: int = 0
    uid: str = ""     # random at submit, unique across clusters and restores: names the job's checkpoint directory
    state: str = PENDING
    reason: str = ""
    started: float | None = None
    ended: float | None = None
    restart_count: int = 0
    launches: int = 0
    hosts: list[str] = field(default_factory=list)
    exit_code: int | None = None
    term_signal: int | None = None
    runs: list[TaskRun] = field(default_factory=list)
    gpu_seconds: float = 0.0
    run_seconds: float = 0.0     # time run in incarnations that have ended (before a requeue, or at the end)
    max_rss_bytes: int | None = None  # the largest peak memory of any of its tasks (sacct's MaxRSS)
    cpu_s: float | None = None  # CPU time of all its tasks' processes (sacct's TotalCPU)
    gpu_util_sum: float = 0.0    # its GPUs' utilisation samples (percent) added up, for their mean
    gpu_util_samples: int = 0
    gpu_memory_peak_gib: float | None = None  # the most GPU memory one of its GPUs held for it
    last_checkpoint: float | None = None  # when it last reported a complete checkpoint (gpuctl checkpointed)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)  # the latest ones: {"at", "source", "restart"}
    lost_gpu_seconds: float = 0.0  # GPU-seconds since the last checkpoint at each preemption, added up

    def __post_init__(self) -> None:
        if not self.runs:
            self.runs = [TaskRun() for _ in range(self.tasks)]

    def move_to(self, state: str, at: float | None = None) -> str:
        """Change state along an allowed edge of the lifecycle; returns the edge's event name.

        Leaving RUNNING at ``at`` adds the run that ends there to ``run_seconds``.
        """
        event = check_transition(self.state, state)
        if self.state == RUNNING and state != RUNNING and at is not None and self.started is not None:
            self.run_seconds += max(0.0, at - self.started)
        self.state = state
        return event

    def elapsed(self, now: float) -> float:
        """Seconds the job has run, over all its incarnations (a requeued job's earlier runs count)."""
        if self.state == RUNNING and self.started is not None:
            return self.run_seconds + max(0.0, now - self.started)
        if not self.run_seconds and self.ended is not None and self.started is not None and self.state != PENDING:
            return max(0.0, self.ended - self.started)  # a record from before run_seconds was kept
        return self.run_seconds

    @property
    def request(self) -> TaskRequest:
        """What each task asks for, as the scheduling core reads it."""
        return TaskRequest(self.gpus, self.gpu_memory_gib, self.cpus, self.memory_gib)

    def placements(self) -> tuple[TaskPlacement | None, ...]:
        """Where each task holds resources now (None for a task that holds none)."""
        return tuple(run.placement for run in self.runs)

    def spec(self, predicted_runtime: float | None = None) -> JobSpec:
        """The job as the scheduling core sees it (``predicted_runtime``: for its start estimates and those
        of the jobs behind it, ``gpud.prediction``)."""
        placements = self.placements()
        running = any(p is not None for p in placements)
        return JobSpec(id=self.id, project=self.project, request=self.request, priority=self.priority,
                       tasks=self.tasks, min_tasks=self.min_tasks, submitted=self.submitted,
                       started=self.started if running else None,
                       placements=placements if running else (), node_selector=self.constraint,
                       pool=self.pool, seq=self.seq, user=self.user, checkpointed=self.last_checkpoint,
                       time_limit=self.time_limit_s, predicted_runtime=predicted_runtime)

    def nodes(self) -> list[str]:
        """The nodes the job's tasks hold resources on, in task order, without repeats."""
        seen: dict[str, None] = {}
        for run in self.runs:
            if run.placement is not None:
                seen.setdefault(run.placement.node)
        return list(seen)

    def gpus_held(self) -> float:
        """GPUs (fractions count as their share) the job's tasks hold now."""
        return sum(gpus_of(run.placement) for run in self.runs if run.placement is not None)

    def to_record(self) -> dict[str, Any]:
        """Everything about the job as plain JSON-able data (the store keeps exactly this)."""
        data = {name: getattr(self, name) for name in _SCALARS}
        data["command"] = list(self.command) if self.command is not None else None
        data["env"], data["constraint"] = dict(self.env), dict(self.constraint)
        data["hosts"] = list(self.hosts)
        data["checkpoints"] = [dict(c) for c in self.checkpoints]
        data["depends"] = [{"kind": d.kind, "job": d.job, "met": d.met} for d in self.depends]
        data["runs"] = [_run_record(run) for run in self.runs]
        return data

    def copy(self) -> Job:
        """An independent copy (lists and maps not shared)."""
        return Job.from_record(self.to_record())

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Job:
        """The job back from ``to_record``'s data."""
        data = dict(data)
        runs = []
        for run in data.pop("runs", []):
            run = dict(run)
            placement = run.pop("placement")
            if placement is not None:
                placement = TaskPlacement(placement["node"], tuple(placement["gpu_index"]),
                                          placement["gpu_share"])
            cause = run.pop("cause", None)
            runs.append(TaskRun(placement=placement, cause=ExitCause(cause) if cause else None, **run))
        depends = [Dependency(**dep) for dep in data.pop("depends", [])]
        return cls(runs=runs, depends=depends, **data)


def new_uid() -> str:
    """A fresh job uid: 128 random bits in hex, so no two jobs of any cluster, store or restore share one."""
    return secrets.token_hex(16)


def job_uid(job: Job) -> str:
    """The job's uid; a record from before uids were kept gets one made from its id, seq and submit time."""
    if job.uid:
        return job.uid
    return hashlib.sha256(f"{job.id}/{job.seq}/{job.submitted!r}".encode()).hexdigest()[:32]


def gpus_of(placement: TaskPlacement) -> float:
    """The GPUs one placed task holds: its whole GPUs, or its share of one GPU."""
    if not placement.gpu_index:
        return 0.0
    if placement.gpu_share < 1.0:
        return placement.gpu_share
    return float(len(placement.gpu_index))


_SCALARS = tuple(f.name for f in dataclasses.fields(Job)
                 if f.name not in ("command", "env", "constraint", "hosts", "depends", "runs",
                                                                "checkpoints"))


def _run_record(run: TaskRun) -> dict[str, Any]:
    placement = run.placement
    return {"placement": None if placement is None else {
                "node": placement.node, "gpu_index": list(placement.gpu_index), "gpu_share": placement.gpu_share},
            "attempt": run.attempt, "state": run.state, "pid": run.pid, "exit_code": run.exit_code,
            "term_signal": run.term_signal, "reason": run.reason, "since": run.since,
            "cause": run.cause.value if run.cause is not None else None}
