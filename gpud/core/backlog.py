"""The pending jobs of every queue, kept in order across cycles and grouped by the shape of their request.

Jobs of one shape (same request, gang size, node selector, pool and
preemptibility) in one queue succeed or fail alike whenever the reason is
capacity or a queue rule, so a cycle that finds the first of them blocked
passes over the whole group at once instead of trying thousands of jobs one
by one.
"""

from __future__ import annotations

import bisect
from typing import Any, Final, Iterable, Iterator, Mapping

from gpud.core.orders import JobOrder
from gpud.core.queues import QueueState
from gpud.core.turns import NO_TURNS, Turns
from gpud.model import JobSpec, Resources


RESHAPED_KEPT: Final = 256  # changes of a queue's groups listed one by one between two readings (``Backlog.reshaped``)


class Group:
    """Pending jobs of one queue and one shape, in job order; ``seq`` numbers the groups in the order made.

    ``need`` is what one task of its jobs holds at most (they share their
    request and pool), kept by ``ClusterState.group_need`` once asked;
    ``sid`` the number of their shape as the failure memory compares it
    (``ShapeIndex.of_group``), -1 until asked. ``user`` is the owner of its
    jobs when the backlog groups by user, else "".
    """

    __slots__ = ("queue", "shape", "seq", "jobs", "keys", "need", "sid", "user")

    def __init__(self, queue: QueueState, shape: tuple, seq: int, user: str = "") -> None:
        self.queue = queue
        self.shape = shape
        self.seq = seq
        self.user = user
        self.jobs: list[JobSpec] = []
        self.keys: list[Any] = []
        self.need: Resources | None = None
        self.sid = -1

    def __repr__(self) -> str:
        return f"Group({self.queue.name}, {len(self.jobs)} jobs)"


def shape_of(job: JobSpec, partly_running: bool, alone: bool = False, by_user: bool = False) -> tuple:
    """The grouping key of a pending job; a job that already runs some tasks is a group of its own.

    ``by_user`` keeps the jobs of different users apart (their last field), for the user order.
    """
    if partly_running or alone:
        return ("job", job.id)
    key = _request_key(job, by_user)
    # Jobs of different time limits are apart: a shorter one may start where a longer one may not (backfill).
    return key if job.time_limit is None else (*key, job.time_limit)


def _request_key(job: JobSpec, by_user: bool) -> tuple:
    r = job.request
    if r.gpu_memory_gib is None and not job.node_selector:  # most jobs: a shorter key, quicker to hash and compare
        if by_user:
            return (r.gpus, r.cpus, r.memory_gib, job.tasks, job.gang_minimum, job.pool, job.preemptible, job.user)
        return (r.gpus, r.cpus, r.memory_gib, job.tasks, job.gang_minimum, job.pool, job.preemptible)
    selector = tuple(sorted(job.node_selector.items())) if job.node_selector else ()
    if by_user:
        return (r.gpus, r.gpu_memory_gib, r.cpus, r.memory_gib, job.tasks, job.gang_minimum, selector, job.pool,
                job.preemptible, job.user)
    return (r.gpus, r.gpu_memory_gib, r.cpus, r.memory_gib, job.tasks, job.gang_minimum, selector, job.pool,
            job.preemptible)


class _Changes:
    """The jobs whose group in a backlog changed during one stretch of time, each with its group when
    the stretch began (None: it was not waiting), and the changes of the stretch after."""

    __slots__ = ("before", "later")

    def __init__(self) -> None:
        self.before: dict[str, Group | None] = {}
        self.later: _Changes | None = None


class GroupsAsOf(Mapping[str, Group]):
    """Each waiting job's group as ``Backlog.group_of`` had it at one moment, read while the backlog moves on.

    Nothing is copied: a reading looks at what changed since that moment
    (the backlog notes a job's group before its first change after each
    moment asked for) and otherwise at the backlog as it is. Jobs unchanged
    since come in the backlog's order, then those changed since.
    """

    def __init__(self, now: dict[str, Group], since: _Changes) -> None:
        self._now = now
        self._since = since

    def __getitem__(self, job_id: str) -> Group:
        changes: _Changes | None = self._since
        while changes is not None:
            if job_id in changes.before:
                group = changes.before[job_id]
                if group is None:
                    raise KeyError(job_id)
                return group
            changes = changes.later
        return self._now[job_id]

    def _changed(self) -> dict[str, Group | None]:
        """Each job changed since the moment, with its group then (None: not waiting)."""
        changed: dict[str, Group | None] = {}
        changes: _Changes | None = self._since
        while changes is not None:
            for job_id, group in changes.before.items():
                if job_id not in changed:
                    changed[job_id] = group
            changes = changes.later
        return changed

    def __iter__(self) -> Iterator[str]:
        changed = self._changed()
        if not changed:
            yield from self._now
            return
        for job_id in self._now:
            if job_id not in changed:
                yield job_id
        for job_id, group in changed.items():
            if group is not None:
                yield job_id

    def __len__(self) -> int:
        changed = self._changed()
        now = self._now
        return (len(now) - sum(1 for job_id in changed if job_id in now)
                + sum(1 for group in changed.values() if group is not None))


class Backlog:
    """Every pending job, by queue and shape, each group sorted by the job-order plugin."""

    def __init__(self, order: JobOrder, one_per_group: bool = False, by_user: bool = False,
                 turns: Turns = NO_TURNS) -> None:
        """Groups sorted by ``order``'s keys; ``one_per_group`` puts every job in a group of its own, for
        plugins that judge job by job; ``by_user`` keeps each group to one user's jobs and counts each
        queue's users (``users``)."""
        self._order = order
        self._alone = one_per_group
        self._turns = turns  # given a step per group sorted (gpud.core.turns)
        self.by_user = by_user
        # Per queue, how many groups each user has: the user order matters only where two users wait.
        self.users: dict[QueueState, dict[str, int]] = {}
        # With ``by_user``, each user's groups in a queue as ``heads`` has them (the user order merges them).
        self.user_heads: dict[tuple[QueueState, str], list[tuple]] = {}
        self.by_queue: dict[QueueState, dict[tuple, Group]] = {}
        # Each queue's groups as (first job's key, seq, group), sorted: a heap ready for each action.
        self.heads: dict[QueueState, list[tuple]] = {}
        self.groups_made = 0
        # Bumped for a queue whenever one of its groups is made or emptied: what is derived from a
        # queue's shapes (gpud.core.cover) holds while it stands still.
        self.shape_versions: dict[QueueState, int] = {}
        # The groups made or emptied since the queue's shapes were last read (``reshaped``); None once
        # there were too many to be worth reading one by one.
        self._reshaped: dict[QueueState, list[Group] | None] = {}
        self.group_of: dict[str, Group] = {}
        self._since: _Changes | None = None  # what changed since the last ``as_of_now``, if ever asked

    @property
    def order(self) -> JobOrder:
        """The job order the groups are sorted by."""
        return self._order

    def __len__(self) -> int:
        return len(self.group_of)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self.group_of

    def as_of_now(self) -> GroupsAsOf:
        """``group_of`` as it is now, to be read later however the backlog changes, without a copy."""
        since = _Changes()
        if self._since is not None:
            self._since.later = since
        self._since = since
        return GroupsAsOf(self.group_of, since)

    def _note(self, job_id: str) -> None:
        """Keep the job's group as it is, before its first change since ``as_of_now`` was last asked."""
        since = self._since
        if since is not None and job_id not in since.before:
            since.before[job_id] = self.group_of.get(job_id)

    def _group(self, groups: dict[tuple, Group], queue: QueueState, shape: tuple, user: str,
               listed: bool = True) -> Group:
        group = groups[shape] = Group(queue, shape, self.groups_made, user if self.by_user else "")
        self.groups_made += 1
        if self.by_user:
            users = self.users.setdefault(queue, {})
            users[group.user] = users.get(group.user, 0) + 1
        if listed:
            self._reshape(queue, group)
        return group

    def _reshape(self, queue: QueueState, group: Group) -> None:
        self.shape_versions[queue] = self.shape_versions.get(queue, 0) + 1
        log = self._reshaped.get(queue, [])
        if log is not None:
            log.append(group)
            self._reshaped[queue] = log if len(log) <= RESHAPED_KEPT else None

    def reshaped(self, queue: QueueState) -> list[Group] | None:
        """The queue's groups made or emptied since the last call, in that order (None: too many to list).

        Each call starts a new list; the first call lists every change since the queue's first group.
        """
        return self._reshaped.pop(queue, [])

    def _head_out(self, group: Group) -> None:
        heads = self.heads[group.queue]
        del heads[bisect.bisect_left(heads, (group.keys[0], group.seq))]
        if self.by_user:
            heads = self.user_heads[(group.queue, group.user)]
            del heads[bisect.bisect_left(heads, (group.keys[0], group.seq))]

    def _head_in(self, group: Group) -> None:
        bisect.insort(self.heads.setdefault(group.queue, []), (group.keys[0], group.seq, group))
        if self.by_user:
            heads = self.user_heads.setdefault((group.queue, group.user), [])
            bisect.insort(heads, (group.keys[0], group.seq, group))

    def add(self, job: JobSpec, queue: QueueState, partly_running: bool) -> None:
        """Put a pending job into its queue's group, in order."""
        shape = shape_of(job, partly_running, self._alone, self.by_user)
        groups = self.by_queue.setdefault(queue, {})
        group = groups.get(shape)
        if group is None:
            group = self._group(groups, queue, shape, job.user)
        key = self._order.key(job)
        at = bisect.bisect_right(group.keys, key)
        if at == 0 and group.jobs:
            self._head_out(group)
        group.keys.insert(at, key)
        group.jobs.insert(at, job)
        if at == 0:
            self._head_in(group)
        self._note(job.id)
        self.group_of[job.id] = group

    def extend(self, entries: Iterable[tuple[JobSpec, QueueState, bool]]) -> None:
        """Add many pending jobs at once, as (job, queue, partly running): one sort per group."""
        group_of, job_order, alone = self.group_of, self._order, self._alone
        by_user = self.by_user
        by_queue = self.by_queue
        last_queue: QueueState | None = None
        groups: dict[tuple, Group] = {}
        taken: set[QueueState] = set()
        for job, queue, partly_running in entries:
            shape = shape_of(job, partly_running, alone, by_user)
            if queue is not last_queue:
                taken.add(queue)
                if queue not in by_queue:
                    by_queue[queue] = {}
                groups = by_queue[queue]
                last_queue = queue
            group = groups.get(shape)
            if group is None:
                group = self._group(groups, queue, shape, job.user, listed=False)  # the queue is read whole again
            group.keys.append(job_order.key(job))
            group.jobs.append(job)
            self._note(job.id)
            group_of[job.id] = group
        # Every group of a queue taken in is sorted again: one already in order costs a single pass.
        for queue in taken:
            for group in by_queue[queue].values():
                self._turns.step()
                keys = group.keys
                if len(keys) > 1:
                    order = sorted(range(len(keys)), key=keys.__getitem__)
                    group.keys = [keys[i] for i in order]
                    group.jobs = [group.jobs[i] for i in order]
            self.shape_versions[queue] = self.shape_versions.get(queue, 0) + 1
            self._reshaped[queue] = None
            self.heads[queue] = sorted((group.keys[0], group.seq, group) for group in by_queue[queue].values())
            if by_user:
                per_user: dict[str, list[tuple]] = {}
                for entry in self.heads[queue]:
                    per_user.setdefault(entry[2].user, []).append(entry)
                for user, entries in per_user.items():
                    self.user_heads[(queue, user)] = entries

    def remove(self, job: JobSpec) -> None:
        """Take a job out of the backlog (it started, finished or was cancelled); unknown jobs are ignored.

        ``job`` is the JobSpec the backlog was given, or one with the same job-order key.
        """
        job_id = job.id
        self._note(job_id)
        group = self.group_of.pop(job_id, None)
        if group is None:
            return
        jobs = group.jobs
        at = bisect.bisect_left(group.keys, self._order.key(job))
        while at < len(jobs) and jobs[at].id != job_id:
            at += 1
        if at == len(jobs):  # a key that changed since the job came in: looked for one by one
            at = next(i for i, waiting in enumerate(jobs) if waiting.id == job_id)
        if at == 0:
            self._head_out(group)
        del group.keys[at]
        del jobs[at]
        if not jobs:
            del self.by_queue[group.queue][group.shape]
            self._reshape(group.queue, group)
            if self.by_user:
                users = self.users[group.queue]
                users[group.user] -= 1
                if not users[group.user]:
                    del users[group.user]
        elif at == 0:
            self._head_in(group)

    def jobs(self) -> Iterator[JobSpec]:
        """Every job of the backlog, group by group."""
        for groups in self.by_queue.values():
            for group in groups.values():
                yield from group.jobs
