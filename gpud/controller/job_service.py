"""Jobs through their lifecycle: submitted (arrays expanded), dependencies met, held, ended or requeued.

The service keeps the active jobs, their arrays and dependencies, and the
scheduling core's set of jobs in step with them (``sync``): a job is in the
core while it runs, or while it is pending with nothing else to wait for.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Callable, Iterable, Iterator

from gpud import slurm_env
from gpud.controller.completing import Completing
from gpud.controller.core_sync import CoreSync
from gpud.controller.event_log import EventLog
from gpud.controller.job_events import SUBMITTED, submitted_message
from gpud.controller.listing_order import ListingOrder
from gpud.controller.node_commands import purge_command
from gpud.controller.outbox import Outbox
from gpud.controller.persist import Persister
from gpud.controller.task_runs import TaskRuns
from gpud.jobs import Dependency, Job, TaskRun, new_uid
from gpud.lifecycle import CANCELLED, COMPLETED, FAILED, NODE_FAIL, PENDING, PREEMPTED, RUNNING, TIMEOUT, is_finished
from gpud.model import JobSpec
from gpud.policy import Policy
from gpud.prediction import RuntimePredictor
from gpud.submission import Submission

log = logging.getLogger("gpud.controller")
RECENTLY_ENDED = 10_000
# Jobs staged between two pauses of a submit: 200 take about 1 ms (a few ms on a busy machine), within the
# loop's slice of long work (gpud.controller.slices).
STAGE_PART = 200


class JobService:
    """The active jobs and every move of their lifecycle; see the module docstring."""

    def __init__(self, jobs: dict[str, Job], core: CoreSync, runs: TaskRuns, events: EventLog, outbox: Outbox,
                 persist: Persister, clock: Callable[[], float], policy: Callable[[], Policy],
                 completing: Completing, fenced: dict[str, tuple[float, str]], wake: Callable[[], None]) -> None:
        self.jobs = jobs
        self.core = core
        self.runs = runs
        self.events = events
        self.outbox = outbox
        self.persist = persist
        self.clock = clock
        self.policy = policy
        self.completing = completing
        # Requeued jobs that may not run before a time (their silent node's lease and grace period), and that node.
        self.fenced = fenced
        self.wake = wake
        # Run times of the jobs that completed, by user and shape: predicted ends for start estimates.
        self.predictor = RuntimePredictor()
        self.listing = ListingOrder()  # the same jobs in the job list's order: a page bisects from its cursor
        self.arrays: dict[str, dict[str, None]] = {}  # each array's active elements, in order
        self.array_queued: dict[str | None, int] = defaultdict(int)  # each array's elements in the scheduler
        self.staged: dict[str, Job] = {}     # submitted, not yet durable: see stage()
        self.staged_changed: set[str] = set()
        # How the last jobs ended, for submits that looked their dependencies up before they ended.
        self.recently_ended: dict[str, str] = {}
        self.dependents: dict[str, set[str]] = defaultdict(set)
        self.next_seq = 1
        self.finished_by_state: dict[str, int] = defaultdict(int)
        self.timed: set[str] = set()
        self._deferred: set[str] | None = None  # arrays to refill once a change of many jobs is done

    def restore(self, jobs: Iterable[Job], next_seq: int) -> None:
        """Take back the active jobs the store held (their runs already restored) and the next job number."""
        for job in jobs:
            self._add(job)
        self.next_seq = next_seq
        for job in list(self.jobs.values()):
            self.sync(job)

    # --------------------------------------------------------------- submits

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
                       part: int = STAGE_PART) -> Iterator[list[Job]]:
        """``stage``, yielding the staged jobs ``part`` at a time (the last part may be shorter), so a
        caller may pause between parts, whether they come from many jobs or from one array.

        Ids are given as the parts are made; staged jobs are invisible to
        everyone else, so pausing changes nothing another request can see.
        """
        now = self.clock()
        added: list[Job] = []
        for submission in submissions:
            for job in self._jobs_of(submission, now):
                added.append(job)
                if len(added) >= part:
                    yield self._stage_part(added, finished_states)
                    added = []
        if added:
            yield self._stage_part(added, finished_states)

    def _jobs_of(self, submission: Submission, now: float) -> Iterator[Job]:
        """The submission's job with its id, or its array's elements, numbered when first asked for."""
        seq = self.next_seq
        self.next_seq += 1
        template = submission.job
        if submission.array_indices is None:
            template.id, template.seq, template.submitted = str(seq), seq, now
            template.uid = new_uid()
            yield template
            return
        array_id = str(seq)
        span = slurm_env.array_span(submission.array_indices)
        for index in submission.array_indices:
            job = _new_job(template, f"{seq}_{index}", seq, now)
            job.array_id, job.array_index, job.array_limit = array_id, index, submission.array_limit
            job.env = {**job.env, "GPUD_ARRAY_JOB_ID": array_id, "GPUD_ARRAY_TASK_ID": str(index),
                       **slurm_env.array_vars(array_id, index, span)}
            yield job

    def _stage_part(self, added: list[Job], finished_states: dict[str, str]) -> list[Job]:
        for job in added:
            job.depends = [dep for original in job.depends for dep in self._expand_dependency(original)]
            for dep in job.depends:
                if dep.job not in self.jobs:
                    ended = self.recently_ended.get(dep.job) or finished_states.get(dep.job, FAILED)
                    dep.met = dependency_met(dep.kind, ended)
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
            # Not stored: the job's record says as much (see with_submitted_event), one row less per submit.
            if job.array_id is None:
                self.events.record(SUBMITTED, submitted_message(job), job=job.id, store=False)
            else:  # one log line per array, not per element: see below
                self.events.hook_only(SUBMITTED, job, submitted_message(job))
                elements[job.array_id] = elements.get(job.array_id, 0) + 1
        for array_id, count in elements.items():
            log.info("event=%s job=%s node=- %s (array of %d elements)", SUBMITTED, array_id,
                     submitted_message(self.jobs[next(iter(self.arrays[array_id]))]), count)
        for job in jobs:
            self.sync(job)
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

    # ------------------------------------------------------- users' changes

    def cancel(self, job: Job, by: str) -> None:
        """Cancel a pending or running job; its tasks are stopped with the policy's grace period."""
        self.finish(job, CANCELLED, f"cancelled by {by}", stop_reason="cancelled")
        self.wake()

    def end(self, job: Job, state: str, reason: str, stop_reason: str) -> None:
        """End an active job for a reason of the controller's own (an idle terminal, one left detached)."""
        self.finish(job, state, reason, stop_reason=stop_reason)
        self.wake()

    def hold(self, job: Job, by: str) -> bool:
        """Hold a pending job (it stays PENDING and is not scheduled); False when it is not pending."""
        if job.state != PENDING or job.hold:
            return False
        job.hold = True
        self.events.record("held", f"held by {by}", job=job.id)
        self.sync(job)
        self.persist.job(job)
        if job.array_id is not None and job.array_limit is not None:
            self._room_made(job.array_id)  # a held element leaves its place in the array's limit to the next
        return True

    def release(self, job: Job, by: str) -> bool:
        """Release a held job; False when it was not held."""
        if not job.hold:
            return False
        job.hold = False
        self.events.record("released", f"released by {by}", job=job.id)
        self.sync(job)
        self.persist.job(job)
        self.wake()
        return True

    def requeue(self, job: Job, by: str) -> bool:
        """Stop a running job's tasks (with the policy's grace) and queue it again for its next restart, as
        Slurm's ``scontrol requeue``; False when it does not run or was submitted with ``--no-requeue``."""
        if job.state != RUNNING or not job.requeue:
            return False
        self._stop_and_requeue(job, "requeued", f"requeued by {by}", "requeued", f"requeued by {by}")
        return True

    def change_many(self, jobs: list[Job], verb: str, by: str) -> list[str]:
        """Cancel, hold, release or requeue many jobs (an array) in time linear in their number; the ids changed.

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
                elif self._change(job, verb, by):
                    changed.append(job.id)
        finally:
            deferred, self._deferred = self._deferred, None
            for array_id in sorted(deferred):
                self._refill(array_id)
        return changed

    def _change(self, job: Job, verb: str, by: str) -> bool:
        if verb == "hold":
            return self.hold(job, by)
        return self.release(job, by) if verb == "release" else self.requeue(job, by)

    # ------------------------------------------------- the controller's moves

    def check_time_limits(self) -> None:
        """Stop jobs past their time limit whose node did not (a backstop: nodes enforce limits themselves)."""
        now = self.clock()
        slack = self.policy().grace_period_s + 30.0
        for job in [self.jobs[i] for i in self.timed if i in self.jobs]:
            if (job.state == RUNNING and job.time_limit_s is not None and job.started is not None
                    and now - job.started > job.time_limit_s + slack):
                self.finish(job, TIMEOUT, "reached the time limit", stop_reason="timeout")

    def started(self, job: Job, nodes: list[str], now: float) -> None:
        """A pending job was given its first tasks' placements: it runs from ``now``."""
        job.move_to(RUNNING)
        job.started, job.reason = now, ""
        if job.time_limit_s is not None:
            self.timed.add(job.id)
        self.events.record("started", f"started on {','.join(nodes)}", job=job.id, node=",".join(nodes))

    def preempted(self, job: Job, reason: str) -> None:
        """An evicted job holds nothing any more: requeued when it asked to be, else ended PREEMPTED."""
        if job.requeue:
            self._requeue(job, f"requeued after preemption: {reason}", "requeued", "requeued")
            self.sync(job)  # out of the scheduler while its old copy is still being stopped
        else:
            self.finish(job, PREEMPTED, f"preempted: {reason}", stop_reason="preempted")

    def lost(self, job: Job, reason: str, dead_node: str | None = None) -> None:
        """A job lost tasks to a node: requeue it whole (preemptible, requeue on) or end it NODE_FAIL."""
        if job.priority < 100 and job.requeue:
            self._stop_and_requeue(job, "node failure", f"requeued: {reason}", "node failure", f"{reason}; requeued",
                                   dead_node)
        else:
            self.finish(job, NODE_FAIL, reason, stop_reason="node failure", dead_node=dead_node)

    def _stop_and_requeue(self, job: Job, stop_reason: str, reason: str, event_kind: str, event_text: str,
                          dead_node: str | None = None) -> None:
        """Stop every task of the job and queue it again; the scheduler takes it back as pending once nothing
        of its old copy holds it back."""
        for task in range(job.tasks):
            self.runs.stop(job, task, stop_reason, dead_node=dead_node)
        self._requeue(job, reason, event_kind, event_text)
        self._core_remove(job)
        self.sync(job)
        self.wake()

    def _requeue(self, job: Job, reason: str, event_kind: str, event_text: str) -> None:
        """Back to pending for its next restart, with the event saying which restart it is, made durable."""
        job.move_to(PENDING, at=self.clock())
        job.restart_count += 1
        job.reason = reason
        self.events.record(event_kind, f"{event_text} (restart {job.restart_count})", job=job.id)
        self.persist.job(job)

    def finish(self, job: Job, state: str, reason: str, *, stop_reason: str = "job ended",
               exit_from: TaskRun | None = None, dead_node: str | None = None, ended: float | None = None) -> None:
        """End the job in ``state``; ``ended`` is when (the node's time of the exit), by default now.

        Its tasks are stopped, its exit taken from the run ``exit_from``, its
        dependents told, and every node it ran on told to purge its checkpoints.
        """
        for task in range(job.tasks):
            self.runs.stop(job, task, stop_reason, dead_node=dead_node)
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
        self.events.record(state.lower(), reason or state.lower(), job=job.id)
        self.persist.job(job)
        for host in dict.fromkeys(h for h in job.hosts if h):
            # The job can never run again: each node it ran on deletes its checkpoint directory.
            self.outbox.put(host, purge_command(job))
        self._core_remove(job)
        del self.jobs[job.id]
        self.listing.remove(job)
        self.timed.discard(job.id)
        self.fenced.pop(job.id, None)
        self.completing.forget(job.id)
        self._after_end(job)

    def unblock(self, job_id: str) -> None:
        """The job no longer waits for an earlier copy of itself (or for a silent node's lease) unless it still
        does for another: it may be scheduled, and the starts held back meanwhile go out."""
        job = self.jobs.get(job_id)
        if job is None or job_id in self.completing or job_id in self.fenced:
            return
        self.sync(job)
        for node in sorted({run.placement.node for run in job.runs if run.placement is not None}):
            self.runs.send_starts(node)
        self.wake()

    # -------------------------------------------------- the scheduler's view

    def sync(self, job: Job) -> None:
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

    def core_spec(self, job: Job) -> JobSpec:
        """The job as the scheduling core is given it: with its run time predicted from its user's last
        jobs of its shape (``gpud.prediction``), as ``gpuctl simulate``'s replays and the bench predict it."""
        return job.spec(self.predictor.predict(job.user, job.gpus, job.tasks, job.time_limit_s))

    def _core_remove(self, job: Job) -> None:
        if job.id in self.core.in_core and job.array_id is not None:
            self.array_queued[job.array_id] -= 1
        self.core.remove(job.id)

    def _array_room(self, job: Job) -> bool:
        if job.array_limit is None or job.id in self.core.in_core:
            return True
        return self.array_queued[job.array_id] < job.array_limit

    # --------------------------------------------------------------- helpers

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

    def _expand_dependency(self, dep: Dependency) -> list[Dependency]:
        if dep.job in self.arrays and dep.job not in self.jobs:
            return [type(dep)(dep.kind, element) for element in self.arrays[dep.job]]
        return [dep]

    def _after_end(self, job: Job) -> None:
        for dependent_id in self.dependents.pop(job.id, ()):
            dependent = self.jobs.get(dependent_id)
            if dependent is None:
                staged = self.staged.get(dependent_id)
                if staged is not None:
                    for dep in staged.depends:
                        if dep.job == job.id and dep.met is None:
                            dep.met = dependency_met(dep.kind, job.state)
                    self.staged_changed.add(dependent_id)
                continue
            for dep in dependent.depends:
                if dep.job == job.id and dep.met is None:
                    dep.met = dependency_met(dep.kind, job.state)
            self.persist.job(dependent)
            self.sync(dependent)
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
                self.sync(job)


def _new_job(template: Job, job_id: str, seq: int, now: float) -> Job:
    job = template.copy()
    job.id, job.seq, job.submitted = job_id, seq, now
    job.uid = new_uid()
    return job


def dependency_met(kind: str, state: str) -> bool | None:
    """Whether a dependency of ``kind`` on a job in ``state`` is met; None while that job has not ended."""
    if not is_finished(state):
        return None
    if kind == "afterok":
        return state == COMPLETED
    if kind == "afternotok":
        return state != COMPLETED
    return True
