"""Answers kept while what they were worked out from stands still: the core's one memo mechanism.

An answer is stored with its *stamp*: the value of every counter it read
from, at the moment it was worked out. It is given back only while the
stamp is unchanged; the first change of one of those counters makes it
stale, and it is worked out again.

The invalidation rule: a counter counts one kind of change, it is bumped in
exactly one place (the method that makes that change), and an answer is
stamped with every counter whose change could alter it.

| counter                          | counts                                   | bumped in                      |
| -------------------------------- | ---------------------------------------- | ------------------------------ |
| ``ClusterState.changes``         | every bind and release in the cluster    | ``ClusterState._bind/_unbind`` |
|                                  | (room held for a reservation too)        | and ``hold/unhold``            |
| ``ClusterState.releases``        | releases only (free room grows)          | ``ClusterState._unbind``       |
|                                  |                                          | and ``unhold``                 |
| ``QueueState.changes``           | binds and releases of the queue's jobs   | ``QueueState.charge``          |
|                                  | and of its children's                    |                                |
| ``NodeState.version``            | binds and releases on the node           | ``NodeState.take/give_back``   |
| ``Backlog.shape_versions[queue]``| the queue's groups made or emptied       | ``Backlog``                    |
| ``FailedShapes.version``         | a failure to place remembered            | ``FailedShapes.add``           |
| ``VictimLists`` gains of a queue | its victims placed anew in one action    | ``VictimLists.gained``         |

So an answer about one queue's allocation (the order of its victims) is
stamped with that queue's ``changes``; one about where a request finds no
room, with ``releases`` (room only shrinks between releases); one about a
node's movable tasks, with the node's ``version``; one about what a
queue's victims hold by node, with the queue's gains (between two, what
they hold only shrinks). A new path that changes the state does it
through ``Statement`` (gpud.core.state), which goes through the methods
above: no counter is bumped by hand anywhere else.

Only answers that are not None are kept; a caller whose answer may be None
stores it wrapped (a tuple).

A stamp may also be the very object an answer was worked out from, where
that object is replaced, never changed, when what it says changes (a job's
request, its JobSpec): stamps compare by identity first, then by ==. An
answer whose caller can tell from the changes since its stamp whether it
still holds (where a request found no room: the nodes released since, from
``ClusterState.released_since``) reads that stamp back with ``stamp_of``.

| memo                          | keeps, by                                  | stamp                            |
| ----------------------------- | ------------------------------------------ | -------------------------------- |
| ``ClusterState._task_needs``  | what one task needs, by job                | the job's ``TaskRequest``        |
| ``Placer._no_room``           | that a shape found no room, by shape       | ``ClusterState.releases``        |
| ``Session.victim_orders``     | a queue's victims in victim order          | ``QueueState.changes``           |
| ``VictimLists._below``        | a queue's running victims below a priority | ``QueueState.changes``           |
| ``VictimLists._held``         | what a queue's victims hold, by node       | the queue's gains                |
| ``VictimLists._most``         | the most a queue's victims hold on a node  | the queue's gains                |
| ``Consolidate._movable``      | a node's movable tasks, by node            | ``NodeState.version``            |
| ``Reclaim._over``, ``_givers``| the queues over their levels, that give    | ``ClusterState.changes``         |
| ``Reclaim._unblocked``        | a queue with a group that could start      | ``FailedShapes.version`` and     |
|                               |                                            | ``QueueState.changes``           |
| ``_Claim._judged`` (reclaim)  | whether a queue's victims may go           | ``ClusterState.changes``         |
| ``Preempt.short``             | requests no node's victims could make room | the department's (or project's)  |
|                               | for, by queue                              | ``QueueState.changes``           |

Indexes brought up to date change by change are not memos: ``QueueCovers``
(gpud.core.cover) reads the groups made or emptied since it last looked
(``Backlog.reshaped``, counted by ``shape_versions``); ``ShapeIndex``, a
``FailedShapes`` and ``ClusterState._needs_by_request`` (what one task needs,
by the amounts asked and, for a memory slice, the pool) only grow, and
nothing they hold goes stale.
"""

from __future__ import annotations

from typing import Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Memo(Generic[K, V]):
    """Answers by key, each kept with the stamp it was worked out under."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[K, tuple[object, V]] = {}

    def get(self, key: K, stamp: object) -> V | None:
        """The answer for ``key`` if it was stored under ``stamp`` (the very object, or one ==), else None."""
        known = self._kept.get(key)
        if known is None or (known[0] is not stamp and known[0] != stamp):
            return None
        return known[1]

    def stamp_of(self, key: K) -> object:
        """The stamp the answer for ``key`` was stored under, None when none is kept: for an answer
        whose caller can tell from what changed since that stamp whether it still holds."""
        known = self._kept.get(key)
        return known[0] if known is not None else None

    def put(self, key: K, stamp: object, answer: V) -> V:
        """Keep ``answer`` for ``key`` under ``stamp`` (replacing any older one); returns it."""
        self._kept[key] = (stamp, answer)
        return answer

    def forget(self, key: K | None = None) -> None:
        """Drop the answer for ``key``, or every answer when no key is given."""
        if key is None:
            self._kept.clear()
        else:
            self._kept.pop(key, None)

    def __len__(self) -> int:
        return len(self._kept)
