"""Preemption's search for a node walks only the victims its index by node gives (gpud.core.victims_by_node).

When a preemption must free a fair-share excess where its task goes, the
search for a node passes over every node whose victims hold less than that
excess; the index gives the victims sitting on the other nodes, and only
those are walked. Over random clusters of every job shape (single tasks,
gangs, elastic gangs, fractions, memory slices, CPU-only, departments) and in
both victim orders, each search made from the index finds the very room the
search over the whole list finds, and the plans are those of the whole list.
"""

from __future__ import annotations

import dataclasses
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gpud.core import COMPILED, schedule
from gpud.core.evict import _RoomMaking, _without
from gpud.core.victim import Victim
from gpud.core.victim_rooms import NodeRoom, cheapest_room
from gpud.core.victims_by_node import VictimsByNode
from gpud.model import JobSpec, NodeSpec, Resources, Snapshot, TaskPlacement, TaskRequest
from gpud.policy import LEAST_LOST_WORK, YOUNGEST_FIRST, Department, Policy, Project

from test_properties import (NOW, PM, POOL, Case, Room, assert_plans_unchanged_with, policies, python_core_only,
                             requests, run_cycles)

SETTINGS = settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])

_searched = _RoomMaking._searched
# The compiled core calls its own methods natively: a method replaced on the class is never called there.


def _room(room: NodeRoom | None) -> tuple[str, list[str]] | None:
    """The node a room clears and the jobs it evicts there."""
    return None if room is None else (room.node.name, [victim.job.id for victim in room.victims])


class _Searches:
    """Each search for a node made from the index, made over the whole list of victims as well."""

    def __init__(self) -> None:
        self.compared = 0  # searches whose index left some victim out
        self.differed: list[str] = []

    def searched(self, making, must, holdings):
        part = _searched(making, must, holdings)
        if part is making.ordered:
            return part
        whole = list(making.ordered)
        if len(list(part)) < len(whole):
            self.compared += 1
        refused = making.refused
        found, expected = (
            cheapest_room(making.state, making.placer, making.job, _without(victims, refused),
                          making.lists.usable_nodes(making.job), must, holdings, making.lists.weighs_lost_work)
            for victims in (part, whole))
        if _room(found) != _room(expected):
            self.differed.append(f"{making.job.id}: index {_room(found)}, whole list {_room(expected)}")
        return part


@st.composite
def crowded_cases(draw) -> Case:
    """Nodes filled with low-priority running jobs of every shape, and high-priority pending jobs of the
    same projects: their queues hold about their fair share, so a preemption must free an excess."""
    policy = draw(policies())
    specs = [NodeSpec(name=f"n{i}", gpus=draw(st.sampled_from([1, 2, 4, 8])), gpu_memory_gib=draw(st.sampled_from([40.0, 80.0])),
                      cpus=float(draw(st.integers(4, 16))), memory_gib=float(draw(st.integers(16, 64))), pool=POOL)
             for i in range(1, draw(st.integers(2, 6)) + 1)]
    room = Room(specs)
    projects = sorted(policy.projects)
    if draw(st.booleans()):  # one project holds the cluster: its fair share is what it holds
        projects = projects[:1]
    jobs: list[JobSpec] = []
    for seq in range(draw(st.integers(6, 24))):
        request = draw(requests())
        tasks = draw(st.integers(1, 3))
        minimum = draw(st.one_of(st.none(), st.integers(1, tasks)))
        placements = []
        names = sorted(room.specs)
        for _ in range(tasks):  # on the node drawn, else on the first after it with room
            first = draw(st.integers(0, len(names) - 1))
            placement = next((found for k in range(len(names))
                              if (found := room.take(names[(first + k) % len(names)], request)) is not None), None)
            if placement is not None:
                placements.append(placement)
        if len(placements) < (minimum or tasks):
            continue  # the space taken stays taken: the cluster is only fuller
        jobs.append(JobSpec(id=f"r{seq}", project=draw(st.sampled_from(projects)), request=request,
                            priority=draw(st.sampled_from([40, 50, 60])), tasks=len(placements),
                            min_tasks=None if minimum is None else min(minimum, len(placements)),
                            submitted=0.0, started=float(draw(st.integers(1, 900))), seq=seq,
                            placements=tuple(placements)))
    for seq in range(20, 20 + draw(st.integers(1, 4))):
        tasks = draw(st.integers(1, 3))
        jobs.append(JobSpec(id=f"q{seq}", project=draw(st.sampled_from(projects)), request=draw(requests()),
                            priority=draw(st.sampled_from([60, 75, 75, 100, 125])), tasks=tasks,
                            min_tasks=draw(st.one_of(st.none(), st.integers(1, tasks))),
                            submitted=float(draw(st.integers(0, 900))), seq=seq, placements=(None,) * tasks))
    order = draw(st.sampled_from([LEAST_LOST_WORK, YOUNGEST_FIRST]))
    policy = dataclasses.replace(policy, victim_order=order, min_runtime_s=0.0)
    return Case(policy, Snapshot(tuple(specs), tuple(jobs), NOW), draw(st.integers(1, 3)))


def _compare_searches(case: Case) -> _Searches:
    searches = _Searches()
    with mock.patch.object(_RoomMaking, "_searched",
                           lambda making, must, holdings: searches.searched(making, must, holdings)):
        for _ in run_cycles(case, case.cycles):
            pass
    return searches


@python_core_only
@SETTINGS
@given(crowded_cases())
def test_the_index_finds_the_room_the_whole_list_finds(case):
    # A node left out by the index holds, in victims, less than what the preemption must free
    # there: the full search would have passed over it. The room found must be the same.
    searches = _compare_searches(case)
    assert not searches.differed, searches.differed


@python_core_only
@SETTINGS
@given(crowded_cases())
def test_the_index_gives_the_plans_of_the_whole_list(case):
    assert_plans_unchanged_with(case, _RoomMaking, "_searched", lambda self, must, holdings: self.ordered)


def test_the_index_leaves_out_the_victims_of_nodes_holding_too_little():
    # Project p, at its fair share of 5 GPUs, runs five 1-GPU jobs of priority 50, one on each of
    # three nodes and two on n4. A 2-GPU job of priority 100 must free 2 GPUs where it goes:
    # only n4's victims hold that much, so only they are searched, and they are evicted.
    nodes = tuple(NodeSpec(f"n{i}", gpus=2, gpu_memory_gib=80.0, cpus=16, memory_gib=64) for i in range(1, 5))
    one = TaskRequest(gpus=1.0, cpus=1.0, memory_gib=4.0)
    running = [JobSpec(f"r{i}", "p", one, priority=50, submitted=0.0, started=10.0 + i, seq=i,
                       placements=(TaskPlacement(node, (gpu,), 1.0),))
               for i, (node, gpu) in enumerate([("n1", 0), ("n2", 0), ("n3", 0), ("n4", 0), ("n4", 1)])]
    big = JobSpec("big", "p", TaskRequest(gpus=2.0, cpus=1.0, memory_gib=4.0), priority=100, submitted=500.0,
                  seq=9)
    filler = [JobSpec(f"o{i}", "other", one, priority=50, submitted=0.0, started=5.0, seq=20 + i,
                      placements=(TaskPlacement(f"n{i}", (1,), 1.0),)) for i in range(1, 4)]
    policy = Policy(departments={"default": Department("default", implicit=True)}, projects={"p": Project("p", quota={"default": Resources(gpu=5.0)}),
                              "other": Project("other", quota={"default": Resources(gpu=3.0)})})
    snapshot = Snapshot(nodes, tuple(running + filler + [big]), 1000.0)
    plan = schedule(snapshot, policy, PM)
    assert [(b.job, b.placement.node) for b in plan.binds] == [("big", "n4")]
    assert sorted(e.job for e in plan.evictions if not e.moved) == ["r3", "r4"]
    if not COMPILED:
        searches = _compare_searches(Case(policy, snapshot, 1))
        assert searches.compared >= 1 and not searches.differed, searches.differed


def test_victims_by_node_sum_up_and_list_by_node():
    victims_of = {}
    placements = {"g": [TaskPlacement("a", (0,), 1.0), TaskPlacement("b", (0, 1), 1.0)],
                  "h": [TaskPlacement("b", (2,), 0.5)], "k": [None]}
    for job_id in placements:
        job = JobSpec(job_id, "p", TaskRequest(gpus=1.0, cpus=2.0, memory_gib=8.0), tasks=len(placements[job_id]),
                      submitted=0.0, started=1.0, placements=tuple(placements[job_id]))
        victims_of[job_id] = Victim(job, None, [0], 10.0)
    index = VictimsByNode(list(victims_of.values()), placements)
    assert index.held == {"a": (1.0, 2.0, 8.0), "b": (2.5, 4.0, 16.0)}
    assert index.nodes_holding(1.0, 0.0, 0.0) == ["a", "b"] and index.nodes_holding(1.5, 0.0, 0.0) == ["b"]
    assert index.nodes_holding(0.0, 3.0, 0.0) == ["b"] and index.nodes_holding(3.0, 0.0, 0.0) == []
    assert [v.job.id for v in index.sitting_on(["b"])] == ["g", "h"]
    assert [v.job.id for v in index.sitting_on(["a", "b"])] == ["g", "h"]
    assert [v.job.id for v in index.sitting_on(["a"])] == ["g"]
    assert index.holds("b", 2.5, 4.0, 16.0) and not index.holds("a", 1.0, 2.0, 8.5) and not index.holds("z", 0, 0, 0.1)
