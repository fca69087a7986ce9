"""Why an active job waits and when it should start, as the API and the dashboard show it.

Read from the job, what it waits for outside the scheduler (a hold, a
dependency, an earlier copy of itself, a silent node's lease, its array's
limit) and the last cycle's plan, worded by gpud.controller.job_reason;
nothing here changes the cluster.
"""

from __future__ import annotations

from typing import Callable

from gpud.controller.completing import Completing
from gpud.controller.core_sync import CoreSync
from gpud.controller.job_reason import JobReason, job_reason
from gpud.controller.plan_apply import PlanApplier
from gpud.jobs import Job
from gpud.lifecycle import PENDING
from gpud.model import Plan, Waiting
from gpud.policy import Policy


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
        self.current_policy = policy

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

    @property
    def policy(self) -> Policy:
        """The policy in force."""
        return self.current_policy()

    @property
    def last_plan(self) -> Plan | None:
        """The last plan carried out (None before the first cycle)."""
        return self.plans.last_plan

    def reason(self, job: Job) -> JobReason:
        """Why the job waits (or how it ended), as a code beside its words (gpud.controller.job_reason)."""
        return job_reason(self, job)

    def reason_of(self, job: Job) -> str:
        """Why the job waits (or how it ended), with numbers where the scheduler gave them."""
        return job_reason(self, job).text
