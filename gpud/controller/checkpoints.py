"""Checkpoints and the work preemption loses: a job's scoped checkpoint credential, the checkpoints it
reports, and the victims told first (their signal, a grace to checkpoint in, the stop, the work lost).

A victim with ``--signal SIG@LEAD`` is stopped with SIG and a grace of at
least LEAD seconds; a checkpoint it reports within that grace stops it at
once and it loses nothing more. When the grace ends without one, it lost
the GPU-seconds since its last checkpoint (or its start) at the eviction.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from gpud.jobs import Job, gpus_of, job_uid

TOKEN_PREFIX = "gpudckpt_"
MAX_KEPT = 50  # the checkpoints a job's record lists (the events list every one)
COMMAND = "command"  # gpuctl checkpointed (a checkpoint's ``source``)
FILE = "file"  # the marker file in the checkpoint directory, seen by the node (gpud.node.ckptwatch)


def checkpoint_token(secret: str, job: Job) -> str:
    """The credential a job's tasks get in GPUD_CHECKPOINT_TOKEN: it records checkpoints of this job
    (this very job: its uid, not its id) and does nothing else."""
    mac = hmac.new(secret.encode(), f"checkpoint/{job_uid(job)}".encode(), hashlib.sha256).hexdigest()
    return TOKEN_PREFIX + mac


def is_checkpoint_token(token: str) -> bool:
    """True for a token that looks like a checkpoint credential (it is checked against a job later)."""
    return token.startswith(TOKEN_PREFIX)


def token_matches(secret: str, job: Job, token: str) -> bool:
    """True when ``token`` is ``job``'s checkpoint credential."""
    return hmac.compare_digest(checkpoint_token(secret, job).encode(), token.encode())


def lost_gpu_seconds(job: Job, at: float) -> float:
    """The GPU-seconds the job's running tasks would lose if stopped at ``at``: since its last checkpoint,
    or since the task started when it has none (or checkpointed before this start)."""
    lost = 0.0
    for run in job.runs:
        if run.placement is None or run.since is None:
            continue
        since = run.since
        if job.last_checkpoint is not None and job.last_checkpoint > since:
            since = job.last_checkpoint
        lost += gpus_of(run.placement) * max(0.0, at - since)
    return lost


@dataclass(slots=True)
class Told:
    """A victim told to checkpoint: the job (kept after it ends, as a victim with ``--no-requeue`` does at
    once), the stop commands' keys, until when, what it loses if none comes, and the restart count of the
    run being stopped (a checkpoint within the grace is that run's)."""

    job: Job
    stops: list[tuple[str, int, int]]  # (node, task, attempt) of each stopped task
    until: float
    lost: float
    restart: int


class Preemptions:
    """The victims within their grace, and the work lost by project (``gpud_preemption_lost_gpu_seconds_total``)."""

    def __init__(self) -> None:
        self.told: dict[str, Told] = {}
        self.lost_by_project: dict[str, float] = {}

    def tell(self, job: Job, stops: list[tuple[str, int, int]], until: float, lost: float) -> None:
        """Note a victim stopped with its signal; its loss is settled by ``checkpointed`` or ``settle``."""
        found = self.told.get(job.id)
        if found is not None:
            found.stops.extend(stops)
            found.until, found.lost = max(found.until, until), found.lost + lost
        else:
            self.told[job.id] = Told(job, list(stops), until, lost, job.restart_count)

    def charge(self, job: Job, lost: float) -> None:
        """Record ``lost`` GPU-seconds against the job and its project."""
        job.lost_gpu_seconds += lost
        self.lost_by_project[job.project] = self.lost_by_project.get(job.project, 0.0) + lost

    def victim(self, job_id: str) -> Job | None:
        """The job of a victim within its grace, whether it waits again or has ended; None for any other."""
        told = self.told.get(job_id)
        return None if told is None else told.job

    def checkpointed(self, job: Job) -> Told | None:
        """The job reported a checkpoint: if it was within its grace, it loses nothing and is to be stopped
        now (the told entry, whose stops to send again with no grace); None otherwise."""
        return self.told.pop(job.id, None)

    def settle(self, now: float) -> list[Job]:
        """Charge the victims whose grace ended without a checkpoint; returns their jobs, ended ones too."""
        done = [job_id for job_id, told in self.told.items() if told.until <= now]
        charged = []
        for job_id in done:
            told = self.told.pop(job_id)
            self.charge(told.job, told.lost)
            charged.append(told.job)
        return charged
