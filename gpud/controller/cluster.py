"""The controller's state machine: jobs, their tasks on nodes, and the scheduler's plans carried out.

``Cluster`` composes the services that each own one part of it and hands
each the parts it uses, in its constructor (docs/developer/controller.md):

- ``job_service`` (gpud/controller/job_service.py): jobs, arrays, dependencies, lifecycle moves;
- ``node_messages`` (gpud/controller/node_messages.py): nodes, registrations, heartbeats, task reports,
  leases and fencing;
- ``runs`` (gpud/controller/task_runs.py): task runs placed on nodes, started and stopped;
- ``plans`` (gpud/controller/plan_apply.py): a cycle's plan carried out, preemption victims, checkpoints;
- ``waits`` (gpud/controller/job_waits.py): why a job waits and when it should start;
- ``outbox`` (gpud/controller/outbox.py) and ``events`` (gpud/controller/event_log.py).

Everything here runs on the event loop thread and does no I/O: changes are
marked on the persister, commands for nodes pile up in the outbox, and the
caller flushes the one and delivers the other (``Controller.commit``).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from gpud.controller.completing import Completing
from gpud.controller.core_sync import CoreSync
from gpud.controller.event_log import EventLog
from gpud.controller.job_events import JobEvents
from gpud.controller.job_service import JobService
from gpud.controller.job_waits import JobWaits
from gpud.controller.node_messages import NodeMessages
from gpud.controller.nodes import NodeRecord
from gpud.controller.outbox import Outbox
from gpud.controller.persist import Persister
from gpud.controller.plan_apply import PlanApplier
from gpud.controller.task_runs import TaskRuns
from gpud.jobs import Job
from gpud.model import Plan
from gpud.policy import Policy


class Cluster:
    """Jobs, nodes and the scheduler's view of them, kept consistent by the services it composes."""

    def __init__(self, policy: Policy, pm: Any, persister: Persister,
                 clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self.clock = clock
        self.persist = persister
        self.core = CoreSync(policy, pm)
        self.job_events = JobEvents(pm)
        self.jobs: dict[str, Job] = {}
        self.nodes: dict[str, NodeRecord] = {}
        # Jobs an earlier incarnation of which a node is still stopping: they start nowhere until it has ended.
        self.completing = Completing()
        # Requeued jobs that may not run before a time (their silent node's lease and grace period), and that node.
        self.fenced: dict[str, tuple[float, str]] = {}
        self.wake: Callable[[], None] = lambda: None  # told when something may be scheduled now

        def current_policy() -> Policy:
            return self.policy

        def wake() -> None:
            self.wake()
        self.outbox = Outbox()
        self.events = EventLog(persister, clock, self.job_events, self.jobs)
        self.runs = TaskRuns(self.jobs, self.nodes, self.outbox, self.completing, self.fenced, persister, clock,
                             current_policy)
        self.job_service = JobService(self.jobs, self.core, self.runs, self.events, self.outbox, persister, clock,
                                      current_policy, self.completing, self.fenced, wake)
        self.plans = PlanApplier(self.jobs, self.job_service, self.runs, self.events, self.outbox, self.core,
                                 persister, clock, current_policy, wake)
        self.node_messages = NodeMessages(self.nodes, self.jobs, self.job_service, self.runs, self.events,
                                          self.outbox, self.core, persister, clock, current_policy,
                                          self.completing, self.fenced, wake)
        self.waits = JobWaits(self.core, self.plans, self.completing, self.fenced, clock, current_policy)

    @property
    def last_plan(self) -> Plan | None:
        """The last plan carried out (None before the first cycle)."""
        return self.plans.last_plan

    def restore(self, jobs: Iterable[Job], nodes: Iterable[NodeRecord], next_seq: int) -> None:
        """Take back what the store held after a restart: nodes wait to re-register, jobs resume."""
        now = self.clock()
        self.node_messages.restore(list(nodes), now)
        jobs = list(jobs)
        for job in jobs:
            self.runs.restore(job, now)
        self.job_service.restore(jobs, next_seq)

    def set_policy(self, policy: Policy, pm: Any) -> None:
        """Use a new policy from the next cycle on."""
        self.policy = policy
        self.core.rebuild(policy, pm)
        self.job_events.pm = pm
        self.wake()
