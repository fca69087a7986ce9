"""The controller's state machine: jobs, their tasks on nodes, and the scheduler's plans carried out.

Everything here runs on the event loop thread and does no I/O: changes are
marked on the persister, commands for nodes pile up in ``outbox``, and the
caller flushes the one and delivers the other (``Controller.commit``).
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from typing import Any, Callable, Iterable, Iterator

from gpud import slurm_env
from gpud.controller.checkpoints import FILE, MAX_KEPT, Preemptions, checkpoint_token, lost_gpu_seconds
from gpud.controller.completing import Completing, completing_text
from gpud.controller.core_sync import CoreSync
from gpud.controller.job_events import JobEvents
from gpud.controller.listing_order import ListingOrder
from gpud.controller.node_messages import RESEND_START_AFTER_S, NodeMessages
from gpud.controller.nodes import DOWN, NodeRecord, incarnation_key
from gpud.controller.node_commands import purge_command, start_command, stop_command
from gpud.controller.persist import Persister
from gpud.jobs import Job, TaskRun, gpus_of, job_uid, new_uid
from gpud.lifecycle import CANCELLED, COMPLETED, FAILED, PENDING, PREEMPTED, RUNNING, TIMEOUT, is_finished
from gpud.model import Eviction, JobSpec, Plan, TaskPlacement, Waiting
from gpud.prediction import RuntimePredictor
from gpud.policy import Policy
from gpud.reasons import eviction_text, waiting_text
from gpud.store import Event
from gpud.submission import Capacity, Submission

log = logging.getLogger("gpud.controller")
SUBMITTED = "submitted"
RECENTLY_ENDED = 10_000


class Cluster(NodeMessages):
    """Jobs, nodes and the scheduler's view of them, kept consistent; see the module docstring."""

    def __init__(self, policy: Policy, pm: Any, persister: Persister,
                 clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self.core = CoreSync(policy, pm)
        self.job_events = JobEvents(pm)
        self.persist = persister
        self.clock = clock
        self.jobs: dict[str, Job] = {}
        # Run times of the jobs that completed, by user and shape: predicted ends for start estimates.
        self.predictor = RuntimePredictor()
        self.listing = ListingOrder()  # the same jobs in the job list's order: a page bisects from its cursor
        self.nodes: dict[str, NodeRecord] = {}
        self.arrays: dict[str, dict[str, None]] = {}  # each array's active elements, in order
        self.array_queued: dict[str | None, int] = defaultdict(int)  # each array's elements in the scheduler
        self.staged: dict[str, Job] = {}     # submitted, not yet durable: see stage()
        self.staged_changed: set[str] = set()
        # How the last jobs ended, for submits that looked their dependencies up before they ended.
        self.recently_ended: dict[str, str] = {}
        self.dependents: dict[str, set[str]] = defaultdict(set)
        self.next_seq = 1
        self.outbox: dict[str, list[dict]] = defaultdict(list)
        self.commands_made = 0  # commands put in the outbox so far: whoever made some commits to send them
        self.connected: set[str] = set()
        self.wanted: dict[str, dict[str, tuple[str, int]]] = defaultdict(dict)
        self.unsent: dict[str, dict[str, float]] = defaultdict(dict)
        self.sent_at: dict[str, float] = {}
        # How long a start may go unseen in the node's heartbeats before it is sent again on the same connection.
        # A WebSocket loses no order, so a heartbeat without the task was most likely written before the order
        # arrived and read late by a busy controller: resending then only adds to the work (the controller sets
        # this to the node's lease; a node that reconnects is sent its starts again at once).
        self.resend_start_after_s = RESEND_START_AFTER_S
        self.last_plan: Plan | None = None
        self.evictions_by_rule: dict[str, int] = defaultdict(int)
        self.finished_by_state: dict[str, int] = defaultdict(int)
        self.timed: set[str] = set()
        # Victims told to checkpoint before their stop, and the work preemption lost (gpud.controller.checkpoints).
        self.preemptions = Preemptions()
        self.task_secret = ""  # signs each job's checkpoint credential: the cluster key
        # Requeued jobs that may not run before a time (their silent node's lease and grace period), and that node.
        self.fenced: dict[str, tuple[float, str]] = {}
        # Jobs an earlier incarnation of which a node is still stopping: they start nowhere until it has ended.
        self.completing = Completing()
        self.wake: Callable[[], None] = lambda: None
        # Told when a task stops holding its placement, and when (usage is charged up to there).
        self.run_ended: Callable[[Job, TaskRun, float], None] = lambda job, run, end: None
        self._largest: Capacity | None = None
        self._deferred: set[str] | None = None  # arrays to refill once a change of many jobs is done  # the largest node's resources, until a node changes

    # ----------------------------------------------------------------- loading

    def restore(self, jobs: Iterable[Job], nodes: Iterable[NodeRecord], next_seq: int) -> None:
        """Take back what the store held after a restart: nodes wait to re-register, jobs resume."""
        now = self.clock()
        for node in nodes:
            node.last_seen = now
            self.nodes[node.name] = node
            for key in node.stopping:
                self.completing.add(node.name, key, now)
        self.nodes_changed()
        for job in jobs:
            self._add(job)
            for task, run in enumerate(job.runs):
                if run.placement is not None:
                    key = incarnation_key(job.id, task, run.attempt)
                    self.wanted[run.placement.node][key] = (job.id, task)
                    if run.state == "starting":
                        self.unsent[run.placement.node][key] = now
        self.next_seq = next_seq
        for job in list(self.jobs.values()):
            self._sync_core(job)

    def nodes_changed(self) -> None:
        """A node was added or its resources changed: the largest node is worked out again when asked."""
        self._largest = None

    def largest_node(self) -> Capacity:
        """The largest resources any node has (None everywhere when no node ever registered).

        Worked out once per change of the nodes, not per submit: a cluster
        of a thousand nodes would otherwise walk them all for every job.
        """
        if self._largest is None:
            nodes = list(self.nodes.values())
            self._largest = Capacity() if not nodes else Capacity(
                max_gpus=max(len(n.gpus) for n in nodes),
                max_gpu_memory_gib=max((g.memory_gib for n in nodes for g in n.gpus), default=0.0),
                max_cpus=max(n.cpus for n in nodes), max_memory_gib=max(n.memory_gib for n in nodes),
                labels=tuple(sorted({tuple(sorted(n.labels.items())) for n in nodes})),
                sized=_sized(nodes))
        return self._largest

    # ------------------------------------------------------------------- jobs

    def submit(self, submissions: list[Submission], finished_states: dict[str, str]) -> list[str]:
        """Accept checked jobs (arrays expanded) at once; returns their ids. Durable after the next flush.

        The API stages, commits and only then accepts (see ``stage``); this is
        for callers that drive the state machine directly.
        """
        jobs = self.stage(submissions, finished_states)
        for job in jobs:
            self.persist.job(job)
        self.accept(jobs)
        return [job.id for job in jobs]

    def stage(self, submissions: list[Submission], finished_states: dict[str, str]) -> list[Job]:
        """Give checked jobs their ids (arrays expanded) without making them part of the cluster yet.

        A staged job is in no queue, array or scheduler: it becomes one with
        ``accept`` once its records are durable, or is forgotten with ``drop``.
        Meanwhile it hears of its dependencies ending, so none is missed.
        """
        return [job for part in self.stage_in_parts(submissions, finished_states) for job in part]

    def stage_in_parts(self, submissions: list[Submission], finished_states: dict[str, str],
                       part: int = 2000) -> Iterator[list[Job]]:
        """``stage``, yielding the staged jobs about ``part`` at a time, so a caller may pause between parts.

        Ids are given as the parts are made; staged jobs are invisible to
        everyone else, so pausing changes nothing another request can see.
        """
        now = self.clock()
        added: list[Job] = []
        for submission in submissions:
            seq = self.next_seq
            self.next_seq += 1
            template = submission.job
            if submission.array_indices is None:
                template.id, template.seq, template.submitted = str(seq), seq, now
                template.uid = new_uid()
                added.append(template)
                continue
            array_id = str(seq)
            span = slurm_env.array_span(submission.array_indices)
            for index in submission.array_indices:
                job = self._new_job(template, f"{seq}_{index}", seq, now)
                job.array_id, job.array_index, job.array_limit = array_id, index, submission.array_limit
                job.env = {**job.env, "GPUD_ARRAY_JOB_ID": array_id, "GPUD_ARRAY_TASK_ID": str(index),
                           **slurm_env.array_vars(array_id, index, span)}
                added.append(job)
                if len(added) >= part:
                    yield self._stage_part(added, finished_states)
                    added = []
        if added:
            yield self._stage_part(added, finished_states)

    def _stage_part(self, added: list[Job], finished_states: dict[str, str]) -> list[Job]:
        for job in added:
            job.depends = [dep for original in job.depends for dep in self._expand_dependency(original)]
            for dep in job.depends:
                if dep.job not in self.jobs:
                    ended = self.recently_ended.get(dep.job) or finished_states.get(dep.job, FAILED)
                    dep.met = _dependency_met(dep.kind, ended)
                if dep.met is None:
                    self.dependents[dep.job].add(job.id)
            self.staged[job.id] = job
        return added

    def accept(self, jobs: list[Job]) -> None:
        """Make staged jobs part of the cluster: queued, in their arrays, seen by the scheduler."""
        elements: dict[str, int] = {}
        for job in jobs:
            self.staged.pop(job.id, None)
            self._add(job)
            if job.id in self.staged_changed:
                self.staged_changed.discard(job.id)
                self.persist.job(job)  # a dependency ended while its first record was written
                self.persist.flush_soon()
            # Not stored: the job's record says as much (see submitted_event), one row less per submit.
            if job.array_id is None:
                self._event(SUBMITTED, submitted_message(job), job=job.id, store=False)
            else:  # one log line per array, not per element: see below
                self.job_events.emit(SUBMITTED, job, submitted_message(job))
                elements[job.array_id] = elements.get(job.array_id, 0) + 1
        for array_id, count in elements.items():
            log.info("event=%s job=%s node=- %s (array of %d elements)", SUBMITTED, array_id,
                     submitted_message(self.jobs[next(iter(self.arrays[array_id]))]), count)
        for job in jobs:
            self._sync_core(job)
        self.wake()

    def drop(self, jobs: list[Job]) -> None:
        """Forget staged jobs whose records could not be stored: nothing of them remains."""
        for job in jobs:
            self.staged.pop(job.id, None)
            self.staged_changed.discard(job.id)
            for dep in job.depends:
                waiting = self.dependents.get(dep.job)
                if waiting is not None:
                    waiting.discard(job.id)
                    if not waiting:
                        del self.dependents[dep.job]

    def unknown_dependencies(self, targets: Iterable[str]) -> list[str]:
        """The dependency targets that are neither active jobs nor arrays (the store may know them)."""
        return [t for t in targets if t not in self.jobs and t not in self.arrays]

    def select(self, job_id: str) -> list[Job]:
        """The active job with this id, or every active element of the array with this id."""
        if job_id in self.jobs:
            return [self.jobs[job_id]]
        return [self.jobs[i] for i in self.arrays.get(job_id, ()) if i in self.jobs]

    def cancel(self, job: Job, by: str) -> None:
        """Cancel a pending or running job; its tasks are stopped with the policy's grace period."""
        self._finish(job, CANCELLED, f"cancelled by {by}", stop_reason="cancelled")
        self.wake()

    def end(self, job: Job, state: str, reason: str, stop_reason: str) -> None:
        """End an active job for a reason of the controller's own (an idle terminal, one left detached)."""
        self._finish(job, state, reason, stop_reason=stop_reason)
        self.wake()

    def hold(self, job: Job, by: str) -> bool:
        """Hold a pending job (it stays PENDING and is not scheduled); False when it is not pending."""
        if job.state != PENDING or job.hold:
            return False
        job.hold = True
        self._event("held", f"held by {by}", job=job.id)
        self._sync_core(job)
        self.persist.job(job)
        if job.array_id is not None and job.array_limit is not None:
            self._room_made(job.array_id)  # a held element leaves its place in the array's limit to the next
        return True

    def release(self, job: Job, by: str) -> bool:
        """Release a held job; False when it was not held."""
        if not job.hold:
            return False
        job.hold = False
        self._event("released", f"released by {by}", job=job.id)
        self._sync_core(job)
        self.persist.job(job)
        self.wake()
        return True

    def waiting_of(self, job: Job) -> Waiting | None:
        """Why the last cycle left the job waiting, as the scheduler's data; None when it did not judge it."""
        if job.id in self.core.in_core and self.last_plan is not None and not self.core.rebuild_needed:
            return self.last_plan.pending.get(job.id)
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
        plan = self.last_plan
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
        if job.state == RUNNING and job.id in self.completing and any(run.state == "starting" for run in job.runs):
            # Moved or restarted: its new tasks start once the old ones are gone.
            return completing_text(self.completing.of(job.id), self.clock(), self.policy.grace_period_s)
        if job.state == RUNNING and job.min_tasks is not None and any(run.placement is None for run in job.runs):
            waiting = self.last_plan.pending.get(job.id) if self.last_plan is not None else None
            head = f"runs {_placed(job)} of its {job.tasks} tasks"
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

    # ------------------------------------------------------------------ plans

    def apply_plan(self, plan: Plan, skip: set[str]) -> None:
        """Carry out a cycle's plan: evictions first (tasks stopped or moved), then binds (commands to start)."""
        for _ in self.apply_plan_in_steps(plan, skip):
            pass

    def apply_plan_in_steps(self, plan: Plan, skip: set[str]) -> Iterator[None]:
        """:meth:`apply_plan` a job at a time: it yields after the evictions and after each job's binds, so
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
        sizes = {job.id: _placed(job) for job in self.jobs.values() if job.min_tasks is not None
                 and job.state == RUNNING}
        evicted: dict[str, Any] = {}
        for eviction in plan.evictions:
            job = self.jobs.get(eviction.job)
            if job is None or job.id in skip or job.state != RUNNING:
                continue
            self.evictions_by_rule[eviction.rule or "other"] += 1
            verb = "moved" if eviction.moved else "preempted"
            self._tell_victim(job, eviction.tasks, now)
            self._event(verb, f"tasks {','.join(map(str, eviction.tasks))} {verb} ({eviction.rule}): "
                              f"{_eviction_words(eviction)}", job=job.id)
            if eviction.moved:
                job.restart_count += 1
            evicted[job.id] = eviction
            self.persist.job(job)
        for job_id, eviction in evicted.items():
            job = self.jobs[job_id]
            if not any(run.placement is not None for run in job.runs) and not eviction.moved:
                self._preempted(job, _eviction_words(eviction))
        yield
        binds: dict[str, list] = defaultdict(list)
        for bind in plan.binds:
            binds[bind.job].append(bind)
        bound: dict[str, list] = {}
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
                    self._send_starts(node)
                yield
        starts = {b.placement.node for job_id in sizes for b in bound.get(job_id, ())}
        for job_id, size in sizes.items():
            job = self.jobs.get(job_id)
            if job is not None and job.state == RUNNING and 0 < _placed(job) != size:
                fresh = {b.task for b in bound.get(job_id, ())}
                starts |= self._resize(job, size, fresh, now)
        for node in starts:
            self._send_starts(node)

    def _tell_victim(self, job: Job, tasks: tuple[int, ...], now: float) -> None:
        """Stop a victim's tasks: with its ``--signal`` and a grace of at least its lead when it has one
        (its loss is settled when it checkpoints or the grace ends), else as any stop (its loss at once).

        The whole job's work since its checkpoint counts: any stopped task restarts the whole gang.
        """
        lost = lost_gpu_seconds(job, now)
        if job.warn_signal is None:
            for task in tasks:
                self._stop_run(job, task, "preempted")
            self.preemptions.charge(job, lost)
            return
        grace = max(self.policy.grace_period_s, job.warn_lead_s)
        stops = [(run.placement.node, task, run.attempt) for task in tasks
                 if (run := job.runs[task]).placement is not None]
        for task in tasks:
            self._stop_run(job, task, "preempted", signal=job.warn_signal, grace_s=grace,
                           leader_only=job.warn_batch_only)
        self.preemptions.tell(job, stops, now + grace, lost)
        self._event("signalled", f"sent SIG{job.warn_signal} to checkpoint within {grace:g} s before its stop",
                    job=job.id)

    def checkpointed(self, job: Job, at: float, source: str) -> None:
        """Record that the job has a complete checkpoint as of ``at``; a victim within its grace is stopped
        now and loses nothing more."""
        job.last_checkpoint = at if job.last_checkpoint is None else max(job.last_checkpoint, at)
        job.checkpoints.append({"at": at, "source": source, "restart": job.restart_count})
        del job.checkpoints[:-MAX_KEPT]
        self._event("checkpointed", f"checkpoint recorded ({source}, restart {job.restart_count})", job=job.id)
        told = self.preemptions.checkpointed(job)
        if told is not None:
            for node, task, attempt in told.stops:
                self._command(node, stop_command(job.id, task, attempt, "preempted", 0.0, job_uid(job), hasten=True))
            self._event("stopped", "checkpointed within its grace: stopped now, no work lost", job=job.id)
        if job.state == RUNNING and job.id in self.core.in_core:
            self.core.reset(self.core_spec(job))
            self.wake()
        self.persist.job(job)

    def checkpoint_marked(self, node: str, message: dict) -> bool:
        """A node saw a new checkpoint marker file of a job it runs; True when it was recorded.

        The marker's time counts, but never later than now; a marker no newer
        than the job's last checkpoint (one seen again after a restart) is not
        a new checkpoint.
        """
        job = self.jobs.get(str(message.get("job")))
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
        for job in self.preemptions.settle(self.clock(), self.jobs):
            self.persist.job(job)

    def _bind(self, job: Job, binds: list, now: float) -> None:
        if job.state == PENDING:
            job.move_to(RUNNING)
            job.started, job.reason = now, ""
            if job.time_limit_s is not None:
                self.timed.add(job.id)
            nodes = sorted({b.placement.node for b in binds})
            self._event("started", f"started on {','.join(nodes)}", job=job.id, node=",".join(nodes))
        for bind in binds:
            self._place_task(job, bind.task, bind.placement, now)
        self.persist.job(job)

    def _place_task(self, job: Job, task: int, placement: TaskPlacement, now: float) -> None:
        """A new incarnation of the task at ``placement``, to be started there."""
        run = job.runs[task]
        run.placement, run.attempt, run.state, run.pid = placement, job.launches, "starting", None
        run.exit_code = run.term_signal = None
        run.since = now
        job.launches += 1
        if len(job.hosts) < job.tasks:
            job.hosts.extend([""] * (job.tasks - len(job.hosts)))
        job.hosts[task] = placement.node
        key = incarnation_key(job.id, task, run.attempt)
        self.wanted[placement.node][key] = (job.id, task)
        self.unsent[placement.node][key] = 0.0

    def _resize(self, job: Job, was: int, fresh: set[int], now: float) -> set[str]:
        """Restart an elastic gang's running tasks on the same GPUs so every rank sees the new world size.

        As torchrun's elastic agents do when members join or leave, the
        whole gang starts again together; ``fresh`` tasks were just placed
        and start with the new size already. Returns the nodes to send starts to.
        """
        size = _placed(job)
        nodes: set[str] = set()
        for task, run in enumerate(job.runs):
            placement = run.placement
            if placement is None or task in fresh:
                continue
            self._stop_run(job, task, f"the gang resized from {was} to {size} tasks")
            self._place_task(job, task, placement, now)
            nodes.add(placement.node)
        self._event("resized", f"runs {size} of its {job.tasks} tasks (was {was}); every task restarts with "
                               f"WORLD_SIZE={size}", job=job.id)
        self.persist.job(job)
        return nodes

    def _preempted(self, job: Job, reason: str) -> None:
        if job.requeue:
            job.move_to(PENDING, at=self.clock())
            job.restart_count += 1
            job.reason = f"requeued after preemption: {reason}"
            self._event("requeued", f"requeued (restart {job.restart_count})", job=job.id)
            self.persist.job(job)
            self._sync_core(job)  # out of the scheduler while its old copy is still being stopped
        else:
            self._finish(job, PREEMPTED, f"preempted: {reason}", stop_reason="preempted")

    def check_time_limits(self) -> None:
        """Stop jobs past their time limit whose node did not (a backstop: nodes enforce limits themselves)."""
        now = self.clock()
        slack = self.policy.grace_period_s + 30.0
        for job in [self.jobs[i] for i in self.timed if i in self.jobs]:
            if (job.state == RUNNING and job.time_limit_s is not None and job.started is not None
                    and now - job.started > job.time_limit_s + slack):
                self._finish(job, TIMEOUT, "reached the time limit", stop_reason="timeout")

    def set_policy(self, policy: Policy, pm: Any) -> None:
        """Use a new policy from the next cycle on."""
        self.policy = policy
        self.core.rebuild(policy, pm)
        self.job_events.pm = pm
        self.wake()

    # --------------------------------------------------------------- helpers

    def _new_job(self, template: Job, job_id: str, seq: int, now: float) -> Job:
        job = template.copy()
        job.id, job.seq, job.submitted = job_id, seq, now
        job.uid = new_uid()
        return job

    def _add(self, job: Job) -> None:
        self.jobs[job.id] = job
        self.listing.add(job)
        if job.state == RUNNING and job.time_limit_s is not None:
            self.timed.add(job.id)
        if job.array_id is not None:
            self.arrays.setdefault(job.array_id, {})[job.id] = None
        for dep in job.depends:
            if dep.met is None:
                self.dependents[dep.job].add(job.id)

    def _expand_dependency(self, dep: Any) -> list:
        if dep.job in self.arrays and dep.job not in self.jobs:
            return [type(dep)(dep.kind, element) for element in self.arrays[dep.job]]
        return [dep]

    def _blocked_reason(self, job: Job) -> str:
        if job.hold:
            return f"held: run gpuctl release {job.id}"
        for dep in job.depends:
            if dep.met is False:
                return f"dependency can never be met: job {dep.job} did not end as {dep.kind} needs"
            if dep.met is None:
                return f"waiting for job {dep.job} to end ({dep.kind})"
        if job.id in self.completing:
            return completing_text(self.completing.of(job.id), self.clock(), self.policy.grace_period_s)
        if job.id in self.fenced:
            until, node = self.fenced[job.id]
            return (f"waiting {max(0.0, until - self.clock()):.0f} s more for node {node}'s lease and grace period "
                    f"to run out, so that no two copies of the job run at once")
        if job.array_limit is not None and job.id not in self.core.in_core:
            return f"array {job.array_id} already has its limit of {job.array_limit} elements queued or running"
        return ""

    def _array_room(self, job: Job) -> bool:
        if job.array_limit is None or job.id in self.core.in_core:
            return True
        return self.array_queued[job.array_id] < job.array_limit

    def _sync_core(self, job: Job) -> None:
        """Put the job in the scheduler or take it out, whichever its state says."""
        wanted = (job.state == RUNNING or (
            job.state == PENDING and not job.hold and all(dep.met for dep in job.depends)
            and job.id not in self.fenced and job.id not in self.completing and self._array_room(job)))
        if wanted and job.id not in self.core.in_core:
            self.core.add(self.core_spec(job))
            if job.array_id is not None:
                self.array_queued[job.array_id] += 1
        elif not wanted and job.id in self.core.in_core:
            self._core_remove(job)

    def _core_remove(self, job: Job) -> None:
        if job.id in self.core.in_core and job.array_id is not None:
            self.array_queued[job.array_id] -= 1
        self.core.remove(job.id)

    def _stop_run(self, job: Job, task: int, reason: str, dead_node: str | None = None, *,
                  signal: str | None = None, grace_s: float | None = None, leader_only: bool = False) -> None:
        run = job.runs[task]
        placement = run.placement
        if placement is None:
            return
        self._account(job, run)
        key = incarnation_key(job.id, task, run.attempt)
        self.wanted[placement.node].pop(key, None)
        never_sent = self.unsent[placement.node].pop(key, None) == 0.0
        node = self.nodes.get(placement.node)
        if (node is not None and placement.node != dead_node and node.state != DOWN and not never_sent
                and run.state != "exited"):
            node.stopping[key] = list(placement.gpu_index)
            self.completing.add(node.name, key, self.clock())
            self.persist.node(node.name, node.to_json)
            grace = self.policy.grace_period_s if grace_s is None else grace_s
            self._command(node.name, stop_command(job.id, task, run.attempt, reason, grace, job_uid(job),
                                                  signal=signal, leader_only=leader_only))
        job.runs[task] = TaskRun()

    def _account(self, job: Job, run: TaskRun, until: float | None = None) -> None:
        if run.placement is not None and run.since is not None:
            end = self.clock() if until is None else until
            self.run_ended(job, run, end)
            job.gpu_seconds += max(0.0, end - run.since) * gpus_of(run.placement)
            run.since = None

    def core_spec(self, job: Job) -> JobSpec:
        """The job as the scheduling core is given it: with its run time predicted from its user's last
        jobs of its shape (``gpud.prediction``), as ``gpuctl simulate``'s replays and the bench predict it."""
        return job.spec(self.predictor.predict(job.user, job.gpus, job.tasks, job.time_limit_s))

    def _finish(self, job: Job, state: str, reason: str, *, stop_reason: str = "job ended",
                exit_from: TaskRun | None = None, dead_node: str | None = None, ended: float | None = None) -> None:
        """End the job in ``state``; ``ended`` is when (the node's time of the exit), by default now."""
        for task in range(job.tasks):
            self._stop_run(job, task, stop_reason, dead_node=dead_node)
        ended = self.clock() if ended is None else ended
        job.move_to(state, at=ended)
        job.ended, job.reason = ended, reason
        if exit_from is not None:
            job.exit_code, job.term_signal = exit_from.exit_code, exit_from.term_signal
        self.finished_by_state[state] += 1
        if state == COMPLETED:
            self.predictor.record(job.user, job.gpus, job.tasks, job.elapsed(ended))
        self.recently_ended[job.id] = state
        if len(self.recently_ended) > RECENTLY_ENDED:
            del self.recently_ended[next(iter(self.recently_ended))]
        self._event(state.lower(), reason or state.lower(), job=job.id)
        self.persist.job(job)
        for host in dict.fromkeys(h for h in job.hosts if h):
            # The job can never run again: each node it ran on deletes its checkpoint directory.
            self._command(host, purge_command(job))
        self._core_remove(job)
        del self.jobs[job.id]
        self.listing.remove(job)
        self.timed.discard(job.id)
        self.fenced.pop(job.id, None)
        self.completing.forget(job.id)
        self._after_end(job)

    def _after_end(self, job: Job) -> None:
        for dependent_id in self.dependents.pop(job.id, ()):
            dependent = self.jobs.get(dependent_id)
            if dependent is None:
                staged = self.staged.get(dependent_id)
                if staged is not None:
                    for dep in staged.depends:
                        if dep.job == job.id and dep.met is None:
                            dep.met = _dependency_met(dep.kind, job.state)
                    self.staged_changed.add(dependent_id)
                continue
            for dep in dependent.depends:
                if dep.job == job.id and dep.met is None:
                    dep.met = _dependency_met(dep.kind, job.state)
            self.persist.job(dependent)
            self._sync_core(dependent)
        if job.array_id is not None:
            members = self.arrays.get(job.array_id)
            if members is not None:
                members.pop(job.id, None)
                if not members:
                    del self.arrays[job.array_id]
                    self.array_queued.pop(job.array_id, None)
                elif job.array_limit is not None:
                    self._room_made(job.array_id)
        self.wake()

    def _room_made(self, array_id: str) -> None:
        if self._deferred is None:
            self._refill(array_id)
        else:
            self._deferred.add(array_id)

    def _refill(self, array_id: str) -> None:
        """Queue the array's next waiting elements, up to its limit (elements in the scheduler come first)."""
        members = self.arrays.get(array_id)
        if not members:
            return
        for member in members:
            job = self.jobs[member]
            if job.array_limit is None or self.array_queued[array_id] >= job.array_limit:
                return
            if member not in self.core.in_core:
                self._sync_core(job)

    def change_many(self, jobs: list[Job], verb: str, by: str) -> list[str]:
        """Cancel, hold or release many jobs (an array) in time linear in their number; the ids changed.

        Jobs that ended meanwhile are skipped; arrays are refilled once, at the end.
        """
        changed: list[str] = []
        self._deferred = set()
        try:
            for job in jobs:
                if self.jobs.get(job.id) is not job:
                    continue
                if verb == "cancel":
                    self.cancel(job, by)
                    changed.append(job.id)
                elif (self.hold(job, by) if verb == "hold" else self.release(job, by)):
                    changed.append(job.id)
        finally:
            deferred, self._deferred = self._deferred, None
            for array_id in sorted(deferred):
                self._refill(array_id)
        return changed

    def _send_starts(self, name: str) -> None:
        if name not in self.connected:
            return
        node = self.nodes[name]
        busy = node.busy_gpus()
        unsent = self.unsent[name]
        for key in sorted(unsent, key=lambda k: unsent[k]):
            job_id, task = self.wanted[name][key]
            if job_id in self.completing or job_id in self.fenced:
                continue  # sent once every earlier incarnation of the job has surely ended (see unblock)
            job = self.jobs[job_id]
            run = job.runs[task]
            assert run.placement is not None  # a wanted task is placed
            if busy.intersection(run.placement.gpu_index):
                continue
            del unsent[key]
            self.sent_at[key] = self.clock()
            token = checkpoint_token(self.task_secret, job) if self.task_secret else ""
            self._command(name, start_command(job, task, run, node, self.nodes, self.policy.grace_period_s,
                                          self.policy.time_slicing, self.policy.task_pids_max, token))

    def _command(self, node: str, message: dict) -> None:
        self.outbox[node].append(message)
        self.commands_made += 1

    def take_commands(self) -> dict[str, list[dict]]:
        """The commands piled up for each node since the last call."""
        commands, self.outbox = self.outbox, defaultdict(list)
        return commands

    def put_back_commands(self, commands: dict[str, list[dict]]) -> None:
        """Return commands taken but not sent, ahead of those piled up since."""
        for node, messages in commands.items():
            self.outbox[node][:0] = messages

    def _event(self, kind: str, message: str, *, job: str | None = None, node: str | None = None,
               store: bool = True) -> None:
        if store:
            self.persist.event(Event(self.clock(), kind, message, job, node))
        log.info("event=%s job=%s node=%s %s", kind.replace(" ", "_"), job or "-", node or "-", message)
        if job is not None and job in self.jobs:
            self.job_events.emit(kind, self.jobs[job], message)


def _placed(job: Job) -> int:
    return sum(1 for run in job.runs if run.placement is not None)


def submitted_message(job: Job) -> str:
    """What the submitted event of ``job`` says."""
    return f"submitted by {job.user} to project {job.project}"


def with_submitted_event(job: Job, events: list[Event]) -> list[Event]:
    """The job's stored events with its submitted event first (made from the record unless stored, as it was once)."""
    if any(event.kind == SUBMITTED for event in events):
        return events
    return [Event(job.submitted, SUBMITTED, submitted_message(job), job.id), *events]


def _dependency_met(kind: str, state: str) -> bool | None:
    if not is_finished(state):
        return None
    if kind == "afterok":
        return state == COMPLETED
    if kind == "afternotok":
        return state != COMPLETED
    return True


def _eviction_words(eviction: Eviction) -> str:
    """Why an eviction was made, for people."""
    return eviction_text(eviction.why) if eviction.why is not None else eviction.rule


def _sized(nodes: list) -> tuple:
    """Each distinct set of node labels with the largest sizes a node carrying it has."""
    largest: dict[tuple, tuple[int, float, float, float]] = {}
    for node in nodes:
        labels = tuple(sorted(node.labels.items()))
        size = (len(node.gpus), max((g.memory_gib for g in node.gpus), default=0.0), node.cpus, node.memory_gib)
        old = largest.get(labels)
        largest[labels] = size if old is None else (max(old[0], size[0]), max(old[1], size[1]),
                                                    max(old[2], size[2]), max(old[3], size[3]))
    return tuple((labels, *size) for labels, size in sorted(largest.items()))
