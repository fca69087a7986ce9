"""The queue walk: pending jobs one at a time, always the next job of the most deprived queue.

Queues compare in two levels, departments first, then the projects inside
the department; each project's jobs come in job order (or, where the user
order is on and two users wait, each user's next job by the user's usage).
An action drives the walk: it takes jobs with ``for job in walk:`` and,
after a failure, tells the walk with ``pass_over`` which groups of that
job's queue to pass over whole from then on.
"""

from __future__ import annotations

import heapq
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
    """What an action hands the walk once a job failed: which groups of its queue to pass over whole.

    ``holds`` is asked with a group's next job, its queue and the group (or
    with a job alone, by the action itself); True passes the group over, and
    records why that job waits. A class rather than a function: the compiled
    core calls each action's ``holds`` directly, for every group passed over.
    """

    def holds(self, job: JobSpec, queue: QueueState, group: Group | None = None) -> bool:
        """True when the job cannot start now for the reason an earlier failure gave; its reason is recorded."""
        raise NotImplementedError


class _QueueCursor:
    """Where the walk stands in one queue: its groups by their next job, as (key, tiebreak, group).

    The groups come in a sorted run, read from ``next`` on, and a heap of
    the groups pushed since; the first of both is the first of the queue.
    ``at`` holds the index of a group's next job once it is past the first.
    In a queue the user order sorts, the run is one entry long: the next
    group of the user last taken, held ahead of the heap (``QueueWalk._lead``).
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
        # Then each user's groups in job order, and how many were taken out: the run and the heap hold
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


class QueueWalk:
    """Pending jobs of a backlog, most deprived queue first; iterate it to take them one by one.

    Queues compare by the queue-order plugin with their next job, first
    among departments, then among the department's projects; a queue's key
    is worked out again after each of its jobs. The walk starts from the
    state as it is when made. ``admit``, given a queue and its groups as
    sorted (key, tiebreak, group) entries, returns those to walk: the others
    are not taken at all, nor are queues left out of ``queues`` when given.
    Jobs that stopped waiting earlier in the cycle are passed over.

    After a job is taken, ``pass_over(skip)`` says that from then on a group
    of its queue whose next job ``skip`` holds for is passed over whole (the
    Skip records why that job waits, or why all the group's jobs do). Once a
    queue has a Skip, ``drop`` may say that it holds for every group the
    queue has left: they are all passed over at once, and no reason is
    recorded for them here (``drop`` records them its own way).
    """

    def __init__(self, state: ClusterState, backlog: Backlog, queues: Iterable[QueueState] | None = None,
                 admit: Admit | None = None, drop: Callable[[QueueState], bool] | None = None) -> None:
        self._state = state
        self._drop = drop
        self._queue_order = state.policies.queue_order
        self._tiebreak = backlog.groups_made
        self._placements = state.placements
        # Every job of a backlog waits for some task when the cycle begins: only one placed or evicted
        # since (touched) may have stopped waiting. The small set is asked first, not every job's placements.
        self._touched = state.touched
        self._users = backlog.users if state.user_order and backlog.by_user else None
        self._usage, self._held = state.usage, state.user_gpus
        self._window = state.policy.fair_share.entry_penalty_s
        self._cursors: dict[QueueState, _QueueCursor] = {}
        self._project_heaps: dict[QueueState, list[tuple]] = defaultdict(list)
        self._dept_heap: list[tuple] = []
        # The job last taken: its queue's cursor, its group and its department, until the walk moves on.
        self._cursor: _QueueCursor | None = None
        self._group: Group | None = None
        self._dept: QueueState | None = None
        self._open(backlog, queues, admit)

    # --- what an action calls ---------------------------------------------------------------------

    def __iter__(self) -> QueueWalk:
        """The walk itself: it is its own iterator, taken once."""
        return self

    def __next__(self) -> JobSpec:
        """The next job of the most deprived queue; StopIteration when no queue has one left."""
        self._state.turns.step()
        if self._cursor is not None:
            self._move_on()
        if not self._dept_heap:
            self._cursor = None
            raise StopIteration
        dept = heapq.heappop(self._dept_heap)[-1]
        project = heapq.heappop(self._project_heaps[dept])[-1]
        cursor = self._cursors[project]
        group = cursor.pop() if cursor.usage is None else self._take(cursor)
        self._cursor, self._group, self._dept = cursor, group, dept
        return group.jobs[cursor.at.get(group, 0)]

    def pass_over(self, skip: Skip) -> None:
        """From now on, pass over the groups of the last job's queue whose next job ``skip`` holds for."""
        assert self._cursor is not None, "no job taken yet"
        self._cursor.skip = skip

    # --- setting out ------------------------------------------------------------------------------

    def _open(self, backlog: Backlog, queues: Iterable[QueueState] | None, admit: Admit | None) -> None:
        """A cursor for each queue with a group to walk, then each queue's entry in the two heaps."""
        state, cursors = self._state, self._cursors
        chosen = backlog.by_queue if queues is None else {q: backlog.by_queue[q] for q in queues
                                                             if q in backlog.by_queue}
        # Before anything changed in the cycle, every group's first job waits: the sorted heads serve as they are.
        untouched = admit is None and state.changes == state.changes_at_begin
        for queue in chosen:
            state.turns.step()
            cursor = _QueueCursor(queue)
            cursor.usage = self._user_usage(queue)
            if cursor.usage is not None:
                self._merge_users(cursor, backlog, admit)
            elif untouched:
                cursor.run = backlog.heads.get(queue, [])  # only read: the backlog changes between cycles
            else:
                self._start_after_changes(cursor, backlog.heads.get(queue, []) if admit is None
                                          else admit(queue, backlog.heads.get(queue, [])))
            if cursor.run or cursor.heap:
                cursors[queue] = cursor
        project_heaps = self._project_heaps
        for project, cursor in cursors.items():
            dept = project.parent
            assert dept is not None, f"project {project.name} has no department queue"
            heapq.heappush(project_heaps[dept], self._queue_entry(project, cursor))
        self._dept_heap = [self._queue_entry(dept, cursors[heap[0][-1]]) for dept, heap in project_heaps.items()]
        heapq.heapify(self._dept_heap)

    def _start_after_changes(self, cursor: _QueueCursor, heads: list[Entry]) -> None:
        """Set a queue's cursor from its groups sorted by first job (``Backlog.heads``) once the cycle
        placed some jobs: only groups whose first job started are placed again, by their next job.
        Ties keep the order the groups were made in, and every entry pushed later comes after them."""
        touched, placements = self._touched, self._placements
        at, entries = cursor.at, cursor.run
        turns = self._state.turns
        for entry in heads:
            turns.step()
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
        heapq.heapify(cursor.heap)

    def _merge_users(self, cursor: _QueueCursor, backlog: Backlog, admit: Admit | None) -> None:
        """Set a user-ordered queue's cursor: a merge of the users' runs, each by its next group, in one heap."""
        queue = cursor.queue
        assert cursor.usage is not None
        cursor.run = []
        for user in cursor.usage:
            user_run = backlog.user_heads.get((queue, user), [])
            cursor.runs[user] = [user_run if admit is None else admit(queue, user_run), 0]
            entry = self._next_of(cursor, user)
            if entry is not None:
                self._lead(cursor, entry)

    def _user_usage(self, queue: QueueState) -> dict[str, float] | None:
        """Each waiting user's decayed usage in the queue, None when fewer than two users wait there."""
        if self._users is None:
            return None
        waiting = self._users.get(queue)
        if waiting is None or len(waiting) < 2:
            return None
        prefix = queue.name + "/"
        usage = self._usage
        return {user: usage.get(("user", queue.pool, prefix + user), 0.0) for user in waiting}

    # --- moving on after a job ---------------------------------------------------------------------

    def _move_on(self) -> None:
        """Past the job last taken: its group's next job, its queue's groups cleaned, both heaps again."""
        cursor, group, dept = self._cursor, self._group, self._dept
        assert cursor is not None and group is not None and dept is not None
        at = cursor.at
        at[group] = at.get(group, 0) + 1
        self._push_group(cursor, group)
        self._clean(cursor)
        heap = self._project_heaps[dept]
        if cursor.top() is not None:
            heapq.heappush(heap, self._queue_entry(cursor.queue, cursor))
        if heap:
            heapq.heappush(self._dept_heap, self._queue_entry(dept, self._cursors[heap[0][-1]]))

    def _head(self, cursor: _QueueCursor, group: Group) -> JobSpec | None:
        """The group's next job still waiting (its index kept in ``cursor.at``), None when none is."""
        i = cursor.at.get(group, 0)
        jobs, touched, placements = group.jobs, self._touched, self._placements
        while i < len(jobs) and jobs[i].id in touched and None not in placements[jobs[i].id]:
            i += 1
        cursor.at[group] = i
        return jobs[i] if i < len(jobs) else None

    def _push_group(self, cursor: _QueueCursor, group: Group) -> None:
        """Put the group back into its queue's heap by its next waiting job, if it has one."""
        if self._head(cursor, group) is not None:
            self._tiebreak += 1
            heapq.heappush(cursor.heap, (self._key_at(cursor, group, cursor.at[group]), self._tiebreak - 1, group))

    def _clean(self, cursor: _QueueCursor) -> None:
        """Bring the queue's first group to the top: groups with no job left waiting, or whose next job
        the queue's Skip holds for, are taken out; one whose next job's key went stale is put back by
        the current key. Or the whole queue is dropped, when ``drop`` says its Skip holds for every group."""
        skip, at, queue = cursor.skip, cursor.at, cursor.queue
        if skip is not None and self._drop is not None and cursor.top() is not None and self._drop(queue):
            cursor.run, cursor.next, cursor.heap, cursor.runs = [], 0, [], {}
            return
        touched, placements = self._touched, self._placements
        # cursor.top() and cursor.pop(), inline: every group a Skip passes over comes through here.
        run, heap = cursor.run, cursor.heap
        while True:
            self._state.turns.step()
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
                current = group.keys[i] if cursor.usage is None else self._key_at(cursor, group, i)
                if current is not top[0] and current != top[0]:  # the very key as a rule: no fields compared
                    self._pop_top(cursor, at_run)  # its key went stale: pushed again with the current one
                    self._tiebreak += 1
                    heapq.heappush(heap, (current, self._tiebreak - 1, group))
                    continue
                return
            self._pop_top(cursor, at_run)

    def _pop_top(self, cursor: _QueueCursor, at_run: int) -> None:
        """Take the queue's first entry out: the run's at index ``at_run``, or the heap's when it is -1."""
        if cursor.usage is not None:
            self._take(cursor)
        elif at_run >= 0:
            cursor.next = at_run + 1
        else:
            heapq.heappop(cursor.heap)

    def _queue_entry(self, queue: QueueState, cursor: _QueueCursor) -> tuple:
        """The queue's entry in its heap: its key with its next job, a tiebreak, then the queue itself."""
        group = cursor.top()
        assert group is not None, "a queue without pending groups has no key"
        job = group.jobs[cursor.at.get(group, 0)]
        state = self._state
        if job.id in self._touched or job.placements:
            need = state.need(job, state.pending_count(job.id))
        else:  # every task waits, as when the cycle began; the group keeps what one task needs
            need = state.group_need(group) if job.tasks == 1 else state.need(job, job.tasks)
        self._tiebreak += 1
        return self._queue_order.entry(queue, job, need, self._tiebreak - 1)

    # --- the user order ----------------------------------------------------------------------------

    def _key_at(self, cursor: _QueueCursor, group: Group, i: int) -> Any:
        """The key of the group's job ``i`` in its queue's order: the job order's, or the user order's."""
        known = cursor.usage
        if known is None:
            return group.keys[i]
        key = group.keys[i]
        gpus = self._held.get((cursor.queue, group.user), 0.0)
        return (key[0], known.get(group.user, 0.0) + self._window * gpus, gpus, key)

    def _next_of(self, cursor: _QueueCursor, user: str) -> Entry | None:
        """The entry of the next group of the user's run with a job still waiting, keyed in the user order,
        taken out of the run; None when the run has none left."""
        touched, placements = self._touched, self._placements
        user_run = cursor.runs[user]
        entries, i = user_run[0], user_run[1]
        found: Entry | None = None
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
                found = (self._key_at(cursor, group, j), group.seq, group, user)
                break
        user_run[1] = i
        return found

    def _lead(self, cursor: _QueueCursor, entry: Entry) -> None:
        """Put a user's next entry into a user-ordered queue: ahead of the heap when the run's place is
        free or it comes before the entry held there (which then goes into the heap), else into the heap.

        Between two starts every user keeps its place in the user order, so
        the user just taken is the likeliest to come first again: its groups
        are then taken one after the other at one comparison each, where a
        heap alone would take each group out and put the next one in.
        """
        run = cursor.run
        if cursor.next >= len(run):
            if run:
                run[0] = entry
            else:
                run.append(entry)
            cursor.next = 0
        elif entry < run[cursor.next]:
            heapq.heappush(cursor.heap, run[cursor.next])
            run[cursor.next] = entry
        else:
            heapq.heappush(cursor.heap, entry)

    def _take(self, cursor: _QueueCursor) -> Group:
        """Take the first entry out of a user-ordered queue, the run's or the heap's; when it came from a
        user's run, the user's next group takes its place (``_lead``). Its group."""
        run, heap = cursor.run, cursor.heap
        entry: Entry
        if cursor.next < len(run) and not (heap and heap[0] < run[cursor.next]):
            entry = run[cursor.next]
            cursor.next += 1
        else:
            entry = heapq.heappop(heap)
        if len(entry) == 4:
            following = self._next_of(cursor, entry[3])
            if following is not None:
                self._lead(cursor, following)
        group: Group = entry[2]
        return group
