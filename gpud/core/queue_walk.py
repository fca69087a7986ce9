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
from typing import Callable, Iterable

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


class _UserRun:
    """One user's groups in a queue the user order sorts: a sorted run of (key, tiebreak, group) entries in
    job order, read from ``next`` on, and a heap of the groups pushed back since, as in a plain queue.

    ``usage`` is the user's decayed usage in the queue; ``gpus`` the GPUs it
    held there and ``standing`` its usage plus the window times those GPUs,
    when the walk last compared the users (``QueueWalk._choose``).
    """

    __slots__ = ("entries", "next", "heap", "user", "usage", "gpus", "standing")

    def __init__(self, user: str, entries: list[Entry], usage: float) -> None:
        self.entries = entries
        self.next = 0
        self.heap: list[Entry] = []
        self.user = user
        self.usage = usage
        self.gpus = 0.0
        self.standing = usage

    def top(self) -> Entry | None:
        """The first entry of the run and the heap, or None when both are spent."""
        entries, heap, i = self.entries, self.heap, self.next
        if i < len(entries) and not (heap and heap[0] < entries[i]):
            entry: Entry = entries[i]
            return entry
        if heap:
            first: Entry = heap[0]
            return first
        return None

    def pop(self) -> None:
        """Take the first entry out."""
        entries, heap, i = self.entries, self.heap, self.next
        if i < len(entries) and not (heap and heap[0] < entries[i]):
            self.next = i + 1
        else:
            heapq.heappop(heap)


class _QueueCursor:
    """Where the walk stands in one queue: its groups by their next job, as (key, tiebreak, group).

    The groups come in a sorted run, read from ``next`` on, and a heap of
    the groups pushed since; the first of both is the first of the queue.
    ``at`` holds the index of a group's next job once it is past the first;
    a group put back into the heap when the walk began (its first job had
    started) is in ``moved``, and its entry in the run is passed over.
    In a queue the user order sorts, each user's groups are a run and a heap
    of their own (``users``): the first group is that of the user leading
    (``lead``), the others wait in a heap by their next group (``others``),
    as compared when the queue last had a bind or a release (``stamp``;
    ``QueueWalk._lead``). ``settled`` says the lead was found since the
    queue last had an entry taken or pushed: it leads until one is.
    """

    __slots__ = ("queue", "run", "next", "heap", "at", "moved", "skip", "usage", "runs", "users", "lead", "others",
                 "stamp", "settled", "held")

    def __init__(self, queue: QueueState) -> None:
        self.queue = queue
        self.run: list[Entry] = []
        self.next = 0
        self.heap: list[Entry] = []
        self.at: dict[Group, int] = {}
        self.moved: set[Group] = set()  # groups put back by their next job: their entries in the run are passed over
        self.skip: Skip | None = None
        # Each waiting user's decayed usage in the queue, when the user order sorts it; else None.
        self.usage: dict[str, float] | None = None
        # Then each user's groups, by user and in a list of those with a group left.
        self.runs: dict[str, _UserRun] = {}
        self.users: list[_UserRun] = []
        self.lead: _UserRun | None = None
        self.others: list[tuple] = []  # the other users with a group left, by their entries in the user order
        self.stamp = -1  # the queue's binds and releases (QueueState.changes) when the users were compared
        self.settled = False
        self.held: dict[str, float] = {}  # the GPUs each user holds in the queue (ClusterState.users_gpus)

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
    sorted (key, tiebreak, group) entries, returns those to walk, judging
    each entry on its own (it may be given any sorted part of them): the others
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
        self._usage = state.usage
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
        group = cursor.pop() if cursor.usage is None else self._take_lead(cursor)
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
        # Before anything changed in the cycle, every group's first job waits: the sorted heads serve as they
        # are. After, the groups whose first job started are put back by their next job (``_restart``).
        changed = state.changes != state.changes_at_begin
        made: dict[QueueState, _QueueCursor] = {}
        plain: dict[QueueState, _QueueCursor] = {}
        for queue in chosen:
            state.turns.step()
            cursor = made[queue] = _QueueCursor(queue)
            cursor.usage = self._user_usage(queue)
            if cursor.usage is not None:
                self._merge_users(cursor, backlog, admit)
                continue
            heads = backlog.heads.get(queue, [])  # only read: the backlog changes between cycles
            cursor.run = heads if admit is None else admit(queue, heads)
            plain[queue] = cursor
        if changed:
            self._restart(plain, backlog, admit)
        for queue, cursor in made.items():
            if changed and cursor.usage is None:
                self._clean(cursor)  # a group put back may have left its entry in the heads at the top
            if self._top(cursor) is not None:
                cursors[queue] = cursor
        project_heaps = self._project_heaps
        for project, cursor in cursors.items():
            dept = project.parent
            assert dept is not None, f"project {project.name} has no department queue"
            heapq.heappush(project_heaps[dept], self._queue_entry(project, cursor))
        self._dept_heap = [self._queue_entry(dept, cursors[heap[0][-1]]) for dept, heap in project_heaps.items()]
        heapq.heapify(self._dept_heap)

    def _restart(self, plain: dict[QueueState, _QueueCursor], backlog: Backlog, admit: Admit | None) -> None:
        """Once the cycle placed jobs, put each group whose first job started back into its queue's cursor by
        its next job (if it has one waiting); its entry in the sorted heads is passed over (``moved``). Only
        the jobs touched since the cycle began are looked at, not every group. Ties keep the order the groups
        were made in, and every entry pushed later comes after them."""
        touched, placements, group_of, turns = self._touched, self._placements, backlog.group_of, self._state.turns
        started: dict[QueueState, list[Entry]] = defaultdict(list)
        for job_id in touched:
            turns.step()
            group = group_of.get(job_id)
            if (group is None or group.jobs[0].id != job_id or group.queue not in plain
                    or None in placements[job_id]):
                continue
            started[group.queue].append((group.keys[0], group.seq, group))
        for queue, entries in started.items():
            cursor = plain[queue]
            for _, seq, group in (entries if admit is None else admit(queue, sorted(entries))):
                jobs = group.jobs
                i, n = 1, len(jobs)
                while i < n and jobs[i].id in touched and None not in placements[jobs[i].id]:
                    i += 1
                cursor.at[group] = i
                cursor.moved.add(group)
                if i < n:
                    cursor.heap.append((group.keys[i], seq, group))
            heapq.heapify(cursor.heap)

    def _merge_users(self, cursor: _QueueCursor, backlog: Backlog, admit: Admit | None) -> None:
        """Set a user-ordered queue's cursor: each user's groups a run of their own."""
        queue = cursor.queue
        assert cursor.usage is not None
        cursor.held = self._state.users_gpus(queue)
        for user, usage in cursor.usage.items():
            entries = backlog.user_heads.get((queue, user), [])
            cursor.runs[user] = _UserRun(user, entries if admit is None else admit(queue, entries), usage)
        cursor.users = list(cursor.runs.values())

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
        if self._top(cursor) is not None:
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
        """Put the group back into its queue's heap (its user's, in the user order) by its next waiting job,
        if it has one."""
        if self._head(cursor, group) is not None:
            self._tiebreak += 1
            heap = cursor.heap if cursor.usage is None else cursor.runs[group.user].heap
            heapq.heappush(heap, (group.keys[cursor.at[group]], self._tiebreak - 1, group))
            cursor.settled = False

    def _clean(self, cursor: _QueueCursor) -> None:
        """Bring the queue's first group to the top: groups with no job left waiting, or whose next job
        the queue's Skip holds for, are taken out; one whose next job's key went stale is put back by
        the current key. Or the whole queue is dropped, when ``drop`` says its Skip holds for every group."""
        skip, at, queue = cursor.skip, cursor.at, cursor.queue
        if skip is not None and self._drop is not None and self._top(cursor) is not None and self._drop(queue):
            cursor.run, cursor.next, cursor.heap = [], 0, []
            cursor.runs, cursor.users, cursor.lead, cursor.others = {}, [], None, []
            return
        if cursor.usage is not None:
            self._clean_users(cursor)
            return
        touched, placements = self._touched, self._placements
        # cursor.top() and cursor.pop(), inline: every group a Skip passes over comes through here.
        run, heap, moved = cursor.run, cursor.heap, cursor.moved
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
            if at_run >= 0 and moved and group in moved:  # put back by its next job when the walk began
                cursor.next = at_run + 1
                continue
            i, jobs = at.get(group, 0), group.jobs
            n = len(jobs)
            while i < n and jobs[i].id in touched and None not in placements[jobs[i].id]:
                i += 1
            first = jobs[i] if i < n else None
            if first is not None and (skip is None or not skip.holds(first, queue, group)):
                if i:
                    at[group] = i
                current = group.keys[i]
                if current is not top[0] and current != top[0]:  # the very key as a rule: no fields compared
                    self._pop_top(cursor, at_run)  # its key went stale: pushed again with the current one
                    self._tiebreak += 1
                    heapq.heappush(heap, (current, self._tiebreak - 1, group))
                    continue
                return
            self._pop_top(cursor, at_run)

    def _pop_top(self, cursor: _QueueCursor, at_run: int) -> None:
        """Take the queue's first entry out: the run's at index ``at_run``, or the heap's when it is -1."""
        if at_run >= 0:
            cursor.next = at_run + 1
        else:
            heapq.heappop(cursor.heap)

    def _top(self, cursor: _QueueCursor) -> Group | None:
        """The queue's first group, or None when no group is left."""
        if cursor.usage is None:
            return cursor.top()
        lead = self._lead(cursor)
        if lead is None:
            return None
        entry = lead.top()
        assert entry is not None  # _lead found it
        group: Group = entry[2]
        return group

    def _queue_entry(self, queue: QueueState, cursor: _QueueCursor) -> tuple:
        """The queue's entry in its heap: its key with its next job, a tiebreak, then the queue itself."""
        group = self._top(cursor)
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

    def _clean_users(self, cursor: _QueueCursor) -> None:
        """``_clean`` in a queue the user order sorts: the groups the Skip holds for, first user first."""
        skip, at, queue = cursor.skip, cursor.at, cursor.queue
        while True:
            self._state.turns.step()
            lead = self._lead(cursor)
            if lead is None:
                return
            entry = lead.top()
            assert entry is not None  # _lead found it, its next job still waiting
            group: Group = entry[2]
            if skip is None or not skip.holds(group.jobs[at.get(group, 0)], queue, group):
                return
            lead.pop()
            cursor.settled = False

    def _take_lead(self, cursor: _QueueCursor) -> Group:
        """Take the first group out of a queue the user order sorts; that group."""
        lead = self._lead(cursor)
        assert lead is not None, "a queue without pending groups has no first group"
        entry = lead.top()
        assert entry is not None  # _lead found it
        lead.pop()
        cursor.settled = False
        group: Group = entry[2]
        return group

    def _lead(self, cursor: _QueueCursor) -> _UserRun | None:
        """The user whose next group comes first in the user order now, its first entry ready (``_ready``);
        None when no user has a group left.

        Between two binds or releases in the queue every user keeps its
        standing, and every user but the one taken from keeps its next group:
        the others wait in a heap by their next group's key (``others``), and
        the user found first stays first, at one comparison a group, while its
        next group comes before the first of theirs. Then it goes into the heap
        by its next group, and the first of the heap leads. Until an entry of
        the queue is taken or pushed, the lead found stands (``settled``).
        After a bind or a release in the queue, the users whose GPUs changed
        take their new standing (``_restand``) before the lead is compared.
        """
        lead = cursor.lead
        if lead is None:
            return self._choose(cursor)
        if cursor.stamp != cursor.queue.changes:
            self._restand(cursor, lead)
        if cursor.settled:
            return lead
        entry = self._ready(cursor, lead)
        others = cursor.others
        if entry is not None and (not others or _before(lead, entry, others[0])):
            cursor.settled = True
            return lead
        if entry is None:
            cursor.lead = heapq.heappop(others)[-1] if others else None
        else:  # behind the first of the others: the two change places in one pass of the heap
            cursor.lead = heapq.heapreplace(others, _user_entry(lead, entry))[-1]
        cursor.settled = cursor.lead is not None
        return cursor.lead

    def _restand(self, cursor: _QueueCursor, lead: _UserRun) -> None:
        """After binds or releases in the queue, each user whose GPUs there changed takes its new standing:
        the leading user's, and those of the others in their heap. Every user keeps its next group: only the
        leading user's groups are taken from, and a release stops a running job, not a waiting one."""
        held, window, others = cursor.held, self._window, cursor.others
        restood = False
        for i, entry in enumerate(others):
            run: _UserRun = entry[-1]
            gpus = held.get(run.user, 0.0)
            if gpus != run.gpus:
                run.gpus, run.standing = gpus, run.usage + window * gpus
                others[i] = _user_entry(run, entry[3:5])  # its next group's key and tiebreak, as an Entry's
                restood = True
        if restood:
            heapq.heapify(others)
        gpus = held.get(lead.user, 0.0)
        lead.gpus, lead.standing = gpus, lead.usage + window * gpus
        cursor.stamp, cursor.settled = cursor.queue.changes, False

    def _choose(self, cursor: _QueueCursor) -> _UserRun | None:
        """Compare every user's next group in the user order (priority, the user's standing now, the GPUs it
        holds, then the job order): the first user leads, the others wait in a heap by that key."""
        held, window = cursor.held, self._window
        others: list[tuple] = []
        left: list[_UserRun] = []
        for run in cursor.users:
            entry = self._ready(cursor, run)
            if entry is None:  # spent for good: only the user taken from has groups pushed back
                continue
            left.append(run)
            gpus = held.get(run.user, 0.0)
            run.gpus, run.standing = gpus, run.usage + window * gpus
            others.append(_user_entry(run, entry))
        heapq.heapify(others)
        cursor.users, cursor.others, cursor.stamp = left, others, cursor.queue.changes
        cursor.lead = heapq.heappop(others)[-1] if others else None
        cursor.settled = cursor.lead is not None
        return cursor.lead

    def _ready(self, cursor: _QueueCursor, run: _UserRun) -> Entry | None:
        """The user's first entry whose group has a job still waiting, keyed by that job: groups with none
        left are taken out, one whose next job changed is pushed back by its key. None when none is left."""
        touched, placements, at = self._touched, self._placements, cursor.at
        while True:
            entry = run.top()
            if entry is None:
                return None
            group: Group = entry[2]
            i, jobs = at.get(group, 0), group.jobs
            n = len(jobs)
            while i < n and jobs[i].id in touched and None not in placements[jobs[i].id]:
                i += 1
            if i == n:
                run.pop()
                continue
            if i:
                at[group] = i
            current = group.keys[i]
            if current is not entry[0] and current != entry[0]:
                run.pop()
                self._tiebreak += 1
                heapq.heappush(run.heap, (current, self._tiebreak - 1, group))
                continue
            return entry


def _user_entry(run: _UserRun, entry: Entry) -> tuple:
    """The user's entry in the heap of users, by its first entry and the user's standing as last compared:
    the group's priority, the user's standing, the GPUs it holds, the group's key in the job order, the
    entry's tiebreak, then the run. One flat tuple, as ``FairQueueOrder.entry``: the heap compares the
    fields one by one, never a key within a key twice."""
    return (entry[0][0], run.standing, run.gpus, entry[0], entry[1], run)


def _before(run: _UserRun, entry: Entry, other: tuple) -> bool:
    """True when the run's entry comes before ``other``, another user's entry in the heap of users, the
    run's user standing as last compared: the fields compared one by one, no key made."""
    key = entry[0]
    if key[0] != other[0]:
        return bool(key[0] < other[0])
    if run.standing != other[1]:
        return run.standing < other[1]
    if run.gpus != other[2]:
        return run.gpus < other[2]
    return bool((key, entry[1]) < (other[3], other[4]))
