"""One scheduling cycle's session: what the actions share while they run, made anew each cycle."""

from __future__ import annotations

from gpud.core.memo import Memo
from gpud.core.placement import Placer
from gpud.core.queues import QueueState
from gpud.core.recorder import ReasonRecorder
from gpud.core.reservations import Planner
from gpud.core.state import ClusterState, Statement
from gpud.model import Reservation


class Session:
    """The cycle's shared context, handed to each action in turn (gpud.core.cycle.ACTIONS).

    ``state`` is the cluster as the actions leave it so far: every change
    goes through a ``Statement`` on it. ``policies`` are the orders and
    placement strategies the plugins give (gpud.core.policy_set), read once
    with the state. ``placer`` finds room for tasks with the pools'
    placement strategies. What one action learns that a later one
    reads lives here, not in the state, and is dropped with the session: the
    cycle's outputs below; ``reasons`` is read by the plan's pending reasons.
    """

    def __init__(self, state: ClusterState) -> None:
        self.state: ClusterState = state
        self.policies = state.policies
        self.placer: Placer = Placer(state)
        # Why each job waits and why each was evicted, recorded by every action (gpud.core.recorder).
        self.reasons: ReasonRecorder = ReasonRecorder(state)
        # Each queue's evictable jobs in victim order, shared by the cycle's actions (gpud.core.evict),
        # stamped with the queue's ``changes``.
        self.victim_orders: Memo[QueueState, list[tuple]] = Memo()
        # The planned start of jobs allocation found no room for (gpud.core.reservations), by job id;
        # the room the first of them need is held from the actions until ``release_held``.
        self.reservations: dict[str, Reservation] = {}
        self.planner: Planner = Planner(state, self.reservations)

    def release_held(self) -> None:
        """Give back the room reservations held through the cycle's actions (before the plan is made)."""
        self.planner.release_all()

    def statement(self) -> Statement:
        """A new statement on the state, recording its evictions in the session's reasons."""
        return Statement(self.state, self.reasons.evicted)
