"""Why an active job waits and when it should start, as the API and the dashboard show it.

Read from the job, what it waits for outside the scheduler (a hold, a
dependency, an earlier copy of itself, a silent node's lease, its array's
limit) and the last cycle's plan; nothing here changes the cluster.
"""

from __future__ import annotations

from typing import Callable

from gpud.controller.completing import Completing, completing_text
from gpud.controller.core_sync import CoreSync
from gpud.controller.plan_apply import PlanApplier, placed
from gpud.jobs import Job
from gpud.lifecycle import PENDING, RUN_STARTING, RUNNING
from gpud.model import Waiting
from gpud.policy import Policy
from gpud.reasons import waiting_text


class JobWaits:
    """Answers why a job waits and when it is expected to start; see the module docstring."""

    def __init__(self, core: CoreSync, plans: PlanApplier, completing: Completing,
                 fenced: dict[str, tuple[float, str]], clock: Callable[[], float],
                 policy: Callable[[], Policy]) -> None:
        self.core = core
        self.plans = plans
        self.completing = completing
        self.fenced = fenced
        self.clock = clock
        self.policy = policy

    def waiting_of(self, job: Job) -> Waiting | None:
        """Why the last cycle left the job waiting, as the scheduler's data; None when it did not judge it."""
        last_plan = self.plans.last_plan
        if job.id in self.core.in_core and last_plan is not None and not self.core.rebuild_needed:
            return last_plan.pending.get(job.id)
        return None

    def start_of(self, job: Job) -> dict:
        """When a pending job is expected to start, from the last cycle's plan, as the API shows it:
        ``estimated_start`` (the expected start, from predicted run times; None when there is none),
        ``reserved_start`` (the start it holds room for, from running jobs' time limits; None when it
        holds none), ``start_nodes``, and ``no_estimate``, a code saying why there is none: "held",
        "dependency", "queue_rule" (its quota, limits or fair share: it waits on its own or other
        projects' jobs), "no_time_limits" (no running job it waits on has a time limit), "not_planned"
        (beyond the jobs the pool plans each cycle) or "not_pending"."""
        found: dict = {"estimated_start": None, "reserved_start": None, "start_nodes": [], "no_estimate": None}
        if job.state != PENDING:
            found["no_estimate"] = "not_pending"
            return found
        if job.hold:
            found["no_estimate"] = "held"
            return found
        if any(dep.met is not True for dep in job.depends):
            found["no_estimate"] = "dependency"
            return found
        plan = self.plans.last_plan
        reservation = plan.reservations.get(job.id) if plan is not None and job.id in self.core.in_core else None
        if reservation is not None:
            found["estimated_start"] = reservation.estimate
            found["reserved_start"] = reservation.start if reservation.holds else None
            found["start_nodes"] = list(reservation.nodes)
            return found
        waiting = self.waiting_of(job)
        rule = waiting.blocker.rule if waiting is not None and waiting.blocker is not None else ""
        if rule in ("shortage", "gang", "fragmented"):
            found["no_estimate"] = "not_planned" if job.time_limit_s is not None else "no_time_limits"
        else:
            found["no_estimate"] = "queue_rule" if rule else "not_planned"
        return found

    def reason_of(self, job: Job) -> str:
        """Why the job waits (or how it ended), with numbers where the scheduler gave them.

        A running elastic job with tasks still waiting says so: ``runs 2 of
        its 4 tasks; the others wait: ...``.
        """
        if job.state == RUNNING and job.id in self.completing and any(run.state == RUN_STARTING
                                                                      for run in job.runs):
            # Moved or restarted: its new tasks start once the old ones are gone.
            return completing_text(self.completing.of(job.id), self.clock(), self.policy().grace_period_s)
        if job.state == RUNNING and job.min_tasks is not None and any(run.placement is None for run in job.runs):
            last_plan = self.plans.last_plan
            waiting = last_plan.pending.get(job.id) if last_plan is not None else None
            head = f"runs {placed(job)} of its {job.tasks} tasks"
            if waiting is None:
                return head
            # The cycle that starts the job says how many run; later cycles give only why the others wait.
            if waiting.blocker is not None and waiting.blocker.runs:
                return waiting_text(waiting)
            return f"{head}; the others wait: {waiting_text(waiting)}"
        if job.state != PENDING:
            return job.reason
        blocked = self._blocked_reason(job)
        if blocked:
            return blocked
        waiting = self.waiting_of(job)
        if waiting is not None:
            return waiting_text(waiting)
        return job.reason or "waiting for the next scheduling cycle"

    def _blocked_reason(self, job: Job) -> str:
        """What the job waits for outside the scheduler, or "" when nothing."""
        if job.hold:
            return f"held: run gpuctl release {job.id}"
        for dep in job.depends:
            if dep.met is False:
                return f"dependency can never be met: job {dep.job} did not end as {dep.kind} needs"
            if dep.met is None:
                return f"waiting for job {dep.job} to end ({dep.kind})"
        if job.id in self.completing:
            return completing_text(self.completing.of(job.id), self.clock(), self.policy().grace_period_s)
        if job.id in self.fenced:
            until, node = self.fenced[job.id]
            return (f"waiting {max(0.0, until - self.clock()):.0f} s more for node {node}'s lease and grace period "
                    f"to run out, so that no two copies of the job run at once")
        if job.array_limit is not None and job.id not in self.core.in_core:
            return f"array {job.array_id} already has its limit of {job.array_limit} elements queued or running"
        return ""
