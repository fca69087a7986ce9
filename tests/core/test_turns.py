"""The daemon's turns (gpud.core.turns): a cycle calls the turn it was given every so many steps of its long
loops, over random clusters of every job shape, and the turn changes no plan.

The work between two turns is counted, not timed: the lines of the (Python) core run between two calls,
as a tracer sees them. A loop over the cluster's jobs, nodes, groups or victims with no step in it runs
longer than any stretch allowed here once the cluster is large enough, as the generated ones are.
"""

from __future__ import annotations

import dataclasses
import sys
from types import FrameType
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gpud.core import COMPILED, Scheduler, schedule
from gpud.core.turns import Turns
from gpud.model import JobSpec, NodeSpec, Snapshot, TaskPlacement
from gpud.reasons import pending_texts
from gpud.simulate import apply_plan
from test_properties import NOW, PM, POOL, Case, Room, policies, requests

# The most lines of the core run between two turns, turns given at every step. The longest stretches
# that do not grow with the cluster (a queue's fair share, a placement, one victim tried) stay well under
# it; a loop over a large cluster's jobs, groups or victims without a step runs past it.
MOST_LINES = 3000

# The explain phase traces lines itself: the counting tracer would be replaced.
TRACED = settings(max_examples=examples(40), deadline=None, phases=[p for p in Phase if p is not Phase.explain],
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def big_cases(draw) -> Case:
    """Clusters large enough that a loop over their jobs or nodes is longer than MOST_LINES: up to 40 nodes
    and 160 jobs of every shape (single tasks, gangs, elastic gangs, fractions, memory slices, CPU-only),
    some running, in projects that may sit in departments."""
    policy = draw(policies())
    count = draw(st.integers(1, 60))
    specs = [NodeSpec(name=f"n{i}", gpus=draw(st.integers(1, 8)), gpu_memory_gib=draw(st.sampled_from([40.0, 80.0])),
                      cpus=float(draw(st.integers(2, 32))), memory_gib=float(draw(st.integers(8, 128))), pool=POOL)
             for i in range(count)]
    room = Room(specs)
    names = sorted(room.specs)
    jobs = []
    # Few distinct requests, many jobs of each: a long backlog in few groups, as a real queue is.
    kinds = draw(st.lists(requests(), min_size=1, max_size=6))
    for seq in range(draw(st.integers(0, 300))):
        request = draw(st.sampled_from(kinds))
        tasks = draw(st.sampled_from([1, 1, 1, 2, 3]))
        min_tasks = draw(st.one_of(st.none(), st.integers(1, tasks)))
        job = JobSpec(id=f"j{seq}", project=draw(st.sampled_from(sorted(policy.projects))), request=request,
                      priority=draw(st.sampled_from([50, 50, 75, 100, 125])), tasks=tasks, min_tasks=min_tasks,
                      submitted=float(draw(st.integers(0, 500))), seq=seq, placements=(None,) * tasks)
        if draw(st.integers(0, 3)) == 0:
            placements: list[TaskPlacement | None] = []
            for _ in range(tasks):
                placement = room.take(draw(st.sampled_from(names)), request)
                if placement is None:
                    break
                placements.append(placement)
            if len(placements) == tasks:
                job = dataclasses.replace(job, placements=tuple(placements),
                                          started=float(draw(st.integers(int(job.submitted), int(NOW)))))
            else:
                for placement in placements:
                    assert placement is not None
                    for i in placement.gpu_index:
                        room.share[placement.node][i] += placement.gpu_share
                    room.cpu[placement.node] += request.cpus
                    room.mem[placement.node] += request.memory_gib
        jobs.append(job)
    return Case(policy, Snapshot(tuple(specs), tuple(jobs), NOW), draw(st.integers(1, 3)))


class Stretches:
    """A tracer that counts the core's lines run between two turns: ``longest`` is the most of them."""

    def __init__(self) -> None:
        self.lines = 0
        self.longest = 0
        self.turns = 0

    def turn(self) -> None:
        """The turn the core is given: a stretch ends here."""
        self.longest = max(self.longest, self.lines)
        self.lines = 0
        self.turns += 1

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if "/gpud/" not in frame.f_code.co_filename:
            return None
        if event == "line":
            self.lines += 1
        return self._trace

    def __enter__(self) -> Stretches:
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)
        self.turn()  # the stretch from the last turn to the end counts too


def traced_cycles(case: Case) -> Stretches:
    """A scheduler built from the case and its cycles run (each a minute after the last, the jobs of the
    plan started or stopped as the plan says), every step given a turn, under the counting tracer."""
    stretches = Stretches()
    snapshot = case.snapshot
    with stretches:
        scheduler = Scheduler(snapshot, case.policy, PM, stretches.turn, every=1)
        for n in range(case.cycles):
            scheduler.cycle(NOW + 60.0 * n, stretches.turn)
    return stretches


@pytest.mark.skipif(COMPILED, reason="the tracer sees only interpreted lines")
@TRACED
@given(big_cases())
def test_no_stretch_of_a_cycle_runs_long_without_a_turn(case):
    stretches = traced_cycles(case)
    assert stretches.longest <= MOST_LINES, (
        f"{stretches.longest} lines of the core ran without a turn ({stretches.turns} turns in all)")


@TRACED
@given(big_cases())
def test_turns_change_no_plan(case):
    # schedule() and a warm scheduler, each with a turn at every step and without any: the same plans.
    snapshot = case.snapshot
    calls = []
    for _ in range(case.cycles):
        plain = schedule(snapshot, case.policy, PM)
        turned = schedule(snapshot, case.policy, PM, lambda: calls.append(1), every=1)
        assert (turned.binds, turned.evictions, dict(pending_texts(turned))) == (
            plain.binds, plain.evictions, dict(pending_texts(plain)))
        snapshot = apply_plan(snapshot, plain)
    assert calls or not case.snapshot.jobs


def test_a_turn_comes_every_so_many_steps_and_none_without_one():
    calls = []
    turns = Turns(lambda: calls.append(1), every=3)
    for _ in range(10):
        turns.step()
    assert len(calls) == 3
    Turns(None, every=1).step()  # no turn given: nothing to call
    with pytest.raises(ValueError, match="at least 1"):
        Turns(None, every=0)
