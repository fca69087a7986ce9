"""One scheduling cycle's session: what the actions share while they run, made anew each cycle."""

from __future__ import annotations

from gpud.core.memo import Memo
from gpud.core.placement import Placer
from gpud.core.queues import QueueState
from gpud.core.state import ClusterState, EvictedBy, Statement


class Session:
    """The cycle's shared context, handed to each action in turn (gpud.core.cycle.ACTIONS).

    ``state`` is the cluster as the actions leave it so far: every change
    goes through a ``Statement`` on it. ``policies`` are the orders and
    placement strategies the plugins give (gpud.core.policy_set), read once
    with the state. ``placer`` finds room for tasks with the pools'
    placement strategies. What one action learns that a later one
    reads lives here, not in the state, and is dropped with the session.
    """

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.policies = state.policies
        self.placer = Placer(state)
        # Each queue's evictable jobs in victim order, shared by the cycle's actions (gpud.core.evict),
        # stamped with the queue's ``changes``.
        self.victim_orders: Memo[QueueState, list[tuple]] = Memo()
        # Each job the cycle evicted: the eviction rule, its reason, the job it made room for.
        self.evicted_by: EvictedBy = {}

    def statement(self) -> Statement:
        """A new statement on the state, recording its evictions in ``evicted_by``."""
        return Statement(self.state, self.evicted_by)
