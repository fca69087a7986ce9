"""Fill mode and the fragmentation-aware placement, on small clusters with known answers."""

from __future__ import annotations

import random

import pytest

from gpud.core.placement import Placer
from gpud.core.state import ClusterState
from gpud.model import JobSpec, NodeSpec, Snapshot, TaskPlacement, TaskRequest
from gpud.plugins import make_plugin_manager, placement_strategies
from gpud.policies.fragaware import FragAware, Shape
from gpud.trace.alibaba import read_nodes, read_pods
from gpud.trace.fill import fill_policy, inflate, run_fill
from gpud.trace.run import parse_seeds
from trace_helpers import write_nodes, write_pods


def choose(strategy: str, nodes, request: TaskRequest, running=(), profile=None) -> TaskPlacement | None:
    """Where one task would go, as the scheduler's Placer finds it, with a given typical profile."""
    pm = make_plugin_manager()
    if profile is not None:
        pm.register(FragAware(profile), name="profile")
    state = ClusterState(Snapshot(tuple(nodes), tuple(running), 0.0), fill_policy(strategy), pm)
    return Placer(state).find(JobSpec("new", "trace", request))


def test_fragaware_is_a_builtin_strategy_beside_binpack_and_spread():
    assert {"binpack", "spread", "fragaware", "fgd"} <= placement_strategies(make_plugin_manager())


def test_a_cpu_only_task_keeps_off_the_node_whose_gpu_it_would_strand():
    nodes = [NodeSpec("small", gpus=1, cpus=8, memory_gib=64), NodeSpec("big", gpus=1, cpus=64, memory_gib=256)]
    profile = [(Shape(1, 1000, 8000, 8192), 1.0)]
    cpu_task = TaskRequest(gpus=0, cpus=4, memory_gib=1)
    assert choose("binpack", nodes, cpu_task).node == "small"
    assert choose("fragaware", nodes, cpu_task, profile=profile).node == "big"
    assert choose("fgd", nodes, cpu_task, profile=profile).node == "big"


def test_a_fraction_goes_where_both_leftovers_still_hold_a_typical_fraction():
    nodes = [NodeSpec("used", gpus=1, cpus=64), NodeSpec("empty", gpus=1, cpus=64)]
    running = [JobSpec("r", "trace", TaskRequest(gpus=0.3), placements=(TaskPlacement("used", (0,), 0.3),),
                       started=0.0)]
    profile = [(Shape(1, 500, 1000, 1024), 1.0)]
    half = TaskRequest(gpus=0.5, cpus=1, memory_gib=1)
    assert choose("binpack", nodes, half, running).node == "used"
    found = choose("fragaware", nodes, half, running, profile)
    assert (found.node, found.gpu_index, found.gpu_share) == ("empty", (0,), 0.5)


def test_memory_counts_for_fragaware_only():
    # Both nodes hold the task; on "tight" it would leave too little memory for the typical task.
    nodes = [NodeSpec("tight", gpus=2, cpus=64, memory_gib=40), NodeSpec("roomy", gpus=2, cpus=64, memory_gib=400)]
    profile = [(Shape(1, 1000, 4000, 32 * 1024), 1.0)]
    task = TaskRequest(gpus=1, cpus=4, memory_gib=16)
    assert choose("fragaware", nodes, task, profile=profile).node == "roomy"


def test_inflate_adds_draws_until_the_ratio_then_shuffles(tmp_path):
    pods = read_pods(write_pods(tmp_path / "p.csv", [(f"p{i}", 1000, 1024, 1, 500, "", "LS", "Running", 0, 9, 0)
                                                     for i in range(2)]))
    out = inflate(pods, 2, 1.0, random.Random(42))
    assert len(out) == 4 and sum(p.gpu_milli_total for p in out) == 2000
    assert [p.name for p in inflate(pods, 2, 1.0, random.Random(42))] == [p.name for p in out]
    assert len(inflate(pods, 1, 0.5, random.Random(1))) == 1


def test_fill_places_every_pod_that_fits_and_reports_each_level(tmp_path):
    pods = read_pods(write_pods(tmp_path / "p.csv", [(f"p{i}", 1000, 1024, 1, 500, "", "LS", "Running", 0, 9, 0)
                                                     for i in range(2)]))
    nodes = read_nodes(write_nodes(tmp_path / "n.csv", [("a", 64000, 65536, 1, "T4"), ("b", 64000, 65536, 1, "T4")]))
    for strategy in ("binpack", "spread", "fragaware", "fgd"):
        result = run_fill(pods, nodes, strategy, 42, make_plugin_manager(), ratio=1.0, levels=(50, 100))
        assert (result.arrived_pods, result.placed_pods, result.failed_pods) == (4, 4, 0)
        assert result.alloc_pct == {50: pytest.approx(50.0), 100: pytest.approx(100.0)}
        assert result.unallocated_gpus[100] == pytest.approx(0.0)


def test_fill_drops_what_does_not_fit_and_honours_model_constraints(tmp_path):
    pods = read_pods(write_pods(tmp_path / "p.csv", [
        ("t4", 1000, 1024, 1, 1000, "T4", "LS", "Running", 0, 9, 0),
        ("v100", 1000, 1024, 1, 1000, "V100M16|V100M32", "LS", "Running", 0, 9, 0),
    ]))
    nodes = read_nodes(write_nodes(tmp_path / "n.csv", [("a", 64000, 65536, 2, "V100M32")]))
    result = run_fill(pods, nodes, "fragaware", 1, make_plugin_manager(), ratio=1.0, levels=(100,))
    assert (result.arrived_pods, result.placed_pods, result.failed_pods) == (2, 1, 1)
    assert result.alloc_pct[100] == pytest.approx(50.0)


def test_seed_lists():
    assert parse_seeds("42-51") == list(range(42, 52))
    assert parse_seeds("1,3-4") == [1, 3, 4]
    with pytest.raises(ValueError):
        parse_seeds(",")
