"""A scheduling cycle's plan carried out: victims stopped (told to checkpoint first when they asked), tasks
placed and started, elastic gangs restarted at their new size; and the checkpoints that settle a victim's loss.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Callable, Iterator

from gpud.controller.checkpoints import FILE, MAX_KEPT, Preemptions, lost_gpu_seconds
from gpud.controller.core_sync import CoreSync
from gpud.controller.event_log import EventLog
from gpud.controller.job_service import JobService
from gpud.controller.node_commands import stop_command
from gpud.controller.outbox import Outbox
from gpud.controller.persist import Persister
from gpud.controller.task_runs import TaskRuns
from gpud.jobs import Job, job_uid
from gpud.lifecycle import PENDING, RUNNING
from gpud.model import Bind, Eviction, Plan
from gpud.policy import Policy
from gpud.reasons import eviction_text


class PlanApplier:
    """Applies plans to the jobs, and keeps the last plan and the preemption victims; see the module docstring."""

    def __init__(self, jobs: dict[str, Job], job_service: JobService, runs: TaskRuns, events: EventLog,
                 outbox: Outbox, core: CoreSync, persist: Persister, clock: Callable[[], float],
                 policy: Callable[[], Policy], wake: Callable[[], None]) -> None:
        self.jobs = jobs
        self.job_service = job_service
        self.runs = runs
        self.events = events
        self.outbox = outbox
        self.core = core
        self.persist = persist
        self.clock = clock
        self.policy = policy
        self.wake = wake
        self.last_plan: Plan | None = None
        self.evictions_by_rule: dict[str, int] = defaultdict(int)
        # Victims told to checkpoint before their stop, and the work preemption lost (gpud.controller.checkpoints).
        self.preemptions = Preemptions()

    def apply(self, plan: Plan, skip: set[str]) -> None:
        """Carry out a cycle's plan: evictions first (tasks stopped or moved), then binds (commands to start);
        jobs in ``skip`` changed since the cycle began and are left as they are."""
        for _ in self.apply_in_steps(plan, skip):
            pass

    def apply_in_steps(self, plan: Plan, skip: set[str]) -> Iterator[None]:
        """:meth:`apply` a job at a time: it yields after the evictions and after each job's binds, so
        that the caller may let others change the cluster between steps.

        ``skip`` is read at each job: it holds the jobs changed since the
        cycle began, whose binds are left out (the scheduler takes them
        again), and the caller may add to it between steps. Once the
        scheduler is to be rebuilt (a node went down, changed or came), the
        binds not yet carried out are dropped: the next cycle places them
        again on what the nodes are now.
        """
        self.last_plan = plan
        now = self.clock()
        # The running elastic gangs the plan grows or shrinks, with their sizes before: looked up by the plan's
        # jobs, not by a walk of every job at each cycle.
        sizes = {}
        for job_id in dict.fromkeys([e.job for e in plan.evictions] + [b.job for b in plan.binds]):
            job = self.jobs.get(job_id)
            if job is not None and job.min_tasks is not None and job.state == RUNNING:
                sizes[job_id] = placed(job)
        self._evict(plan.evictions, skip, now)
        yield
        binds: dict[str, list[Bind]] = defaultdict(list)
        for bind in plan.binds:
            binds[bind.job].append(bind)
        bound: dict[str, list[Bind]] = {}
        # An elastic gang that runs already restarts its tasks with its new ones (_resize): its binds go last.
        for job_id, job_binds in sorted(binds.items(), key=lambda item: item[0] in sizes):
            if self.core.rebuild_needed:
                break
            if job_id in skip or job_id not in self.jobs:
                continue
            self._bind(self.jobs[job_id], job_binds, now)
            bound[job_id] = job_binds
            if job_id not in sizes:
                for node in sorted({b.placement.node for b in job_binds}):
                    self.runs.send_starts(node)
                yield
        starts = {b.placement.node for job_id in sizes for b in bound.get(job_id, ())}
        for job_id, size in sizes.items():
            job = self.jobs.get(job_id)
            if job is not None and job.state == RUNNING and 0 < placed(job) != size:
                fresh = {b.task for b in bound.get(job_id, ())}
                starts |= self._resize(job, size, fresh, now)
        for node in starts:
            self.runs.send_starts(node)

    def _evict(self, evictions: tuple[Eviction, ...], skip: set[str], now: float) -> None:
        """Stop the victims' tasks; a victim left with none is preempted (requeued or ended), unless moved."""
        evicted: dict[str, Eviction] = {}
        for eviction in evictions:
            job = self.jobs.get(eviction.job)
            if job is None or job.id in skip or job.state != RUNNING:
                continue
            self.evictions_by_rule[eviction.rule or "other"] += 1
            verb = "moved" if eviction.moved else "preempted"
            self._tell_victim(job, eviction.tasks, now)
            self.events.record(verb, f"tasks {','.join(map(str, eviction.tasks))} {verb} ({eviction.rule}): "
                                     f"{eviction_words(eviction)}", job=job.id)
            if eviction.moved:
                job.restart_count += 1
            evicted[job.id] = eviction
            self.persist.job(job)
        for job_id, eviction in evicted.items():
            job = self.jobs[job_id]
            if not any(run.placement is not None for run in job.runs) and not eviction.moved:
                self.job_service.preempted(job, eviction_words(eviction))

    def _tell_victim(self, job: Job, tasks: tuple[int, ...], now: float) -> None:
        """Stop a victim's tasks: with its ``--signal`` and a grace of at least its lead when it has one
        (its loss is settled when it checkpoints or the grace ends), else as any stop (its loss at once).

        The whole job's work since its checkpoint counts: any stopped task restarts the whole gang.
        """
        lost = lost_gpu_seconds(job, now)
        if job.warn_signal is None:
            for task in tasks:
                self.runs.stop(job, task, "preempted")
            self.preemptions.charge(job, lost)
            return
        grace = max(self.policy().grace_period_s, job.warn_lead_s)
        stops = [(run.placement.node, task, run.attempt) for task in tasks
                 if (run := job.runs[task]).placement is not None]
        for task in tasks:
            self.runs.stop(job, task, "preempted", signal=job.warn_signal, grace_s=grace,
                           leader_only=job.warn_batch_only)
        self.preemptions.tell(job, stops, now + grace, lost)
        self.events.record("signalled", f"sent SIG{job.warn_signal} to checkpoint within {grace:g} s before its "
                                        f"stop", job=job.id)

    def _bind(self, job: Job, binds: list[Bind], now: float) -> None:
        if job.state == PENDING:
            self.job_service.started(job, sorted({b.placement.node for b in binds}), now)
        for bind in binds:
            self.runs.place(job, bind.task, bind.placement, now)
        self.persist.job(job)

    def _resize(self, job: Job, was: int, fresh: set[int], now: float) -> set[str]:
        """Restart an elastic gang's running tasks on the same GPUs so every rank sees the new world size.

        As torchrun's elastic agents do when members join or leave, the
        whole gang starts again together; ``fresh`` tasks were just placed
        and start with the new size already. Returns the nodes to send starts to.
        """
        size = placed(job)
        nodes: set[str] = set()
        for task, run in enumerate(job.runs):
            placement = run.placement
            if placement is None or task in fresh:
                continue
            self.runs.stop(job, task, f"the gang resized from {was} to {size} tasks")
            self.runs.place(job, task, placement, now)
            nodes.add(placement.node)
        self.events.record("resized", f"runs {size} of its {job.tasks} tasks (was {was}); every task restarts "
                                      f"with WORLD_SIZE={size}", job=job.id)
        self.persist.job(job)
        return nodes

    # ---------------------------------------------------------- checkpoints

    def checkpointed(self, job: Job, at: float, source: str) -> None:
        """Record that the job has a complete checkpoint as of ``at``; a victim within its grace is stopped
        now and loses nothing more."""
        told = self.preemptions.checkpointed(job)
        restart = job.restart_count if told is None else told.restart  # the stopping run's, within its grace
        job.last_checkpoint = at if job.last_checkpoint is None else max(job.last_checkpoint, at)
        job.checkpoints.append({"at": at, "source": source, "restart": restart})
        del job.checkpoints[:-MAX_KEPT]
        self.events.record("checkpointed", f"checkpoint recorded ({source}, restart {restart})", job=job.id)
        if told is not None:
            for node, task, attempt in told.stops:
                self.outbox.put(node, stop_command(job.id, task, attempt, "preempted", 0.0, job_uid(job),
                                                   hasten=True))
            self.events.record("stopped", "checkpointed within its grace: stopped now, no work lost", job=job.id)
        if job.state == RUNNING and job.id in self.core.in_core:
            self.core.reset(self.job_service.core_spec(job))
            self.wake()
        self.persist.job(job)

    def checkpoint_marked(self, node: str, message: dict) -> bool:
        """A node saw a new checkpoint marker file of a job it runs; True when it was recorded.

        The marker's time counts, but never later than now; a marker no newer
        than the job's last checkpoint (one seen again after a restart) is not
        a new checkpoint.
        """
        job_id = str(message.get("job"))
        job = self.jobs.get(job_id) or self.preemptions.victim(job_id)
        at = message.get("at")
        if (job is None or job_uid(job) != message.get("job_uid") or isinstance(at, bool)
                or not isinstance(at, (int, float)) or not math.isfinite(at)):
            return False
        runs_there = any(run.placement is not None and run.placement.node == node for run in job.runs)
        if not runs_there and not (job.id in self.preemptions.told and node in job.hosts):
            return False
        at = min(float(at), self.clock())
        if job.last_checkpoint is not None and at <= job.last_checkpoint:
            return False
        self.checkpointed(job, at, FILE)
        return True

    def settle_preemptions(self) -> None:
        """Charge the victims whose grace ended without a checkpoint with the work they lost."""
        for job in self.preemptions.settle(self.clock()):
            self.persist.job(job)


def placed(job: Job) -> int:
    """How many of the job's tasks hold a placement."""
    return sum(1 for run in job.runs if run.placement is not None)


def eviction_words(eviction: Eviction) -> str:
    """Why an eviction was made, for people."""
    return eviction_text(eviction.why) if eviction.why is not None else eviction.rule
