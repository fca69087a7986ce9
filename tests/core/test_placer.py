"""The placer's memory of requests that found no room: it saves searches, never a placement.

A request that found no room is searched again only when a node where something was released since
could hold it, or when too many were to look at each; whatever it then finds must be what a placer with no
memory finds.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from gpud.core import schedule
from gpud.core.placement import Placer, holders_now, matching_nodes
from gpud.core.state import ClusterState, Statement
from gpud.model import JobSpec, NodeSpec, Snapshot, TaskPlacement, TaskRequest
from gpud.plugins import make_plugin_manager
from gpud.policy import Department, Policy, Project
from test_properties import SETTINGS, cases
from gpud.reasons import pending_texts

PM = make_plugin_manager()


def running(job_id: str, node: str, gpus: tuple[int, ...]) -> JobSpec:
    return JobSpec(job_id, "p", TaskRequest(len(gpus), cpus=1, memory_gib=1), started=0.0,
                   placements=(TaskPlacement(node, gpus),))


def full_cluster() -> ClusterState:
    """Three nodes of two GPUs, all busy: n1 with two one-GPU jobs, n2 and n3 with a two-GPU job each."""
    nodes = tuple(NodeSpec(name, gpus=2, cpus=8, memory_gib=64) for name in ("n1", "n2", "n3"))
    jobs = (running("a1", "n1", (0,)), running("a2", "n1", (1,)), running("b", "n2", (0, 1)),
            running("c", "n3", (0, 1)),
            JobSpec("wide", "p", TaskRequest(2, cpus=1, memory_gib=1), placements=(None,)))
    policy = Policy(departments={"d": Department("d")}, projects={"p": Project("p", department="d")})
    return ClusterState(Snapshot(nodes, jobs, 0.0), policy, PM)


def evict(state: ClusterState, stmt: Statement, job_id: str) -> None:
    stmt.evict(state.jobs[job_id], 0, "test", None, None)


def searched_without_room() -> tuple[ClusterState, Placer, Statement, JobSpec]:
    """The full cluster in a cycle, a placer that searched for the two-GPU job and found no room."""
    state = full_cluster()
    state.begin_cycle()
    placer, stmt = Placer(state), Statement(state)
    wide = state.jobs["wide"]
    assert placer.find(wide) is None
    return state, placer, stmt, wide


def test_a_request_without_room_finds_it_on_a_node_released_since():
    state, placer, stmt, wide = searched_without_room()
    evict(state, stmt, "a1")  # one GPU free on n1: still no room for two
    assert placer.find(wide) is None
    assert Placer(state).find(wide) is None
    evict(state, stmt, "c")  # n3 empties
    found = placer.find(wide)
    assert found is not None and found.node == "n3"
    assert found == Placer(state).find(wide)


def test_room_released_on_several_nodes_is_chosen_as_without_memory():
    state, placer, stmt, wide = searched_without_room()
    for job_id in ("b", "a1", "a2", "c"):
        evict(state, stmt, job_id)
        assert placer.find(wide) == Placer(state).find(wide)
    assert placer.find(wide) is not None


def test_room_released_on_many_nodes_at_once_is_found_as_without_memory():
    # Sixteen busy nodes: past two released since its last search (one node in eight), a request that found
    # no room is searched again rather than looked for node by node; below, node by node. Both find what a
    # placer with no memory finds.
    nodes = tuple(NodeSpec(f"n{i:02d}", gpus=2, cpus=8, memory_gib=64) for i in range(16))
    jobs = tuple(running(f"x{i:02d}{half}", f"n{i:02d}", (gpu,)) for i in range(16) for gpu, half in enumerate("ab"))
    jobs += (JobSpec("wide", "p", TaskRequest(2, cpus=1, memory_gib=1), placements=(None,)),)
    policy = Policy(departments={"d": Department("d")}, projects={"p": Project("p", department="d")})
    state = ClusterState(Snapshot(nodes, jobs, 0.0), policy, PM)
    state.begin_cycle()
    placer, stmt = Placer(state), Statement(state)
    wide = state.jobs["wide"]
    assert placer.find(wide) is None
    # Each step's evictions, and whether a node then has both GPUs free. Three nodes released since the last
    # search are searched (steps 1, 4 and 6); one or two are looked at node by node (2, 3, and 5, finding n05).
    steps = ((("x00a", "x01a", "x02a"), False), (("x03a",), False), (("x04a", "x05a"), False),
             (("x06a", "x07a", "x08a"), False), (("x05b",), True), (("x09a", "x09b", "x10a"), True))
    for released, room in steps:
        for job_id in released:
            evict(state, stmt, job_id)
        found = placer.find(wide)
        assert found == Placer(state).find(wide)
        assert (found is not None) == room


def test_a_request_without_room_is_searched_again_after_the_cycle_ends():
    # Releases are logged per cycle; a count from an earlier cycle means "search again".
    state, placer, stmt, wide = searched_without_room()
    evict(state, stmt, "b")
    state.begin_cycle()
    found = placer.find(wide)
    assert found is not None and found.node == "n2"


def test_the_nodes_released_since_a_count_are_each_named_once_latest_first():
    # A node released again moves to the front; a count taken between two releases sees only the later.
    state = full_cluster()
    state.begin_cycle()
    stmt, start = Statement(state), state.releases
    evict(state, stmt, "a1")
    after_a1 = state.releases
    for job_id in ("b", "a2", "c"):
        evict(state, stmt, job_id)
    assert state.released_since(start) == ["n3", "n1", "n2"]
    assert state.released_since(after_a1) == ["n3", "n1", "n2"]
    assert state.released_since(state.releases - 1) == ["n3"]
    assert state.released_since(state.releases) == []
    assert state.released_since(start, most=3) == ["n3", "n1", "n2"]
    assert state.released_since(start, most=2) is None  # more than that many: not listed
    stmt.rollback()  # the jobs bound again release nothing
    assert state.released_since(start) == ["n3", "n1", "n2"]
    state.begin_cycle()
    assert state.released_since(start) is None
    assert state.released_since(state.releases) == []


@SETTINGS
@given(cases())
def test_the_nodes_that_could_hold_a_task_now_are_counted_as_over_every_node(case):
    # A fragmented job is told how many nodes could hold one of its tasks now; counted from the index's
    # buckets, that is the count over every node of its pool that matches its selector.
    state = ClusterState(case.snapshot, case.policy, PM)
    for job in case.snapshot.jobs:
        index = state.indexes.get(state.pool_of(job))
        if index is None:
            continue
        matching = matching_nodes(index, job.node_selector)
        request = job.request
        every = sum(1 for n in matching if n.spec.schedulable and n.holds_host_resources(request)
                    and n.pick_gpus(request, range(n.gpus)) is not None)
        assert holders_now(index, matching, job.node_selector, request) == every


# --- the built-in strategies, called by the core itself ------------------------------------------

def traced(pm):
    """The same plugins with hook calls traced (to no writer): every hook is called through pluggy."""
    pm.enable_tracing()
    return pm


@SETTINGS
@given(cases(), st.sampled_from(["least_lost_work", "youngest_first"]))
def test_the_built_in_strategies_place_as_their_hooks_do(case, victim_order):
    # The core calls the built-in policy objects' methods itself: the plan must be the one their hooks
    # give when called through pluggy, with either victim order.
    policy = dataclasses.replace(case.policy, victim_order=victim_order)
    direct = schedule(case.snapshot, policy, make_plugin_manager())
    hooked = schedule(case.snapshot, policy, traced(make_plugin_manager()))
    assert direct.binds == hooked.binds and direct.evictions == hooked.evictions
    assert dict(pending_texts(direct)) == dict(pending_texts(hooked))


REVERSED = '''
from gpud import hookimpl

@hookimpl
def gpud_node_candidates(strategy, request, index):
    if strategy != "binpack":
        return None
    return iter(sorted(index.nodes, key=lambda node: node.name, reverse=True))

@hookimpl
def gpud_gpu_order(strategy, request, node):
    if strategy != "binpack":
        return None
    return list(reversed(range(node.gpus)))
'''


def test_a_plugin_answering_for_a_built_in_strategy_is_asked_before_it(tmp_path):
    # A site plugin registered after the built-ins is called first: for "binpack" its order wins,
    # though the core could run bin-pack itself.
    (tmp_path / "reversed_binpack.py").write_text(REVERSED)
    nodes = tuple(NodeSpec(name, gpus=4, cpus=8, memory_gib=64) for name in ("n1", "n2"))
    job = JobSpec("j", "p", TaskRequest(1, cpus=1, memory_gib=1), placements=(None,))
    policy = Policy(departments={"d": Department("d")}, projects={"p": Project("p", department="d")})
    builtin = schedule(Snapshot(nodes, (job,), 0.0), policy, PM)
    assert [(b.placement.node, b.placement.gpu_index) for b in builtin.binds] == [("n1", (0,))]
    site = schedule(Snapshot(nodes, (job,), 0.0), policy, make_plugin_manager(directory=tmp_path))
    assert [(b.placement.node, b.placement.gpu_index) for b in site.binds] == [("n2", (3,))]
