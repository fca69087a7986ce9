"""The two-level heap: departments, then projects inside them, then each project's jobs in order."""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from typing import Any, Callable, Iterable

from gpud.core.backlog import Backlog, Group
from gpud.core.queues import QueueState
from gpud.core.state import ClusterState
from gpud.model import JobSpec

# A group by its next job: (that job's key, tiebreak, group). Typed as a plain tuple: the compiled core
# then keeps entries as the tuples they are, where a typed triple is unpacked and made anew when compared.
Entry = tuple
Admit = Callable[[QueueState, list[Entry]], list[Entry]]


class Skip:
    """What an action hands ``serve_in_order`` once a job failed: which groups to pass over whole.

    ``holds`` is asked with a group's next job, its queue and the group (or
    with a job alone, by the action itself); True passes the group over, and
    records why that job waits. A class rather than a function: the compiled
    core calls each action's ``holds`` directly, for every group passed over.
    """

    def holds(self, job: JobSpec, queue: QueueState, group: Group | None = None) -> bool:
        """True when the job cannot start now for the reason an earlier failure gave; its reason is recorded."""
        raise NotImplementedError


class _QueueCursor:
    """Where one action stands in one queue: its groups by their next job, as (key, tiebreak, group).

    The groups come in a sorted run, read from ``next`` on, and a heap of
    the groups pushed since; the first of both is the first of the queue.
    ``at`` holds the index of a group's next job once it is past the first.
    """

    __slots__ = ("queue", "run", "next", "heap", "at", "skip", "usage", "runs")

    def __init__(self, queue: QueueState) -> None:
        self.queue = queue
        self.run: list[Entry] = []
        self.next = 0
        self.heap: list[Entry] = []
        self.at: dict[Group, int] = {}
        self.skip: Skip | None = None
        # Each waiting user's decayed usage in the queue, when the user order sorts it; else None.
        self.usage: dict[str, float] | None = None
        # Then each user's groups in job order, and how many were taken into the heap: the heap holds
        # at most one group of a user's run at a time (entries of four fields, the fourth the user).
        self.runs: dict[str, list] = {}

    def top(self) -> Group | None:
        """The group of the first entry, or None when no group is left."""
        run, heap = self.run, self.heap
        group: Group
        if self.next < len(run) and not (heap and heap[0] < run[self.next]):
            group = run[self.next][2]
            return group
        if heap:
            group = heap[0][2]
            return group
        return None

    def pop(self) -> Group:
        """Take the first entry out; its group."""
        run, heap = self.run, self.heap
        group: Group
        if self.next < len(run) and not (heap and heap[0] < run[self.next]):
            self.next += 1
            group = run[self.next - 1][2]
        else:
            group = heapq.heappop(heap)[2]
        return group


def serve_in_order(state: ClusterState, backlog: Backlog, visit: Callable[[JobSpec], Skip | None],
                   admit: Admit | None = None,
                   queues: Iterable[QueueState] | None = None,
                   drop: Callable[[QueueState], bool] | None = None) -> None:
    """Visit pending jobs, always taking the next job of the most deprived queue.

    Queues compare by the queue-order plugin with their next job, first
    among departments, then among the department's projects; a queue's key
    is recomputed after each of its jobs. ``visit`` may return a ``Skip``:
    from then on, a group of that queue whose next job it holds for is
    passed over whole (the Skip records why that job waits, or why all the
    group's jobs do). ``admit``, given a queue and its groups as
    sorted (key, tiebreak, group) entries before the first visit, returns
    those to serve: the others are not visited at all, nor are queues left
    out of ``queues`` when it is given. Jobs that stopped waiting earlier in
    the cycle are passed over. Once a queue has a Skip, ``drop`` may
    say that the Skip holds for every group the queue has left: they
    are all passed over at once, and no reason is recorded for them here
    (``drop`` records them its own way).
    """
    queue_order = state.policies.queue_order
    tiebreak = itertools.count(backlog.groups_made)
    placements = state.placements
    # Every job of a backlog waits for some task when the cycle begins: only one placed or evicted since
    # (touched) may have stopped waiting. The small set is asked first, not the placements of every job.
    touched = state.touched

    users = backlog.users if state.user_order and backlog.by_user else None
    usage, held = state.usage, state.user_gpus
    window = state.policy.fair_share.entry_penalty_s

    def key_at(cursor: _QueueCursor, group: Group, i: int) -> Any:
        """The key of the group's job ``i`` in its queue's order: the job order's, or the user order's."""
        known = cursor.usage
        if known is None:
            return group.keys[i]
        key = group.keys[i]
        gpus = held.get((cursor.queue, group.user), 0.0)
        return (key[0], known.get(group.user, 0.0) + window * gpus, gpus, key)

    def user_usage(queue: QueueState) -> dict[str, float] | None:
        """Each waiting user's decayed usage in the queue, None when fewer than two users wait there."""
        if users is None:
            return None
        waiting = users.get(queue)
        if waiting is None or len(waiting) < 2:
            return None
        prefix = queue.name + "/"
        return {user: usage.get(("user", queue.pool, prefix + user), 0.0) for user in waiting}

    def feed(cursor: _QueueCursor, user: str) -> None:
        """Push the next group of the user's run with a job still waiting, keyed in the user order."""
        user_run = cursor.runs[user]
        entries, i = user_run[0], user_run[1]
        while i < len(entries):
            group: Group = entries[i][2]
            i += 1
            jobs = group.jobs
            j, n = cursor.at.get(group, 0), len(jobs)
            while j < n and jobs[j].id in touched and None not in placements[jobs[j].id]:
                j += 1
            if j < n:
                if j:
                    cursor.at[group] = j
                heapq.heappush(cursor.heap, (key_at(cursor, group, j), group.seq, group, user))
                break
        user_run[1] = i

    def take(cursor: _QueueCursor) -> Group:
        """Take the first entry out of a user-ordered queue's heap, feeding the user's next group if it
        came from the user's run; its group."""
        entry = heapq.heappop(cursor.heap)
        if len(entry) == 4:
            feed(cursor, entry[3])
        group: Group = entry[2]
        return group

    def head(cursor: _QueueCursor, group: Group) -> JobSpec | None:
        i = cursor.at.get(group, 0)
        jobs = group.jobs
        while i < len(jobs) and jobs[i].id in touched and None not in placements[jobs[i].id]:
            i += 1
        cursor.at[group] = i
        return jobs[i] if i < len(jobs) else None

    def push_group(cursor: _QueueCursor, group: Group) -> None:
        if head(cursor, group) is not None:
            heapq.heappush(cursor.heap, (key_at(cursor, group, cursor.at[group]), next(tiebreak), group))

    def clean(cursor: _QueueCursor) -> None:
        """Drop groups from the top of a queue's heap while the queue's Skip passes them over."""
        skip, at, queue = cursor.skip, cursor.at, cursor.queue
        if skip is not None and drop is not None and cursor.top() is not None and drop(queue):
            cursor.run, cursor.next, cursor.heap, cursor.runs = [], 0, [], {}
            return
        # cursor.top() and cursor.pop(), inline: every group a Skip passes over comes through here.
        run, heap = cursor.run, cursor.heap
        while True:
            at_run = cursor.next
            if at_run < len(run) and not (heap and heap[0] < run[at_run]):
                top = run[at_run]
            elif heap:
                top = heap[0]
                at_run = -1
            else:
                return
            group: Group = top[2]
            i, jobs = at.get(group, 0), group.jobs
            n = len(jobs)
            while i < n and jobs[i].id in touched and None not in placements[jobs[i].id]:
                i += 1
            first = jobs[i] if i < n else None
            if first is not None and (skip is None or not skip.holds(first, queue, group)):
                if i:
                    at[group] = i
                current = group.keys[i] if cursor.usage is None else key_at(cursor, group, i)
                if current is not top[0] and current != top[0]:  # the very key as a rule: no fields compared
                    if at_run >= 0:
                        cursor.next = at_run + 1
                    elif cursor.usage is None:
                        heapq.heappop(heap)
                    else:
                        take(cursor)
                    heapq.heappush(heap, (current, next(tiebreak), group))
                    continue
                return
            if at_run >= 0:
                cursor.next = at_run + 1
            elif cursor.usage is None:
                heapq.heappop(heap)
            else:
                take(cursor)

    def queue_entry(queue: QueueState, cursor: _QueueCursor) -> tuple:
        """The queue's entry in its heap: its key with its next job, a tiebreak, then the queue itself."""
        group = cursor.top()
        assert group is not None, "a queue without pending groups has no key"
        job = group.jobs[cursor.at.get(group, 0)]
        if job.id in touched or job.placements:
            need = state.need(job, state.pending_count(job.id))
        else:  # every task waits, as when the cycle began; the group keeps what one task needs
            need = state.group_need(group) if job.tasks == 1 else state.need(job, job.tasks)
        return queue_order.entry(queue, job, need, next(tiebreak))

    cursors: dict[QueueState, _QueueCursor] = {}
    chosen = backlog.by_queue if queues is None else {q: backlog.by_queue[q] for q in queues
                                                         if q in backlog.by_queue}
    # Before anything changed in the cycle, every group's first job waits: the sorted heads serve as they are.
    untouched = admit is None and state.changes == state.changes_at_begin
    for queue in chosen:
        # The backlog keeps each queue's groups sorted by first job; only groups whose first job
        # started earlier in the cycle are placed again, by their next job. Ties keep the order
        # the groups were made in, and every entry pushed later comes after them.
        cursor = _QueueCursor(queue)
        cursor.usage = user_usage(queue)
        if cursor.usage is not None:  # a merge of the users' runs, each by its next group, in one heap
            for user in cursor.usage:
                user_run = backlog.user_heads.get((queue, user), [])
                cursor.runs[user] = [user_run if admit is None else admit(queue, user_run), 0]
                feed(cursor, user)
            if cursor.heap:
                cursors[queue] = cursor
            continue
        if untouched:
            cursor.run = backlog.heads.get(queue, [])  # only read: the backlog changes between cycles
            if cursor.run:
                cursors[queue] = cursor
            continue
        at = cursor.at
        entries = cursor.run
        heads = backlog.heads.get(queue, [])
        for entry in heads if admit is None else admit(queue, heads):
            group: Group = entry[2]
            jobs = group.jobs
            if jobs[0].id not in touched or None in placements[jobs[0].id]:
                entries.append(entry)
                continue
            i, n = 1, len(jobs)
            while i < n and jobs[i].id in touched and None not in placements[jobs[i].id]:
                i += 1
            at[group] = i
            if i < n:
                cursor.heap.append((group.keys[i], group.seq, group))
        if entries or cursor.heap:
            heapq.heapify(cursor.heap)
            cursors[queue] = cursor
    project_heaps: dict[QueueState, list[tuple]] = defaultdict(list)
    for project, cursor in cursors.items():
        dept = project.parent
        assert dept is not None, f"project {project.name} has no department queue"
        heapq.heappush(project_heaps[dept], queue_entry(project, cursor))
    dept_heap = [queue_entry(dept, cursors[heap[0][-1]]) for dept, heap in project_heaps.items()]
    heapq.heapify(dept_heap)
    while dept_heap:
        dept = heapq.heappop(dept_heap)[-1]
        heap = project_heaps[dept]
        project = heapq.heappop(heap)[-1]
        cursor = cursors[project]
        group = cursor.pop() if cursor.usage is None else take(cursor)
        at = cursor.at
        job = group.jobs[at.get(group, 0)]
        skip = visit(job)
        at[group] = at.get(group, 0) + 1
        if skip is not None:
            cursor.skip = skip
        push_group(cursor, group)
        clean(cursor)
        if cursor.top() is not None:
            heapq.heappush(heap, queue_entry(project, cursor))
        if heap:
            heapq.heappush(dept_heap, queue_entry(dept, cursors[heap[0][-1]]))
