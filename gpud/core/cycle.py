"""Scheduling cycles: allocate, consolidate, reclaim, preempt; then the plan as a diff."""

from __future__ import annotations

from typing import Callable, Final, Iterator, Mapping, Protocol

import pluggy

from gpud.core.allocate import Allocate
from gpud.core.backlog import Group
from gpud.core.collector import CollectorPaused
from gpud.core.consolidate import Consolidate
from gpud.core.preempt import Preempt
from gpud.core.reclaim import Reclaim
from gpud.core.queues import QueueState
from gpud.core.session import Session
from gpud.core.state import ClusterState, EvictedBy
from gpud.core.turns import EVERY, Turns
from gpud.model import Bind, Eviction, JobSpec, Plan, QueueReport, Snapshot, Waiting
from gpud.policy import Policy


class Action(Protocol):
    """A step of the cycle: made with the cycle's session, then run once."""

    def __init__(self, session: Session) -> None: ...

    def run(self) -> None: ...


# The cycle's steps, in order: free room first, then moves that make room, then evictions across
# projects (reclaim) and inside one (preempt). A new step is a module with an Action, listed here.
ACTIONS: Final[tuple[type[Action], ...]] = (Allocate, Consolidate, Reclaim, Preempt)


class Scheduler:
    """The scheduling core kept warm between cycles: jobs come and go, each cycle returns a plan.

    Built from a snapshot, it keeps the cluster state, the backlog of
    pending jobs in order and the placements of the last cycle, so a cycle
    costs what changed, not the size of the backlog. Nothing outside is
    changed: a plan is a value the caller carries out.
    """

    def __init__(self, snapshot: Snapshot, policy: Policy, pm: pluggy.PluginManager,
                 turn: Callable[[], None] | None = None, every: int = EVERY) -> None:
        """``turn``: called every ``every`` steps of the long loops while the scheduler is built (each
        cycle is given its own, ``cycle``), so that a daemon building it in a thread keeps its other
        threads running; it changes nothing the core decides."""
        self.turns = Turns(turn, every)
        with CollectorPaused():
            self.state = ClusterState(snapshot, policy, pm, self.turns)
        self.turns.give = None

    def submit(self, job: JobSpec) -> None:
        """Add a job (pending, or already running where its placements say)."""
        if job.id in self.state.jobs:
            raise ValueError(f"job {job.id} is already known")
        self.state.add_job(job)

    def finish(self, job_id: str) -> None:
        """Forget a job that completed, failed or was cancelled; its resources are free again."""
        self.state.remove_job(job_id)

    def set_usage(self, usage: Mapping[tuple[str, str, str], float]) -> None:
        """Take the decayed usage charged so far (as ``Snapshot.usage``), read from the next cycle on."""
        self.state.usage = usage

    def job(self, job_id: str) -> JobSpec:
        """The job as the scheduler knows it now (placements as of the last cycle)."""
        return self.state.jobs[job_id]

    def jobs(self) -> tuple[JobSpec, ...]:
        """Every job the scheduler knows, as of the last cycle."""
        return tuple(self.state.jobs.values())

    def cycle(self, now: float | None = None, turn: Callable[[], None] | None = None) -> Plan:
        """Run one cycle at ``now`` (default: the last time given) and return its plan.

        The plan's binds and evictions are taken as carried out: the next
        cycle starts from them. ``turn``: called every so many steps of the
        cycle's long loops (as the constructor's), for a daemon running the
        cycle in a thread; it changes nothing the core decides.
        """
        with CollectorPaused():
            return self._run(now, False, turn)

    def _run(self, now: float | None, last: bool, turn: Callable[[], None] | None) -> Plan:
        """A cycle, giving ``turn``; the ``last`` one leaves the state as the actions left it, for no cycle
        comes after."""
        state = self.state
        self.turns.give = turn
        try:
            state.begin_cycle(now)
            session = Session(state)
            try:
                for action in ACTIONS:
                    action(session).run()
            finally:
                session.release_held()
            return self._plan(session, last)
        finally:
            self.turns.give = None

    def _plan(self, session: Session, last: bool) -> Plan:
        """The cycle's plan, once its actions ran; the state is committed unless it was the ``last`` cycle."""
        state = self.state
        binds, evictions = plan_changes(state, session.reasons.evicted)
        reports = {q: _report(q) for q in state.queues.values()}
        queues = tuple(reports.values())
        if last:
            return Plan(binds, evictions, PendingReasons(session, reports, state.waiting_after()), queues,
                        session.reservations)
        state.commit()
        return Plan(binds, evictions, PendingReasons(session, reports), queues, session.reservations)


def schedule(snapshot: Snapshot, policy: Policy, pm: pluggy.PluginManager,
             turn: Callable[[], None] | None = None, every: int = EVERY) -> Plan:
    """Decide, from one snapshot, which tasks start where and which are stopped or moved.

    Pure: reads the snapshot and the policy, asks the plugins, and returns a
    plan; nothing outside is changed. ``turn`` is called every ``every``
    steps of the long loops (``Scheduler``), and changes nothing decided.
    """
    with CollectorPaused():  # once for both: the state built here is dropped on return, never collected
        return Scheduler(snapshot, policy, pm, turn, every)._run(None, True, turn)


def plan_changes(state: ClusterState, evicted_by: EvictedBy) -> tuple[tuple[Bind, ...], tuple[Eviction, ...]]:
    """The difference between the last baseline and the state after the actions, as binds and evictions.

    A task put back on the very GPUs it had has not moved and appears in
    neither list; ``evicted_by`` gives each eviction's rule and reason.
    """
    binds: list[Bind] = []
    evictions: list[Eviction] = []
    turns = state.turns
    for job_id in sorted(state.touched):
        turns.step()
        job = state.jobs[job_id]
        final = state.placements[job_id]
        stopped: list[int] = []
        moved: list[int] = []
        for task in range(job.tasks):
            before, after = job.task_placement(task), final[task]
            if before is after or before == after:  # most are the very same placement: no field compared
                continue
            if after is not None:
                binds.append(Bind(job_id, task, after))
            if before is not None:
                (moved if after is not None else stopped).append(task)
        rule, reason, for_job = evicted_by.get(job_id, ("", None, None))
        if stopped:
            evictions.append(Eviction(job_id, tuple(stopped), rule, reason, for_job))
        if moved:
            evictions.append(Eviction(job_id, tuple(moved), rule, reason, for_job, moved=True))
    return tuple(binds), tuple(evictions)


def _report(queue: QueueState) -> QueueReport:
    return QueueReport(queue.name, queue.kind, queue.pool,
                       queue.parent.name if queue.parent else None, queue.quota,
                       queue.fair_share, queue.allocated, queue.demand, queue.fixed)


class PendingReasons(Mapping[str, Waiting]):
    """Why each job still waits after a cycle, as data (``Waiting``), made only when read (there may be 100,000).

    Each reason is the cycle's recorder's (``ReasonRecorder.of``, which
    decides which reason wins), with its queue's report at the moment the
    plan was built. Which jobs wait, and in which group, is read through the
    backlog as of that moment (``Backlog.as_of_now``), not copied.
    """

    def __init__(self, session: Session, reports: dict[QueueState, QueueReport],
                 waiting: dict[str, Group] | None = None) -> None:
        """``waiting``: each waiting job's group, when not the backlog's (``ClusterState.waiting_after``)."""
        # The session's recorder is kept, not copied: the next cycle makes a new one.
        self._reasons = session.reasons
        self._orphans = session.reasons.orphans
        self._group_of: Mapping[str, Group] = session.state.backlog.as_of_now() if waiting is None else waiting
        self._reports = reports

    def __getitem__(self, job_id: str) -> Waiting:
        if job_id in self._orphans:
            queue, blocker = self._reasons.of(job_id, None)
        else:
            queue, blocker = self._reasons.of(job_id, self._group_of[job_id])
        return Waiting(blocker, self._reports[queue] if queue is not None else None)

    def __iter__(self) -> Iterator[str]:
        yield from self._group_of
        yield from self._orphans

    def __len__(self) -> int:
        return len(self._group_of) + len(self._orphans)
