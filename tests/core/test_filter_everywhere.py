"""A node a ``gpud_filter_node`` plugin refuses gets none of the job's tasks, however the scheduler makes room."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sched_helpers import evictions, nodes_of, scenario
from test_properties import SETTINGS, cases
from gpud import hookimpl
from gpud.core import schedule
from gpud.plugins import make_plugin_manager
from gpud.simulate import apply_plan, simulate


class Maintenance:
    """Keeps jobs named ws* off nodes labelled maintenance=yes."""

    @hookimpl
    def gpud_filter_node(self, job, node):
        if job.id.startswith("ws") and node.labels.get("maintenance") == "yes":
            return "node is under maintenance"
        return None


NODES = """
    [[policy.projects]]
    name = "p1"
    gpu_quota = 8
    [[nodes]]
    name = "n1"
    gpus = 4
    labels = { maintenance = "yes" }
    [[nodes]]
    name = "n2"
    gpus = 4
    """


def simulate_with_filter(text: str, with_filter: bool = True):
    sc = scenario(text)
    pm = make_plugin_manager(load_entry_points=False)
    if with_filter:
        pm.register(Maintenance(), name="maintenance")
    return simulate(sc, pm)


PREEMPTION = NODES + """
    [[jobs]]
    name = "old"
    count = 2
    project = "p1"
    gpus = 2
    submitted = 0
    running_on = ["n2"]
    [[jobs]]
    name = "new"
    count = 2
    project = "p1"
    gpus = 2
    submitted = 50
    running_on = ["n1"]
    [[jobs]]
    name = "ws"
    project = "p1"
    priority = "build"
    gpus = 2
    submitted = 100
    """


def test_preemption_never_puts_the_job_on_a_node_the_filter_refuses() -> None:
    sim = simulate_with_filter(PREEMPTION)
    assert "n1" not in nodes_of(sim, "ws")
    assert not any(e.job.startswith("new") for e in evictions(sim))


def test_preemption_clears_the_next_node_when_the_filter_refuses_the_cheapest() -> None:
    # The newest victims run on n1, which the filter refuses: the job takes n2 from an older one.
    sim = simulate_with_filter(PREEMPTION)
    assert nodes_of(sim, "ws") == ["n2"]
    assert [(e.job, e.rule, e.for_job) for e in evictions(sim)] == [("old-2", "preempt", "ws")]


def test_without_the_filter_preemption_takes_the_refused_node() -> None:
    # Guards the test above: the most recent victims run on n1, so only the filter keeps ws off it.
    sim = simulate_with_filter(PREEMPTION, with_filter=False)
    assert nodes_of(sim, "ws") == ["n1"]


CONSOLIDATION = NODES + """
    [[jobs]]
    name = "a"
    count = 3
    project = "p1"
    gpus = 1
    running_on = ["n2"]
    [[jobs]]
    name = "b"
    project = "p1"
    gpus = 1
    running_on = ["n1"]
    [[jobs]]
    name = "ws"
    project = "p1"
    gpus = 4
    submitted = 100
    """


def test_consolidation_never_clears_a_node_the_filter_refuses_for_the_job() -> None:
    sim = simulate_with_filter(CONSOLIDATION)
    assert "n1" not in nodes_of(sim, "ws")


def test_without_the_filter_consolidation_clears_the_refused_node() -> None:
    sim = simulate_with_filter(CONSOLIDATION, with_filter=False)
    assert nodes_of(sim, "ws") == ["n1"]


RECLAIM = """
    [[policy.projects]]
    name = "p1"
    gpu_quota = 0
    [[policy.projects]]
    name = "p2"
    gpu_quota = 4
    [[nodes]]
    name = "n1"
    gpus = 4
    labels = { maintenance = "yes" }
    [[nodes]]
    name = "n2"
    gpus = 4
    [[jobs]]
    name = "old"
    count = 2
    project = "p1"
    gpus = 2
    submitted = 0
    running_on = ["n2"]
    [[jobs]]
    name = "new"
    count = 2
    project = "p1"
    gpus = 2
    submitted = 50
    running_on = ["n1"]
    [[jobs]]
    name = "ws"
    project = "p2"
    gpus = 2
    submitted = 100
    """


def test_reclaim_clears_the_next_node_when_the_filter_refuses_the_cheapest() -> None:
    sim = simulate_with_filter(RECLAIM)
    assert nodes_of(sim, "ws") == ["n2"]
    assert {(e.job, e.rule, e.for_job) for e in evictions(sim)} == {("old-2", "reclaim", "ws")}


def test_without_the_filter_reclaim_takes_the_cheapest_node() -> None:
    # Guards the test above: the victims that come first in the order run on n1.
    sim = simulate_with_filter(RECLAIM, with_filter=False)
    assert nodes_of(sim, "ws") == ["n1"]
    assert {(e.job, e.rule) for e in evictions(sim)} == {("new-2", "reclaim")}


class RefuseNodes:
    """Refuses the even-numbered jobs of tests/test_properties.py's cases the nodes in ``refused``."""

    def __init__(self, refused: frozenset[str]) -> None:
        self.refused = refused

    @hookimpl
    def gpud_filter_node(self, job, node):
        if int(job.id[1:]) % 2 == 0 and node.name in self.refused:
            return "refused by the test"
        return None


@SETTINGS
@given(cases(), st.data())
def test_no_action_binds_a_task_where_a_filter_plugin_refuses_it(case, data):
    # Allocation, consolidation, reclaim and preemption alike: every bind of every cycle goes to a
    # node the filter plugins allow for the job (what ran there before the cycle may stay).
    refused = frozenset(data.draw(st.sets(st.sampled_from(sorted(n.name for n in case.snapshot.nodes)))))
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(RefuseNodes(refused), name="refuse")
    snapshot = case.snapshot
    for _ in range(case.cycles):
        plan = schedule(snapshot, case.policy, pm)
        assert not [b for b in plan.binds if int(b.job[1:]) % 2 == 0 and b.placement.node in refused]
        snapshot = apply_plan(snapshot, plan)
