"""Why a job waits (or what of it still waits), as a code beside its words.

The API shows both (docs/api.md): ``reason`` for people and ``reason_code`` and
``reason_short`` for programs and narrow columns, so that no client has to read
the words back to learn what kind of reason it is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpud.controller.completing import completing_text
from gpud.core.blockers import (CONSTRAINT, EVICTED, FRAGMENTED_RULE, GANG, LIMIT, NO_NODES, NO_OVER_QUOTA,
                                NODE_SIZE, NOT_CONSIDERED, PREEMPT_OVER, PREEMPT_SHARE, QUOTA, RUNNING_JOBS, SHORTAGE,
                                UNKNOWN_PROJECT, USER_GPUS)
from gpud.jobs import Job
from gpud.lifecycle import PENDING, RUNNING
from gpud.model import Waiting
from gpud.reasons import waiting_clauses

if TYPE_CHECKING:
    from gpud.controller.job_waits import JobWaits as Cluster  # what a job's reason is read from

# Codes of the reasons the controller decides itself; a scheduler's reason has its rule's code (gpud/core/blockers.py).
UNDECIDED = "undecided"          # no scheduling cycle has judged the job yet
REQUEUED = "requeued"            # requeued, and no cycle has judged it since
HELD = "held"
DEPENDENCY = "dependency"        # a job it depends on has not ended yet
DEPENDENCY_NEVER = "dependency_never_met"
COMPLETING = "completing"        # its previous run is still being stopped
FENCED = "fenced"                # a lost node's lease has not run out yet
ARRAY_LIMIT = "array_limit"
QUEUE = "queue"                  # the scheduler gave only its queue's standing
PARTIAL = "partial"              # an elastic job runs some of its tasks; the others wait
CONTROLLER_CODES = (UNDECIDED, REQUEUED, HELD, DEPENDENCY, DEPENDENCY_NEVER, COMPLETING, FENCED, ARRAY_LIMIT, QUEUE,
                    PARTIAL)
# Every code a job view's reason_code may hold (besides null).
REASON_CODES = CONTROLLER_CODES + (NO_NODES, CONSTRAINT, NODE_SIZE, SHORTAGE, GANG, FRAGMENTED_RULE, LIMIT, QUOTA,
                                   NO_OVER_QUOTA, PREEMPT_SHARE, PREEMPT_OVER, UNKNOWN_PROJECT, NOT_CONSIDERED, EVICTED,
                                   RUNNING_JOBS, USER_GPUS)


@dataclass(frozen=True, slots=True)
class JobReason:
    """A job's reason: ``code`` says its kind (None for a job with none, or one that ended), ``clauses`` its words."""

    code: str | None
    clauses: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """The whole reason, for people: its clauses joined by ``; ``."""
        return "; ".join(self.clauses)

    @property
    def short(self) -> str:
        """The leading clause (the queue's standing, or the reason itself), for narrow columns."""
        return self.clauses[0] if self.clauses else ""


def recorded(text: str) -> JobReason:
    """The reason a job kept when it ended (``Job.reason``): words only, no code."""
    return JobReason(None, (text,) if text else ())


def job_reason(cluster: Cluster, job: Job) -> JobReason:
    """Why ``job`` waits, or what of it waits while it runs, as the controller and its last cycle see it.

    A running elastic job with tasks still waiting says so the same way every
    cycle: ``runs 2 of its 4 tasks; the others wait: <its queue; its blocker>``.
    """
    if job.state == RUNNING and job.id in cluster.completing and any(run.state == "starting" for run in job.runs):
        # Moved or restarted: its new tasks start once the old ones are gone.
        return JobReason(COMPLETING, (completing_text(cluster.completing.of(job.id), cluster.clock(),
                                                      cluster.policy.grace_period_s),))
    if job.state == RUNNING and job.min_tasks is not None and any(run.placement is None for run in job.runs):
        waiting = cluster.last_plan.pending.get(job.id) if cluster.last_plan is not None else None
        head = f"runs {sum(1 for run in job.runs if run.placement is not None)} of its {job.tasks} tasks"
        if waiting is None:
            return JobReason(PARTIAL, (head,))
        return JobReason(PARTIAL, (head, "the others wait: " + "; ".join(waiting_clauses(_others(waiting)))))
    if job.state != PENDING:
        return recorded(job.reason)
    blocked = _blocked(cluster, job)
    if blocked is not None:
        return blocked
    waiting = cluster.waiting_of(job)
    if waiting is not None:
        return JobReason(waiting.blocker.rule if waiting.blocker is not None else QUEUE, waiting_clauses(waiting))
    if job.reason:
        return JobReason(REQUEUED, (job.reason,))
    return JobReason(UNDECIDED, ("waiting for the next scheduling cycle",))


def _others(waiting: Waiting) -> Waiting:
    """Why the tasks of a running elastic job that did not start wait, without the count of those that run.

    The cycle that starts the job puts that count in its blocker; later
    cycles do not, and the job's reason must read the same after either.
    """
    blocker = waiting.blocker
    if blocker is None or not blocker.runs:
        return waiting
    return dataclasses.replace(waiting, blocker=dataclasses.replace(blocker, runs=0, of_tasks=0))


def _blocked(cluster: Cluster, job: Job) -> JobReason | None:
    """The reason of a pending job the controller keeps from the scheduler; None when it keeps it from none."""
    if job.hold:
        return JobReason(HELD, (f"held: run gpuctl release {job.id}",))
    for dep in job.depends:
        if dep.met is False:
            return JobReason(DEPENDENCY_NEVER,
                             (f"dependency can never be met: job {dep.job} did not end as {dep.kind} needs",))
        if dep.met is None:
            return JobReason(DEPENDENCY, (f"waiting for job {dep.job} to end ({dep.kind})",))
    if job.id in cluster.completing:
        return JobReason(COMPLETING, (completing_text(cluster.completing.of(job.id), cluster.clock(),
                                                      cluster.policy.grace_period_s),))
    if job.id in cluster.fenced:
        until, node = cluster.fenced[job.id]
        return JobReason(FENCED, (f"waiting {max(0.0, until - cluster.clock()):.0f} s more for node {node}'s lease "
                                  f"and grace period to run out, so that no two copies of the job run at once",))
    if job.array_limit is not None and job.id not in cluster.core.in_core:
        return JobReason(ARRAY_LIMIT, (f"array {job.array_id} already has its limit of {job.array_limit} elements "
                                       f"queued or running",))
    return None
