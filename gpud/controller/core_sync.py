"""Keeping the warm scheduling core in step with the controller's jobs and nodes.

Handlers never touch the core while a cycle may be running in its thread:
they queue operations, applied just before the next cycle. A change the
core cannot take incrementally (nodes, policy) rebuilds it from scratch.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

import pluggy

from gpud.core import Scheduler
from gpud.core.turns import EVERY
from gpud.model import JobSpec, NodeSpec, Plan, Snapshot
from gpud.policy import Policy


class CoreSync:
    """The scheduler, which jobs it holds, and the operations waiting for the next cycle."""

    def __init__(self, policy: Policy, pm: pluggy.PluginManager) -> None:
        self.policy = policy
        self.pm = pm
        self.scheduler: Scheduler | None = None
        self.in_core: set[str] = set()
        self.ops: list[tuple[str, str, JobSpec | None]] = []
        self.touched: set[str] = set()
        self.rebuild_needed = True
        self.running = False

    def add(self, spec: JobSpec) -> None:
        """The core is to know this job (pending, or running where its placements say)."""
        self.ops.append(("submit", spec.id, spec))
        self.in_core.add(spec.id)
        self.touched.add(spec.id)

    def remove(self, job_id: str) -> None:
        """The core is to forget this job (finished, cancelled, held, or about to be re-added)."""
        if job_id in self.in_core:
            self.ops.append(("finish", job_id, None))
            self.in_core.discard(job_id)
        self.touched.add(job_id)

    def reset(self, spec: JobSpec) -> None:
        """The core's view of a job it holds is wrong (a node lost it): forget and re-add it."""
        self.remove(spec.id)
        self.add(spec)

    def rebuild(self, policy: Policy | None = None, pm: pluggy.PluginManager | None = None) -> None:
        """Start over at the next cycle (nodes or policy changed); the running cycle's plan is void."""
        if policy is not None:
            assert pm is not None, "a new policy comes with its plugins"
            self.policy, self.pm = policy, pm
        self.rebuild_needed = True

    def prepare(self, nodes: Iterable[NodeSpec], specs: Callable[[], Iterable[JobSpec]],
                now: float, usage: Mapping[tuple[str, str, str], float] | None = None) -> Scheduler:
        """The scheduler ready for a cycle: rebuilt, or with the queued operations applied.

        ``usage``: the decayed usage charged so far (``Snapshot.usage``); none given means none.
        """
        return self.prepare_later(nodes, specs, now, usage)()

    def prepare_later(self, nodes: Iterable[NodeSpec], specs: Callable[[], Iterable[JobSpec]],
                      now: float, usage: Mapping[tuple[str, str, str], float] | None = None
                      ) -> Callable[[], Scheduler]:
        """As :meth:`prepare`, but what costs (building the scheduler anew, applying the queued operations) is
        left to the call returned, which may run in the cycle's thread: what it needs is read here."""
        ops, anew = self.begin()
        if anew:
            return self.build_later(tuple(nodes), tuple(specs()), now, usage)
        return self.apply_later(ops, usage)

    def begin(self) -> tuple[list[tuple[str, str, JobSpec | None]], bool]:
        """Begin preparing a cycle: the operations queued for it, and whether the scheduler is to be built anew.

        From here on, what changes is queued for the next cycle, and the jobs
        it touches are left out of this cycle's plan (:meth:`finished`); a
        change of the nodes voids the plan. So the caller may read the
        snapshot to build anew a piece at a time, letting others change the
        cluster meanwhile, and pass it to :meth:`build_later`.
        """
        ops, self.ops = self.ops, []
        self.touched = set()
        self.running = True
        anew = self.rebuild_needed or self.scheduler is None
        if anew:
            self.rebuild_needed = False
            self.scheduler = None
        return ops, anew

    def build_later(self, nodes: tuple[NodeSpec, ...], specs: tuple[JobSpec, ...], now: float,
                    usage: Mapping[tuple[str, str, str], float] | None = None,
                    turn: Callable[[], None] | None = None, every: int = EVERY) -> Callable[[], Scheduler]:
        """The call that builds the scheduler anew from these nodes and jobs (after :meth:`begin` said to);
        ``turn``, every ``every`` steps of the build's long loops, for a build run in the cycle's thread."""
        snapshot = Snapshot(nodes, specs, now, {} if usage is None else usage)
        policy, pm = self.policy, self.pm

        def build() -> Scheduler:
            self.scheduler = Scheduler(snapshot, policy, pm, turn, every)
            return self.scheduler
        return build

    def apply_later(self, ops: list[tuple[str, str, JobSpec | None]],
                    usage: Mapping[tuple[str, str, str], float] | None = None) -> Callable[[], Scheduler]:
        """The call that applies the operations :meth:`begin` gave to the warm scheduler."""
        scheduler = self.scheduler
        assert scheduler is not None, "a warm scheduler takes the operations; begin said to build anew"
        usage = {} if usage is None else usage

        def apply() -> Scheduler:
            scheduler.set_usage(usage)
            for op, job_id, spec in ops:
                scheduler.finish(job_id)
                if op != "finish":
                    assert spec is not None  # an "add" carries its spec
                    scheduler.submit(spec)
            return scheduler
        return apply

    def builds_anew(self) -> bool:
        """Whether the next cycle builds the scheduler anew."""
        return self.rebuild_needed or self.scheduler is None

    def heavy(self, ops: int) -> bool:
        """Whether the next cycle has much to take in: a scheduler to build anew, or more than ``ops`` operations."""
        return self.builds_anew() or len(self.ops) > ops

    def finished(self, plan: Plan) -> tuple[Plan | None, set[str]]:
        """After a cycle: the plan to carry out (None when void) and the jobs whose actions to skip."""
        self.running = False
        if self.rebuild_needed:
            self.scheduler = None
            return None, set()
        return plan, self.touched
