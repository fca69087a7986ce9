"""The scheduler's state: nodes, queues, placements and the backlog, kept from one cycle to the next."""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterable, Iterator, Sequence

import pluggy

from gpud.core.backlog import Backlog, Group, shape_of
from gpud.core.blockers import UNKNOWN_PROJECT
from gpud.core.cover import QueueCovers
from gpud.core.history import entry_penalty
from gpud.core.limits import LimitBook
from gpud.core.memo import Memo
from gpud.core.nodes import NodeIndex, NodeState, node_kind
from gpud.core.policy_set import PolicySet
from gpud.core.queues import QueueState, build_queues, compute_fair_shares
from gpud.core.shapes import ShapeIndex
from gpud.core.turns import NO_TURNS, Turns
from gpud.core.victim import Victim
from gpud.model import ZERO, Blocker, Evicted, JobSpec, Resources, Snapshot, TaskPlacement, TaskRequest
from gpud.policy import YOUNGEST_FIRST, Policy



class ClusterState:
    """The scheduler's bookkeeping, kept from one cycle to the next: nodes, queues, jobs, their
    placements and the backlog, with what is derived from them (indexes, counters, memos).

    Built from a snapshot; afterwards jobs come and go through ``add_job`` and
    ``remove_job``, each cycle starts with ``begin_cycle`` and ends with
    ``commit``, which makes the cycle's placements the new baseline. During a
    cycle, placements change only through a ``Statement``. What a cycle
    finds out (why each job waits or was evicted) lives in its ``Session``
    (gpud.core.session).
    The snapshot itself is never modified.
    """

    def __init__(self, snapshot: Snapshot, policy: Policy, pm: pluggy.PluginManager,
                 turns: Turns = NO_TURNS) -> None:
        """``turns``: the daemon's turns, given every so many steps of the long loops (gpud.core.turns)."""
        self.turns = turns
        self.policy = policy
        self.pm = pm
        self.hook = pm.hook
        self.now = snapshot.now
        self.usage = snapshot.usage  # decayed GPU-seconds by (level, pool, name), as charged so far
        self.cycle = 0
        kinds: dict[tuple, int] = {}
        self.nodes: dict[str, NodeState] = {}
        for spec in snapshot.nodes:
            turns.step()
            self.nodes[spec.name] = NodeState(spec, kinds.setdefault(node_kind(spec), len(kinds)))
        pool_nodes: dict[str, list[NodeState]] = defaultdict(list)
        for node in self.nodes.values():
            if node.spec.schedulable:
                pool_nodes[node.pool].append(node)
        pools = set(pool_nodes) | {n.pool for n in self.nodes.values()}
        # The snapshot's jobs are registered in bulk here, none placed; ``_take`` books their running tasks.
        # A job none of whose tasks is placed shares one tuple of Nones with the jobs of its size;
        # its first bind gives it a list of its own, so a long backlog costs no list per job.
        self._unplaced: dict[int, tuple[None, ...]] = {}
        self.jobs: dict[str, JobSpec] = {}
        self.placements: dict[str, list[TaskPlacement | None] | tuple[None, ...]] = {}
        jobs, placements, unplaced = self.jobs, self.placements, self._unplaced_tuple
        for job in snapshot.jobs:
            turns.step()
            jobs[job.id] = job
            placements[job.id] = unplaced(job.tasks)
            pools.add(job.pool or policy.default_pool)
        pools |= set(policy.pools) | {policy.default_pool}
        self.indexes = {pool: NodeIndex(pool, pool_nodes.get(pool, []), turns) for pool in sorted(pools)}
        self.queues = build_queues(policy, sorted(pools))
        self.capacity = {pool: self._capacity(pool) for pool in self.indexes}
        # Each queue's jobs that hold some placement, with their JobSpec as ``jobs`` has it.
        self.running: dict[QueueState, dict[str, JobSpec]] = defaultdict(dict)
        self.pending_need: dict[QueueState, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        self.job_specific_plugins = bool(self.hook.gpud_filter_node.get_hookimpls()
                                         or self.hook.gpud_can_evict.get_hookimpls())
        self.shapes = ShapeIndex(self)
        # By job: what one task needs, stamped with the job's request (``task_need``).
        self._task_needs: Memo[str, Resources] = Memo()
        # The same, by what is asked (``_request_key``): one Resources for every job that asks alike.
        self._needs_by_request: dict[tuple, Resources] = {}
        self.covers = QueueCovers(self)
        self.policies = PolicySet(pm, youngest_first=policy.victim_order == YOUNGEST_FIRST,
                                  age_weight=policy.age_weight)
        # The user order needs a job order whose keys put priority first, and one user per group.
        self.user_order = policy.fair_share.user_order and self.policies.job_order.priority_first
        self.backlog = Backlog(self.policies.job_order, self.job_specific_plugins, self.user_order, turns)
        # GPUs each user holds in each queue, by queue then user, kept while the user order is on
        # (gpud.core.queue_walk): a queue's users are read together, by a key whose hash is kept.
        self.user_gpus: dict[QueueState, dict[str, float]] = {}
        # The users' and projects' holdings against the policy's limits, when it sets any.
        self.book = LimitBook(policy) if policy.has_limits else None
        if self.book is not None:
            for queue in self.queues.values():
                if queue.kind == "project":
                    queue.book = self.book
        self.orphans: dict[str, Blocker] = {}
        self.touched: set[str] = set()
        self.releases = 0
        # Each node released on this cycle, by the number of its latest release (``releases`` then), in
        # the order of those releases: the nodes released since any count are at its end, each once.
        self._released: dict[str, int] = {}
        self._log_base = 0  # ``releases`` when the cycle began
        self.changes = 0  # binds and releases: what is derived from allocations holds while it stands still
        self.changes_at_begin = 0
        self.limited = 0  # jobs with a time limit: without any, no reservation can be planned
        # One bulk insertion into the backlog, fed as the jobs' running tasks are booked.
        self.backlog.extend(self._take(snapshot.jobs, registered=True))
        self.touched = set()

    # --- jobs coming and going, cycles beginning and ending ------------------------------------

    def add_job(self, job: JobSpec) -> None:
        """Take in a job: its running tasks hold their resources, its pending tasks join the backlog."""
        for waiting, queue, partly_running in self._take((job,)):
            self.backlog.add(waiting, queue, partly_running)

    def _unplaced_tuple(self, tasks: int) -> tuple[None, ...]:
        """The tuple of Nones shared by every job of ``tasks`` tasks none of which is placed."""
        unplaced = self._unplaced.get(tasks)
        if unplaced is None:
            unplaced = self._unplaced[tasks] = (None,) * tasks
        return unplaced

    def _take(self, jobs: Iterable[JobSpec], registered: bool = False) -> Iterator[tuple[JobSpec, QueueState, bool]]:
        """Register jobs (unless ``registered`` says it is done, none placed yet) and book what their
        running tasks hold.

        Yields (job, its queue, whether some of its tasks run) for each job
        with tasks left to place, as the backlog takes them in.
        """
        default_pool = self.policy.default_pool
        queues, known, placements = self.queues, self.jobs, self.placements
        nodes, pending_need = self.nodes, self.pending_need
        # The queue of each project for jobs of the default pool, the common case, looked up by the name alone.
        in_default: dict[str, QueueState | None] = {}
        turns = self.turns
        for job in jobs:
            turns.step()
            job_id, tasks = job.id, job.tasks
            if job.time_limit is not None:
                self.limited += 1
            if not registered:
                known[job_id] = job
                placements[job_id] = self._unplaced_tuple(tasks)
            if job.pool:
                queue = queues.get((job.project, job.pool))
            elif job.project in in_default:
                queue = in_default[job.project]
            else:
                queue = in_default[job.project] = queues.get((job.project, default_pool))
            if queue is None:
                self.orphans[job_id] = Blocker(UNKNOWN_PROJECT, name=job.project)
                # Its running tasks run on (a policy reload does not stop them): their GPUs stay theirs.
                for task, placement in enumerate(job.placements):
                    if placement is not None and placement.node in nodes:
                        self._bind(job, task, placement)
                continue
            request = job.request  # what _add_pending does, inline: a long backlog passes here job by job
            acc = pending_need[queue]
            acc[0] += (request.gpus if request.gpu_memory_gib is None else self.task_need(job).gpu) * tasks
            acc[1] += request.cpus * tasks
            acc[2] += request.memory_gib * tasks
            running = 0
            if job.placements:
                for task, placement in enumerate(job.placements):
                    if placement is not None and placement.node in nodes:
                        self._bind(job, task, placement)
                        running += 1
                if running == tasks:
                    continue
            yield job, queue, running > 0

    def remove_job(self, job_id: str) -> None:
        """Forget a job that finished or was cancelled, releasing what its tasks held."""
        job = self.jobs.pop(job_id, None)
        if job is None:
            return
        self.orphans.pop(job_id, None)
        if job.time_limit is not None:
            self.limited -= 1
        for task in self.running_tasks(job_id):
            self._unbind(job, task)
        queue = self.queue_of(job)
        if queue is not None:
            self._add_pending(queue, job, -job.tasks)
        self.backlog.remove(job)
        self.shapes.forget(job_id)
        self._task_needs.forget(job_id)
        del self.placements[job_id]

    def begin_cycle(self, now: float | None = None) -> None:
        """Start a cycle at ``now``: forget the last cycle's evictions, compute every queue's fair share."""
        if now is not None:
            self.now = now
        self.cycle += 1
        self.changes_at_begin = self.changes
        self.touched = set()
        self._released = {}
        self._log_base = self.releases
        demand = {}
        for queue in self.queues.values():
            if queue.kind == "project":
                need = self.pending_need.get(queue)  # held plus asked, made as one Resources
                demand[(queue.name, queue.pool)] = (queue.allocated if not need else Resources(
                    queue.alloc_gpu + need[0], queue.alloc_cpu + need[1], queue.alloc_mem + need[2]))
        usage = self.effective_usage() if self.policy.fair_share.uses_history else None
        compute_fair_shares(self.policy, self.queues, self.capacity, demand, usage)

    def effective_usage(self) -> dict[tuple[str, str, str], float]:
        """The charged usage plus each recently started job's entry penalty (gpud.core.history), by
        (level, pool, name) for its department, project and user."""
        usage = dict(self.usage)
        window, now = self.policy.fair_share.entry_penalty_s, self.now
        if window <= 0:
            return usage
        for queue, jobs in self.running.items():
            for job in jobs.values():
                started = job.started if job.started is not None else now  # placed this cycle: just now
                if now - started >= window:
                    continue
                gpus = 0.0
                for placement in self.placements[job.id]:
                    if placement is not None:
                        gpus += placement.gpu_share * len(placement.gpu_index)
                extra = entry_penalty(gpus, started, now, window)
                if extra <= 0:
                    continue
                pool = queue.pool
                keys = [("project", pool, queue.name), ("user", pool, job.project + "/" + job.user)]
                if queue.parent is not None:
                    keys.append(("department", pool, queue.parent.name))
                for key in keys:
                    usage[key] = usage.get(key, 0.0) + extra
        return usage

    def commit(self) -> None:
        """Make this cycle's placements the baseline: started jobs start, evicted ones wait again."""
        backlog, jobs = self.backlog, self.jobs
        for job, current, running, waiting in self._changed():
            # A job that ran on, not moved, keeps its start; one moved restarts now (a move is a stop and a start).
            started = ((job.started if job.is_running and not moved(job, current) else self.now) if running
                       else None)
            updated = _with_placements(job, current, started)
            jobs[job.id] = updated
            backlog.remove(job)
            queue = self.queue_of(updated)
            if running and queue is not None:
                self.running[queue][job.id] = updated
            if waiting and queue is not None:  # a job of a project the policy dropped waits as an orphan
                backlog.add(updated, queue, partly_running=running)

    def waiting_after(self) -> dict[str, Group]:
        """Each job that waits after this cycle with its group, in order, as ``commit`` would leave
        ``backlog.group_of``; nothing is changed (for a last cycle, whose state no cycle reads again).

        A job that would join the backlog anew gets the group of its shape as it is now, or a group
        of its own when there is none.
        """
        waiting_jobs = self.backlog.group_of.copy()
        joining = []
        for job, current, running, waiting in self._changed():
            waiting_jobs.pop(job.id, None)
            queue = self.queue_of(job)
            if waiting and queue is not None:
                joining.append((job, queue, running))
        for job, queue, running in joining:
            shape = shape_of(job, running, self.job_specific_plugins, self.user_order)
            group = self.backlog.by_queue.get(queue, {}).get(shape)
            waiting_jobs[job.id] = group if group is not None else Group(
                queue, shape, -1, job.user if self.user_order else "")
        return waiting_jobs

    def _changed(self) -> Iterator[tuple[JobSpec, tuple[TaskPlacement | None, ...], bool, bool]]:
        """(job, its placements now, whether some task runs, whether some task waits) for each job whose
        placements this cycle changed, by job id."""
        jobs, placements = self.jobs, self.placements
        turns = self.turns
        for job_id in sorted(self.touched):  # a cold cycle starts and stops thousands of jobs: kept lean
            turns.step()
            job = jobs.get(job_id)
            if job is None:
                continue
            current = tuple(placements[job_id])
            tasks, known = job.tasks, job.placements
            before = known if len(known) == tasks else tuple(job.task_placement(i) for i in range(tasks))
            if current == before:
                continue
            running = waiting = False
            for placement in current:  # "is None", never "in": a TaskPlacement would be compared with None
                if placement is None:
                    waiting = True
                else:
                    running = True
            yield job, current, running, waiting

    def _add_pending(self, queue: QueueState, job: JobSpec, tasks: int) -> None:
        request = job.request
        if request.gpu_memory_gib is None:
            gpu = request.gpus
        else:
            gpu = self.task_need(job).gpu
        acc = self.pending_need[queue]
        acc[0] += gpu * tasks
        acc[1] += request.cpus * tasks
        acc[2] += request.memory_gib * tasks

    def _capacity(self, pool: str) -> Resources:
        """All the GPUs, CPUs and memory of a pool's nodes."""
        return sum((Resources(n.spec.usable_gpus, n.spec.cpus, n.spec.memory_gib)
                    for n in self.nodes.values() if n.pool == pool), Resources())

    # --- reading ------------------------------------------------------------------------------

    def pool_of(self, job: JobSpec) -> str:
        """The node pool a job runs in: its own, or the policy's default pool."""
        return job.pool or self.policy.default_pool

    def queue_of(self, job: JobSpec) -> QueueState | None:
        """The project queue a job belongs to, None when the policy does not know its project."""
        return self.queues.get((job.project, self.pool_of(job)))

    def project_queue(self, job: JobSpec) -> QueueState:
        """The project queue of a job whose project the policy knows (every job of the backlog)."""
        return self.queues[(job.project, self.pool_of(job))]

    def task_need(self, job: JobSpec) -> Resources:
        """What one pending task of the job will hold at most.

        A memory slice is counted on the smallest GPU that can hold it, the
        largest share it may take, so quota checks made before placement
        still hold after it.
        """
        request = job.request
        known = self._task_needs.get(job.id, request)  # the pool's GPUs stay as they are
        if known is not None:
            return known
        # A backlog of 100,000 jobs asks a few hundred different things: the jobs that ask alike share
        # one answer, worked out by the first of them.
        key = self._request_key(job, request)
        need = self._needs_by_request.get(key)
        if need is None:
            if request.gpu_memory_gib is not None:
                size = self.indexes[self.pool_of(job)].smallest_gpu_holding(request.gpu_memory_gib)
                gpu = request.gpu_memory_gib / (size or request.gpu_memory_gib)
            else:
                gpu = request.gpus
            need = self._needs_by_request[key] = Resources(gpu, request.cpus, request.memory_gib)
        return self._task_needs.put(job.id, request, need)

    def _request_key(self, job: JobSpec, request: TaskRequest) -> tuple:
        """What ``task_need`` depends on: the request's amounts, each with its type (an amount given as
        an int stays one in the answer, as reasons show it), and for a memory slice the job's pool,
        whose GPUs decide the share it takes."""
        gpus, cpus, memory = request.gpus, request.cpus, request.memory_gib
        if request.gpu_memory_gib is None:
            return (gpus, cpus, memory, type(gpus), type(cpus), type(memory))
        return (None, request.gpu_memory_gib, cpus, memory, type(cpus), type(memory), self.pool_of(job))

    def group_need(self, group: Group) -> Resources:
        """What one pending task of any job of the group will hold at most (``task_need``), kept on the group."""
        need = group.need
        if need is None:
            need = group.need = self.task_need(group.jobs[0])
        return need

    def need(self, job: JobSpec, tasks: int) -> Resources:
        """What ``tasks`` pending tasks of the job will hold."""
        if tasks == 1:
            return self.task_need(job)
        if not tasks:
            return ZERO
        return self.task_need(job).scaled(tasks)

    def released_since(self, releases: int, most: int | None = None) -> list[str] | None:
        """The nodes where something was released since ``releases`` was the count (``self.releases``),
        each once, the latest first; None when that count is from before this cycle, or when there are
        more than ``most`` of them (when given)."""
        if releases < self._log_base:
            return None
        # Read from the end, as far back as ``releases``: as many steps as nodes released since, however
        # many releases there were (a cycle that evicts thousands asks this after each failed search).
        names: list[str] = []
        for name, number in reversed(self._released.items()):
            if number <= releases:
                break
            if most is not None and len(names) == most:
                return None
            names.append(name)
        return names

    def running_tasks(self, job_id: str) -> list[int]:
        """Indices of the job's tasks that hold a placement now."""
        return [i for i, p in enumerate(self.placements[job_id]) if p is not None]

    def pending_tasks(self, job_id: str) -> list[int]:
        """Indices of the job's tasks that wait for a placement."""
        return [i for i, p in enumerate(self.placements[job_id]) if p is None]

    def users_gpus(self, queue: QueueState) -> dict[str, float]:
        """The GPUs each user holds in the queue (none: absent), kept up to date as tasks bind and release
        while the user order is on; the same dict for the queue from its first asking on."""
        held = self.user_gpus.get(queue)
        if held is None:
            held = self.user_gpus[queue] = {}
        return held

    def pending_count(self, job_id: str) -> int:
        """How many of the job's tasks wait for a placement."""
        return self.placements[job_id].count(None)

    def victims(self, queue: QueueState, preemptible_only: bool = False,
                too_young: Callable[[JobSpec], bool] | None = None) -> list[Victim]:
        """The running jobs of one queue (only the preemptible ones if asked, and none ``too_young`` says is
        too young), as eviction candidates. A job too young is left out before a Victim is made for it:
        after a burst of starts, most are."""
        turns = self.turns
        found = []
        for job_id, job in self.running[queue].items():
            turns.step()
            if (job.preemptible or not preemptible_only) and (too_young is None or not too_young(job)):
                found.append(Victim(job, queue, self.running_tasks(job_id), self.now))
        return found

    # --- changing (only through a Statement) ---------------------------------------------------

    def _bind(self, job: JobSpec, task: int, placement: TaskPlacement) -> None:
        self.turns.step()  # every placement tried and undone is a step
        self.touched.add(job.id)
        self.changes += 1
        node = self.nodes[placement.node]
        node.take((job.id, task), placement, job.request)
        index = self.indexes.get(node.pool)
        request = job.request
        gpu, cpu, mem = placement.gpu_share * len(placement.gpu_index), request.cpus, request.memory_gib
        if node.spec.schedulable and index is not None:
            index.update(node, placement.gpu_index)
            index.free_gpu -= gpu
            index.free_cpu -= cpu
            index.free_mem -= mem
        slots = self.placements[job.id]
        if isinstance(slots, tuple):
            slots = self.placements[job.id] = list(slots)
        slots[task] = placement
        queue = self.queue_of(job)
        if queue is not None:
            queue.charge(gpu, cpu, mem, job.preemptible)
            if self.book is not None:
                self.book.change(job, gpu, 0 if job.id in self.running[queue] else 1)
            self.running[queue][job.id] = job
            self._add_pending(queue, job, -1)
            if self.user_order:
                held = self.users_gpus(queue)
                held[job.user] = held.get(job.user, 0.0) + gpu

    def _note_release(self, node: str) -> None:
        """Keep ``node`` as released at the count now (``releases``), after every node released before."""
        released = self._released
        released.pop(node, None)
        released[node] = self.releases

    def _unbind(self, job: JobSpec, task: int) -> TaskPlacement:
        self.turns.step()
        self.touched.add(job.id)
        self.releases += 1
        self.changes += 1
        slots = self.placements[job.id]
        placement = slots[task]
        assert placement is not None and isinstance(slots, list), f"task {task} of job {job.id} is not running"
        self._note_release(placement.node)
        node = self.nodes[placement.node]
        node.give_back((job.id, task), job.request)
        index = self.indexes.get(node.pool)
        request = job.request
        gpu, cpu, mem = placement.gpu_share * len(placement.gpu_index), request.cpus, request.memory_gib
        if node.spec.schedulable and index is not None:
            index.update(node, placement.gpu_index)
            index.free_gpu += gpu
            index.free_cpu += cpu
            index.free_mem += mem
        slots[task] = None
        queue = self.queue_of(job)
        if queue is not None:
            queue.charge(-gpu, -cpu, -mem, job.preemptible)
            self._add_pending(queue, job, 1)
            if self.book is not None:
                self.book.change(job, -gpu, 0 if any(p is not None for p in self.placements[job.id]) else -1)
            if self.user_order:
                held = self.users_gpus(queue)
                held[job.user] = held.get(job.user, 0.0) - gpu
            if not any(p is not None for p in self.placements[job.id]):
                del self.running[queue][job.id]
        return placement


    def hold(self, node: NodeState, key: tuple[str, int], placement: TaskPlacement, request: TaskRequest) -> None:
        """Keep room on a node out of reach (a reservation's), as a task no job owns: placements do not change."""
        self.changes += 1
        node.take(key, placement, request)
        self._index_change(node, placement, request, -1.0)

    def unhold(self, node: NodeState, key: tuple[str, int], request: TaskRequest) -> None:
        """Give back room ``hold`` kept; it counts as a release (free room grew)."""
        self.changes += 1
        self.releases += 1
        self._note_release(node.name)
        placement = node.give_back(key, request)
        self._index_change(node, placement, request, 1.0)

    def _index_change(self, node: NodeState, placement: TaskPlacement, request: TaskRequest, sign: float) -> None:
        index = self.indexes.get(node.pool)
        if node.spec.schedulable and index is not None:
            index.update(node, placement.gpu_index)
            index.free_gpu += sign * placement.gpu_share * len(placement.gpu_index)
            index.free_cpu += sign * request.cpus
            index.free_mem += sign * request.memory_gib


def moved(job: JobSpec, placements: Sequence[TaskPlacement | None]) -> bool:
    """True when a task of the job that ran before the cycle runs elsewhere in ``placements`` (a move: the job
    stops and starts again, so its run, and its time limit, begin anew)."""
    for task, before in enumerate(job.placements):
        if before is not None and task < len(placements):
            after = placements[task]
            if after is not None and after != before:
                return True
    return False


def _with_placements(job: JobSpec, placements: tuple[TaskPlacement | None, ...], started: float | None) -> JobSpec:
    """The job with new placements and start time, every other field kept.

    Made field by field rather than with ``dataclasses.replace``, which
    looks the fields up by name on every call (a commit copies every job
    the cycle placed or evicted); ``test_a_started_job_keeps_every_field_of_its_spec``
    fails when a field of JobSpec is missing here.
    """
    return JobSpec(job.id, job.project, job.request, job.priority, job.tasks, job.min_tasks, job.submitted, started,
                   placements, job.node_selector, job.pool, job.seq, job.user, job.checkpointed, job.time_limit,
                   job.predicted_runtime)


# Each evicted job's (eviction rule, reason, the job it made room for), by job id.
EvictedBy = dict[str, tuple[str, Evicted | None, str | None]]


class Statement:
    """A sequence of tentative changes to a ClusterState that commits whole or rolls back.

    ``checkpoint`` marks a point; ``rollback`` undoes everything after a mark
    (or everything). Nothing needs doing to commit: the changes are already in
    the state, and dropping the statement keeps them.
    """

    def __init__(self, state: ClusterState, evicted_by: EvictedBy | None = None) -> None:
        """``evicted_by``: where each evicted job's rule, reason and preemptor go (the cycle's,
        ``ReasonRecorder.evicted``); a statement that only binds needs none."""
        self.state = state
        self.evicted_by: EvictedBy = {} if evicted_by is None else evicted_by
        self._undo: list[tuple] = []

    def bind(self, job: JobSpec, task: int, placement: TaskPlacement) -> None:
        """Place task ``task`` of ``job``."""
        self.state._bind(job, task, placement)
        self._undo.append(("bind", job, task))

    def evict(self, job: JobSpec, task: int, rule: str, reason: Evicted | None, for_job: str | None) -> TaskPlacement:
        """Remove task ``task`` of ``job`` from its node, recording why; returns where it was."""
        placement = self.state._unbind(job, task)
        self._undo.append(("evict", job, task, placement, self.evicted_by.get(job.id)))
        self.evicted_by[job.id] = (rule, reason, for_job)
        return placement

    def checkpoint(self) -> int:
        """A mark to roll back to."""
        return len(self._undo)

    def rollback(self, mark: int = 0) -> None:
        """Undo every change made after ``mark``, latest first."""
        state = self.state
        while len(self._undo) > mark:
            op = self._undo.pop()
            if op[0] == "bind":
                state._unbind(op[1], op[2])
            else:
                _, job, task, placement, previous = op
                state._bind(job, task, placement)
                if previous is None:
                    self.evicted_by.pop(job.id, None)
                else:
                    self.evicted_by[job.id] = previous
