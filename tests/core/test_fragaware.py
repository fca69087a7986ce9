"""The fragmentation-aware placements rank nodes and never refuse a task some node can hold; fragaware
keeps the few nodes large enough for a typical request free of tasks other nodes can take."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpud.core.placement import Placer
from gpud.core.state import ClusterState, Statement
from gpud.model import EPS, JobSpec, NodeSpec, Snapshot, TaskPlacement, TaskRequest
from gpud.plugins import make_plugin_manager
from gpud.policies.fragaware import FragAware, Shape
from gpud.trace.fill import fill_policy
from test_properties import SETTINGS

MODELS = ("A", "B")


def cluster(strategy: str, nodes, profile, running=()) -> ClusterState:
    pm = make_plugin_manager()
    pm.register(FragAware(profile), name="profile")
    return ClusterState(Snapshot(tuple(nodes), tuple(running), 0.0), fill_policy(strategy), pm)


def test_a_small_task_keeps_off_the_only_node_a_rare_large_request_fits():
    # One node in ten has the CPUs and memory of a rare large shape (1% of requests); the task fits all.
    nodes = [NodeSpec("large", gpus=8, cpus=128, memory_gib=768)]
    nodes += [NodeSpec(f"n{i}", gpus=8, cpus=96, memory_gib=384) for i in range(9)]
    profile = [(Shape(1, 1000, 12000, 48 * 1024), 0.99), (Shape(8, 1000, 120000, 720 * 1024), 0.01)]
    running = [JobSpec(f"r{i}", "trace", TaskRequest(1, cpus=12, memory_gib=48), started=0.0,
                       placements=(TaskPlacement("n1", (i,), 1.0),)) for i in range(2)]
    job = JobSpec("new", "trace", TaskRequest(1, cpus=20, memory_gib=64))
    # Weighed by popularity alone, the large node's spare CPUs would make it the best place; weighed
    # by how few GPUs can host it (a tenth), the large shape keeps its node.
    assert Placer(cluster("fragaware", nodes, profile, running)).find(job).node != "large"


def test_scarcity_weighs_a_shape_by_the_share_of_gpus_that_can_host_it():
    nodes = [NodeSpec("large", gpus=8, cpus=128, memory_gib=768), NodeSpec("mid", gpus=8, cpus=96, memory_gib=384),
             NodeSpec("small", gpus=2, cpus=16, memory_gib=64, labels={"gpu_model": "B"})]
    profile = [(Shape(1, 500, 1000, 1024), 1.0), (Shape(8, 1000, 120000, 720 * 1024), 1.0),
               (Shape(1, 1000, 1000, 1024, (("gpu_model", "B"),)), 1.0), (Shape(16, 1000, 1000, 1024), 1.0)]
    state = cluster("fragaware", nodes, profile)
    weights = FragAware(profile).scarcity(state.indexes["default"].nodes)
    assert weights == (1.0, 18 / 8, 18 / 2, 1.0)  # no node holds 16 GPUs: every node loses it alike


# --- never refusing a task that fits ------------------------------------------------------------

shapes = st.builds(Shape, st.sampled_from([1, 2, 4, 8]), st.sampled_from([250, 500, 1000]),
                   st.sampled_from([1000, 4000, 12000, 64000]), st.sampled_from([1024, 16384, 65536]),
                   st.sampled_from([(), (("gpu_model", "A"),)])).map(
    lambda s: s if s.gpu_milli == 1000 or s.num_gpu == 1 else Shape(1, s.gpu_milli, s.cpu_milli, s.mem_mib, s.selector))

requests = st.one_of(
    st.builds(TaskRequest, st.sampled_from([1.0, 2.0, 4.0, 8.0]), cpus=st.integers(1, 64).map(float),
              memory_gib=st.integers(1, 500).map(float)),
    st.builds(TaskRequest, st.sampled_from([0.1, 0.25, 0.5, 0.8]), cpus=st.integers(1, 16).map(float),
              memory_gib=st.integers(1, 64).map(float)),
    st.builds(TaskRequest, st.just(0.0), cpus=st.integers(1, 64).map(float), memory_gib=st.integers(1, 128).map(float)))

selectors = st.sampled_from([{}, {}, {"gpu_model": "A"}, {"gpu_model": "B"}])


@st.composite
def busy(draw):
    """(strategy, cluster state) with up to 8 nodes of assorted sizes and models, a random profile of
    typical shapes, and random tasks already placed by the same strategy."""
    strategy = draw(st.sampled_from(["fragaware", "fgd"]))
    specs = [NodeSpec(f"n{i}", gpus=draw(st.sampled_from([1, 2, 4, 8])),
                      cpus=float(draw(st.sampled_from([8, 16, 32, 96, 128]))),
                      memory_gib=float(draw(st.sampled_from([32, 64, 128, 384, 768]))),
                      labels={"gpu_model": draw(st.sampled_from(MODELS))})
             for i in range(draw(st.integers(1, 8)))]
    profile = draw(st.lists(st.tuples(shapes, st.floats(0.01, 1.0)), min_size=1, max_size=6))
    state = cluster(strategy, specs, profile)
    placer, stmt = Placer(state), Statement(state)
    for k in range(draw(st.integers(0, 24))):
        job = JobSpec(f"r{k}", "trace", draw(requests), node_selector=draw(selectors))
        state.jobs[job.id], state.placements[job.id] = job, [None]
        found = placer.find(job)
        if found is not None:
            stmt.bind(job, 0, found)
    return strategy, state


def holds(node, job: JobSpec) -> bool:
    """Whether ``node`` could take one task of ``job`` now, judged from its labels and free capacity alone."""
    request = job.request
    if any(node.labels.get(k) != v for k, v in job.node_selector.items()):
        return False
    if request.cpus > node.free_cpu + EPS or request.memory_gib > node.free_mem + EPS:
        return False
    if not request.uses_gpu:
        return True
    if request.is_shared:
        return any(f >= request.gpus - EPS for f in node.free_share)
    return sum(1 for f in node.free_share if f >= 1 - EPS) >= request.whole_gpus


@SETTINGS
@given(busy(), requests, selectors)
def test_a_task_that_some_node_can_hold_is_always_placed(case, request, selector):
    strategy, state = case
    job = JobSpec("new", "trace", request, node_selector=selector)
    found = Placer(state).find(job)
    hosts = {n.name for n in state.indexes["default"].nodes if holds(n, job)}
    assert (found is not None) == bool(hosts), (strategy, hosts)
    if found is not None:
        assert found.node in hosts
