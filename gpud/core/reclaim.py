"""The reclaim action: a queue below its fair share takes resources back from queues above theirs."""

from __future__ import annotations

import itertools
from typing import Final, TYPE_CHECKING

from gpud.core.admission import refuses
from gpud.core.backlog import Group
from gpud.core.shapes import FailedShapes
from gpud.core.evict import VictimLists, judged, make_room
from gpud.core.pending import gang_tasks, needed_tasks
from gpud.core.queue_walk import Entry, QueueWalk, Skip
from gpud.core.memo import Memo
from gpud.core.queues import QueueState
from gpud.core.state import ClusterState, Victim
from gpud.model import EPS, RESOURCES, Evicted, JobSpec, OverLevel, Resources

if TYPE_CHECKING:
    from gpud.core.session import Session

RULE: Final = "reclaim"


def _taken(need: Resources, victim: JobSpec) -> Resources:
    """The part of ``need`` a victim gives back: only the resources its tasks hold.

    A queue is a victim only when it is over its fair share (or quota) in
    one of these. Were it enough to be over in a resource the victim does
    not hold, two queues could each be over in a resource the other's job
    does not use and take the same node back and forth every cycle.
    """
    request = victim.request
    return Resources(need.gpu if request.uses_gpu else 0.0, need.cpu if request.cpus > EPS else 0.0,
                     need.memory if request.memory_gib > EPS else 0.0)


def _over_in(queue: QueueState, level: Resources, taken: Resources) -> str:
    """The first resource of ``taken`` in which ``queue`` holds more than ``level`` (GPUs if none)."""
    held = queue.allocated
    return next((r for r in RESOURCES if taken.get(r) > EPS and held.get(r) > level.get(r) + EPS), "gpu")


def _level(mine: QueueState, theirs: QueueState, taken: Resources, need: Resources) -> bool | None:
    """Whether ``theirs`` is over its fair share (True) or only over its quota (False), in a resource of
    ``taken``, for ``mine`` to take ``need`` from it; None when it may not."""
    if not mine.fits_fair_share(need):
        return None
    if not theirs.implicit and not theirs.over(theirs.quota_bound, taken):
        return None
    if theirs.over(theirs.fair_share, taken):
        return True
    if not theirs.implicit and mine.fits_quota(need):
        return False
    return None


def _levels(queue: QueueState, victim_queue: QueueState, taken: Resources, need: Resources,
            seen: dict[QueueState, bool | None] | None = None) -> list[tuple[QueueState, bool]] | None:
    """The victim side's queues compared, each with ``_level``; None when ``queue``, taking ``need``,
    may not take ``taken`` from ``victim_queue``. ``seen`` keeps the departments' answers while nothing
    changes."""
    found = []
    mine, theirs = queue.parent, victim_queue.parent
    if mine is not theirs and mine is not None and theirs is not None:  # departments differ
        if seen is not None and theirs in seen:
            over = seen[theirs]
        else:
            over = _level(mine, theirs, taken, need)
            if seen is not None:
                seen[theirs] = over
        if over is None:
            return None
        found.append((theirs, over))
    over = _level(queue, victim_queue, taken, need)
    if over is None:
        return None
    found.append((victim_queue, over))
    return found


class _Hopeless(Skip):
    """Passes over a group whose next job is at least as large as one of its queue that found no victims."""

    def __init__(self, state: ClusterState, failed: dict[QueueState, FailedShapes]) -> None:
        self.state = state
        self.failed = failed

    def holds(self, job: JobSpec, queue: QueueState, group: Group | None = None) -> bool:
        failures = self.failed.get(queue)
        state = self.state
        return failures is not None and failures.find(job, gang_tasks(state, job), 0,
                                                      state.shapes.of_group(group) if group is not None else -1) is not None


class Reclaim:
    """The reclaim action: take back, from queues over their fair share, what queues below theirs are owed.

    For each pending job whose queue stays within its fair share, victims
    come first from queues over their fair share, then from queues over
    their quota (only while the reclaimer stays within its own quota), in a
    resource both the pending job needs and the victim holds; the test is
    made before each victim, so a queue at or below its quota is never a
    victim. Departments are compared first, then projects.
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        state = self.state = session.state
        self.placer = session.placer
        self.lists = VictimLists(state, session.victim_orders)
        self.failed: dict[QueueState, FailedShapes] = {}  # requests that found no victims, by queue
        self.hopeless = _Hopeless(state, self.failed)
        self.projects: dict[str, list[QueueState]] = {}  # by pool
        for queue in state.queues.values():
            if queue.kind == "project":
                self.projects.setdefault(queue.pool, []).append(queue)
        # Stamped with the state's ``changes``: the queues over their levels, and those that may give back.
        self._over: Memo[tuple, tuple[list[QueueState], list[QueueState]]] = Memo()
        self._givers: Memo[tuple, tuple[list[QueueState], list[QueueState]]] = Memo()
        # A queue whose smallest groups did not all fail, stamped with (its failures' version, its changes).
        self._unblocked: Memo[QueueState, bool] = Memo()

    def run(self) -> None:
        """Serve the queues below their fair share, each job evicting what its queue is owed."""
        state = self.state
        below = [q for q in state.backlog.by_queue if _below_fair_share(q) and self._some_job_fits(q)]
        walk = QueueWalk(state, state.backlog, queues=below, admit=self.admit, drop=self.blocked)
        for job in walk:
            skip = self.visit(job)
            if skip is not None:
                walk.pass_over(skip)

    def visit(self, job: JobSpec) -> Skip | None:
        """Try the job; an elastic job running at least its minimum grows one task at a time, each
        reclaimed as a job of one task would be, while its queue stays within its fair share."""
        state = self.state
        while True:
            waiting = state.pending_count(job.id)
            skip = self.attempt(job)
            left = state.pending_count(job.id)
            if skip is not None or not left or left == waiting or needed_tasks(state, job)[1] > 0:
                return skip

    def attempt(self, job: JobSpec) -> Skip | None:
        """Place the job's next tasks (its gang minimum, at least one) by eviction; the Skip when that fails."""
        state = self.state
        pending, minimum = needed_tasks(state, job)
        if not pending:
            return None
        queue = state.project_queue(job)
        if self.hopeless.holds(job, queue):
            return self.hopeless
        tasks = max(minimum, 1)
        need = state.need(job, tasks)
        failures = self.failed.get(queue) or self.failed.setdefault(queue, FailedShapes(state))
        if not queue.fits_fair_share(need):  # so would any job as large in a resource it goes over in
            for resource in queue.excess(queue.fair_share, need):
                failures.add(job, tasks, None, binding=(resource,))
            return self.hopeless
        if refuses(queue, job, need) is not None:
            return None
        claim = _Claim(state, job, queue, tasks, need, len(pending))
        over_share, over_quota = self.givers(claim)
        if not over_share and not over_quota and self.placer.find(job) is None:
            failures.add(job, tasks, None)  # no queue may give back, and there is no room without: as make_room finds
            return self.hopeless
        if self.evict_for(claim, over_share, over_quota):
            self.session.reasons.started(job, queue)
            return None
        failures.add(job, tasks, None)
        return self.hopeless

    def evict_for(self, claim: _Claim, over_share: list[QueueState], over_quota: list[QueueState]) -> bool:
        """Make room for the claim with victims of queues over their fair share, then, when that is not
        enough, with those of queues over only their quota too; True when the job was placed."""
        lists = self.lists
        if over_share:
            candidates = judged(lists.of_queues(over_share), claim.may_go)
            if make_room(self.session, claim.job, candidates, RULE, claim.eligible, lists):
                return True
        if over_quota or claim.passed_over or not over_share:
            claim.strict = False
            queued = itertools.chain(lists.of_queues(over_share), lists.of_queues(over_quota))
            return make_room(self.session, claim.job, judged(queued, claim.may_go), RULE, claim.eligible, lists)
        return False

    def givers(self, claim: _Claim) -> tuple[list[QueueState], list[QueueState]]:
        """The queues that may give back to the claim: over their fair share, and over only their quota.

        What a victim gives back is part of what the job holds: a queue over
        its level in none of that has no victim for the job. Of the others,
        only victims holding a resource their queue is over in are offered,
        so no node is chosen for victims that may not go. Which queues may
        give back depends on which resources the job uses and on whether its
        queue and department fit their fair share and quota with ``need``.
        """
        queue, need, held = claim.queue, claim.need, claim.held
        parent = queue.parent
        key = (queue, held.gpu > EPS, held.cpu > EPS, held.memory > EPS, queue.fits_quota(need),
               parent is None or parent.fits_fair_share(need), parent is None or parent.fits_quota(need))
        changes = self.state.changes
        found = self._givers.get(key, changes)
        if found is None:
            over_share, over_quota = self.over_levels(queue, held)
            seen: dict[QueueState, bool | None] = {}
            found = self._givers.put(key, changes, (
                [q for q in over_share if _levels(queue, q, held, need, seen) is not None],
                [q for q in over_quota if _levels(queue, q, held, need, seen) is not None]))
        return found

    def over_levels(self, queue: QueueState, held: Resources) -> tuple[list[QueueState], list[QueueState]]:
        """The other projects of the pool over their fair share (theirs or their department's, against
        another department) and those over only their quota, in a resource ``held`` uses."""
        # The answer depends on which resources ``held`` uses, not how much.
        key = (queue.pool, queue.parent, held.gpu > EPS, held.cpu > EPS, held.memory > EPS)
        changes = self.state.changes
        found = self._over.get(key, changes)
        if found is None:
            share: list[QueueState] = []
            quota: list[QueueState] = []
            for q in self.projects[queue.pool]:
                if q.over(q.fair_share, held) or (q.parent is not queue.parent and q.parent is not None
                                                  and q.parent.over(q.parent.fair_share, held)):
                    share.append(q)
                elif q.over(q.quota_bound, held):
                    quota.append(q)
            found = self._over.put(key, changes, (share, quota))
        return [q for q in found[0] if q is not queue], [q for q in found[1] if q is not queue]

    def admit(self, queue: QueueState, heads: list[Entry]) -> list[Entry]:
        """The groups to serve: those whose one task keeps the queue within its fair share."""
        # Every group of a long backlog passes here: fits_fair_share, inline, with the same arithmetic.
        state = self.state
        share = queue.fair_share
        gpu, cpu, mem = queue.alloc_gpu, queue.alloc_cpu, queue.alloc_mem
        gpu_level, cpu_level, mem_level = share.gpu + EPS, share.cpu + EPS, share.memory + EPS
        admitted = []
        turns = state.turns
        for entry in heads:
            turns.step()
            group: Group = entry[2]
            need = group.need
            if need is None:
                need = state.group_need(group)
            if not ((need.gpu > EPS and gpu + need.gpu > gpu_level) or (need.cpu > EPS and cpu + need.cpu > cpu_level)
                    or (need.memory > EPS and mem + need.memory > mem_level)):
                admitted.append(entry)
        return admitted

    def blocked(self, queue: QueueState) -> bool:
        """True when every group the queue has left would fail: each of its smallest groups (the cover)
        failed or would take the queue over its fair share, and every other group is at least as large."""
        failures = self.failed.get(queue)
        if failures is None:
            return False
        stamp = (failures.version, queue.changes)
        if self._unblocked.get(queue, stamp) is not None:
            return False
        state = self.state
        cover = state.covers.of(queue)
        if not cover:
            self._unblocked.put(queue, stamp, True)
            return False
        for group in cover:
            job = group.jobs[0]
            tasks = max(job.gang_minimum, 1)
            need = state.group_need(group)
            if queue.fits_fair_share(need if tasks == 1 else need.scaled(tasks)) and failures.find(job, tasks) is None:
                self._unblocked.put(queue, stamp, True)
                return False
        return True

    def _some_job_fits(self, queue: QueueState) -> bool:
        """False when none of the queue's smallest requests fits its fair share: then no job does."""
        cover = self.state.covers.of(queue)
        state = self.state
        return cover is None or any(queue.fits_fair_share(state.group_need(group)) for group in cover)


def _below_fair_share(queue: QueueState) -> bool:
    """True when the queue holds less than its fair share of some resource."""
    share = queue.fair_share
    return (queue.alloc_gpu < share.gpu - EPS or queue.alloc_cpu < share.cpu - EPS
            or queue.alloc_mem < share.memory - EPS)


class _Claim:
    """One pending job's try to take back what its queue is owed, and the rule its victims must meet.

    While ``strict``, a victim may go only when each of its queues is over
    its fair share; ``passed_over`` then notes a victim refused only
    because its queue is over only its quota. The job's tasks placed so far
    are its queue's already: only the rest is still to come (``need_now``).
    """

    def __init__(self, state: ClusterState, job: JobSpec, queue: QueueState, tasks: int, need: Resources,
                 waiting: int) -> None:
        self.state = state
        self.job = job
        self.queue = queue
        self.tasks = tasks
        self.need = need
        self.waiting = waiting
        held = self.held = state.task_need(job)
        self.holds_gpu, self.holds_cpu, self.holds_mem = held.gpu > EPS, held.cpu > EPS, held.memory > EPS
        self.strict = True
        self.passed_over = False
        # Whether a queue's victims may go, by what they give back: stamped with the state's ``changes``.
        self._judged: Memo[tuple, bool] = Memo()

    def need_now(self) -> Resources:
        """What the job's tasks still to come will hold."""
        left = self.tasks - (self.waiting - self.state.pending_count(self.job.id))
        return self.need if left >= self.tasks else self.state.need(self.job, left if left > 1 else 1)

    def may_go(self, victim: Victim) -> bool:
        """Whether the victim's queues may give back what it holds, under the rule as it stands now."""
        if victim.queue is None:
            return False
        request = victim.job.request  # which resources _taken would give back, without making it
        key = (victim.queue, self.holds_gpu and request.uses_gpu, self.holds_cpu and request.cpus > EPS,
               self.holds_mem and request.memory_gib > EPS, self.strict)
        changes = self.state.changes
        known = self._judged.get(key, changes)
        if known is None:
            found = _levels(self.queue, victim.queue, _taken(self.held, victim.job), self.need_now())
            known = self._judged.put(key, changes, found is not None and (
                not self.strict or all(over_fair for _, over_fair in found)))
            if found is not None and not known:
                self.passed_over = True
        return known

    def eligible(self, victim: Victim) -> Evicted | None:
        """Why the victim goes (its queues over their levels), or None when it may not, asked just before."""
        if victim.queue is None:
            return None
        taken = _taken(self.held, victim.job)
        coming = self.need_now()
        found = _levels(self.queue, victim.queue, taken, coming)
        if found is None:
            return None
        if self.strict and not all(over_fair for _, over_fair in found):
            self.passed_over = True
            return None
        why = []
        resource = "gpu"
        for theirs, over_fair in found:
            bound = theirs.fair_share if over_fair else theirs.quota_bound
            resource = _over_in(theirs, bound, taken)
            level = theirs.fair_share if over_fair else theirs.quota
            why.append(OverLevel(theirs.kind, theirs.name, resource, theirs.allocated.get(resource),
                                 level.get(resource), over_fair))
        queue = self.queue
        after = queue.allocated.get(resource) + coming.get(resource)
        return Evicted(RULE, self.job.id, queue.name, over=tuple(why), resource=resource, after=after,
                       fair_share=queue.fair_share.get(resource))
