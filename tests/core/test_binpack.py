"""Bin-pack (best fit): a task goes to the node it would leave least free, counting GPUs, the free
part of shared GPUs, CPUs and memory, each against the pool's largest node."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpud.core.placement import Placer
from gpud.core.state import ClusterState, Statement
from gpud.core.nodes import leftover
from gpud.core.strategies import BinPack
from gpud.model import EPS, JobSpec, NodeSpec, Snapshot, TaskPlacement, TaskRequest
from gpud.plugins import make_plugin_manager
from gpud.trace.fill import fill_policy
from test_properties import SETTINGS

PM = make_plugin_manager()


def cluster(nodes, running=()) -> ClusterState:
    return ClusterState(Snapshot(tuple(nodes), tuple(running), 0.0), fill_policy("binpack"), PM)


def choose(nodes, request: TaskRequest, running=()) -> TaskPlacement | None:
    """Where one task goes, as the scheduler's Placer finds it under bin-pack."""
    return Placer(cluster(nodes, running)).find(JobSpec("new", "trace", request))


def holding(job_id: str, node: str, request: TaskRequest, gpus: tuple[int, ...], share: float = 1.0) -> JobSpec:
    return JobSpec(job_id, "trace", request, placements=(TaskPlacement(node, gpus, share),), started=0.0)


def test_a_task_keeps_off_the_large_host_it_would_leave_mostly_free():
    # "host" has fewer free GPUs, which the fullest-node rule chose, but 120 CPUs and 700 GiB with them:
    # the only node a large task could use. "snug" has one GPU more and little else to spare.
    nodes = [NodeSpec("host", gpus=8, cpus=128, memory_gib=768), NodeSpec("snug", gpus=4, cpus=16, memory_gib=64)]
    running = [holding("r", "host", TaskRequest(6, cpus=8, memory_gib=68), (0, 1, 2, 3, 4, 5)),
               holding("s", "snug", TaskRequest(1, cpus=4, memory_gib=16), (0,))]
    assert choose(nodes, TaskRequest(1, cpus=4, memory_gib=16), running).node == "snug"


def test_free_cpus_decide_between_nodes_with_the_same_free_gpus():
    nodes = [NodeSpec("many-cpus", gpus=4, cpus=64, memory_gib=256), NodeSpec("few-cpus", gpus=4, cpus=16, memory_gib=256)]
    assert choose(nodes, TaskRequest(2, cpus=8, memory_gib=32)).node == "few-cpus"


def test_free_memory_decides_between_nodes_alike_in_gpus_and_cpus():
    nodes = [NodeSpec("roomy", gpus=2, cpus=32, memory_gib=512), NodeSpec("tight", gpus=2, cpus=32, memory_gib=128)]
    assert choose(nodes, TaskRequest(1, cpus=8, memory_gib=32)).node == "tight"


def test_a_fraction_goes_where_the_least_gpu_is_left_and_on_its_fullest_gpu():
    nodes = [NodeSpec("a", gpus=2, cpus=32, memory_gib=128), NodeSpec("b", gpus=2, cpus=32, memory_gib=128)]
    small = TaskRequest(0.2, cpus=1, memory_gib=1)
    running = [holding("r1", "a", small, (1,), 0.2), holding("r2", "b", small, (0,), 0.2),
               holding("r3", "b", small, (1,), 0.2), holding("r4", "b", small, (1,), 0.2)]
    found = choose(nodes, TaskRequest(0.5, cpus=1, memory_gib=1), running)
    assert (found.node, found.gpu_index) == ("b", (1,))  # b has 1.4 GPUs free against a's 1.8


def test_a_cpu_only_task_goes_where_it_strands_no_free_gpu():
    nodes = [NodeSpec("gpu-free", gpus=2, cpus=16, memory_gib=64), NodeSpec("gpu-busy", gpus=2, cpus=32, memory_gib=64)]
    running = [holding("r", "gpu-busy", TaskRequest(2, cpus=4, memory_gib=8), (0, 1))]
    assert choose(nodes, TaskRequest(0, cpus=4, memory_gib=4), running).node == "gpu-busy"


# --- the rule over random clusters ---------------------------------------------------------------

# The weights the documentation states (docs/scheduling.md), written out rather than imported, so a
# change to the rule is a change to this test too.
WEIGHTS = (1.0, 1.0 / 3.0, 0.1)


def expected_leftover(node, largest: tuple[int, float, float]) -> float:
    g, c, m = WEIGHTS
    return (g * sum(node.free_share) / largest[0] + c * node.free_cpu / largest[1]
            + m * node.free_mem / largest[2])


def holds(node, request: TaskRequest) -> bool:
    """Whether ``node`` could take the task now, judged from its free capacity alone."""
    if request.cpus > node.free_cpu + EPS or request.memory_gib > node.free_mem + EPS:
        return False
    if not request.uses_gpu:
        return True
    if request.is_shared:
        return any(f >= request.gpus - EPS for f in node.free_share)
    return sum(1 for f in node.free_share if f >= 1 - EPS) >= request.whole_gpus


requests = st.one_of(
    st.builds(TaskRequest, st.sampled_from([1.0, 2.0, 4.0, 8.0]), cpus=st.integers(1, 48).map(float),
              memory_gib=st.integers(1, 400).map(float)),
    st.builds(TaskRequest, st.sampled_from([0.1, 0.25, 0.5, 0.75]), cpus=st.integers(1, 16).map(float),
              memory_gib=st.integers(1, 64).map(float)),
    st.builds(TaskRequest, st.just(0.0), cpus=st.integers(1, 64).map(float), memory_gib=st.integers(1, 128).map(float)))


@st.composite
def busy_clusters(draw):
    """Up to 8 nodes of assorted sizes with random tasks already placed on them (by the same Placer)."""
    specs = [NodeSpec(f"n{i}", gpus=draw(st.sampled_from([1, 2, 4, 8])), cpus=float(draw(st.sampled_from([8, 16, 32, 96, 128]))),
                      memory_gib=float(draw(st.sampled_from([32, 64, 128, 384, 768]))))
             for i in range(draw(st.integers(1, 8)))]
    state = cluster(specs)
    placer, stmt = Placer(state), Statement(state)
    for k in range(draw(st.integers(0, 24))):
        job = JobSpec(f"r{k}", "trace", draw(requests))
        state.jobs[job.id], state.placements[job.id] = job, [None]
        found = placer.find(job)
        if found is not None:
            stmt.bind(job, 0, found)
    return state


@SETTINGS
@given(busy_clusters(), requests)
def test_bin_pack_offers_every_node_that_holds_the_task_least_left_free_first(state, request):
    index = state.indexes["default"]
    largest = (max(n.gpus for n in index.nodes), max(n.spec.cpus for n in index.nodes),
               max(n.spec.memory_gib for n in index.nodes))
    offered = list(BinPack().candidates("binpack", request, index))
    holders = {n.name for n in index.nodes if holds(n, request)}
    assert {n.name for n in offered if holds(n, request)} == holders
    assert len(offered) == len({n.name for n in offered})
    scores = [expected_leftover(n, largest) for n in offered if holds(n, request)]
    assert scores == sorted(scores)
    found = Placer(state).find(JobSpec("new", "trace", request))
    assert (found is None) == (not holders)
    if found is not None:
        chosen = next(n for n in index.nodes if n.name == found.node)
        assert expected_leftover(chosen, largest) <= min(expected_leftover(n, largest) for n in index.nodes
                                                         if n.name in holders) + 1e-12


def walk_order(request: TaskRequest, index) -> list:
    """The nodes that might hold the task in the order the index walks them, each once: a fraction's
    partly used GPUs first, then nodes by whole GPUs free (CPU-only: by CPUs free)."""
    if not request.uses_gpu:
        nodes = list(index.with_free_cpus(request.cpus))
    elif request.is_shared:
        nodes = ([node for node, _ in index.shared_gpus(request.gpus, cpus=request.cpus)]
                 + list(index.with_free_gpus(1, cpus=request.cpus)))
    else:
        nodes = list(index.with_free_gpus(request.whole_gpus, cpus=request.cpus))
    return list({node.name: node for node in reversed(nodes)}.values())[::-1]


@st.composite
def churned_clusters(draw):
    """A busy cluster some of whose tasks then ended, so that nodes moved both ways between buckets."""
    state = draw(busy_clusters())
    running = sorted(job_id for job_id, slots in state.placements.items() if slots[0] is not None)
    ended = draw(st.lists(st.sampled_from(running), unique=True)) if running else []
    stmt = Statement(state)
    for job_id in ended:
        stmt.evict(state.jobs[job_id], 0, "reclaim", None, None)
    return state


@SETTINGS
@given(churned_clusters(), requests)
def test_among_nodes_left_equally_free_bin_pack_takes_the_first_the_index_walks(state, request):
    # Identical nodes are left equally free: which one is taken must not depend on how the best is found.
    index = state.indexes["default"]
    largest = (max(n.gpus for n in index.nodes), max(n.spec.cpus for n in index.nodes),
               max(n.spec.memory_gib for n in index.nodes))
    walked = [n for n in walk_order(request, index) if holds(n, request)]
    offered = list(BinPack().candidates("binpack", request, index))
    assert [n.name for n in offered] == [n.name for _, _, n in sorted(
        (expected_leftover(n, largest), i, n) for i, n in enumerate(walked))]


# --- the lists by leftover, sorted when read --------------------------------------------------------

def fits_as_defined(index) -> tuple[list, list]:
    """Each bucket's nodes as best fit must read them: by leftover now, ties in the bucket's own order,
    as (name, leftover) pairs; by whole GPUs and CPU class, then by free CPUs."""
    def ranked(bucket) -> list:
        return [(n.name, score) for score, _, n in sorted((leftover(n, index), i, n) for i, n in enumerate(bucket))]
    return [[ranked(bucket) for bucket in row] for row in index.by_whole], [ranked(b) for b in index.by_cpu]


def fits_as_kept(index) -> tuple[list, list]:
    """The index's lists by leftover (``fit_whole``, ``fit_cpu``) as a reader finds them."""
    index.sort_fits()
    return ([[[(n.name, score) for score, _, n in fits] for fits in row] for row in index.fit_whole],
            [[(n.name, score) for score, _, n in fits] for fits in index.fit_cpu])


@SETTINGS
@given(busy_clusters(), st.lists(st.one_of(st.tuples(st.just("start"), requests),
                                           st.tuples(st.just("end"), st.integers(0, 40)),
                                           st.tuples(st.just("read"), st.just(0))), max_size=30))
def test_lists_by_leftover_sorted_when_read_hold_each_bucket_by_leftover_then_bucket_order(state, steps):
    # Nodes move between buckets and their leftover changes at every bind and eviction; the lists are
    # sorted only when read. Whenever read, each must be its bucket's nodes by leftover now, ties in
    # the bucket's own order, however many changes came since the last reading.
    index, stmt, placer = state.indexes["default"], Statement(state), Placer(state)
    for n, (step, arg) in enumerate(steps):
        running = sorted(job_id for job_id, slots in state.placements.items() if slots[0] is not None)
        if step == "start":
            job = JobSpec(f"s{n}", "trace", arg)
            state.jobs[job.id], state.placements[job.id] = job, [None]
            found = placer.find(job)
            if found is not None:
                stmt.bind(job, 0, found)
        elif step == "end" and running:
            stmt.evict(state.jobs[running[arg % len(running)]], 0, "reclaim", None, None)
        elif step == "read":
            assert fits_as_kept(index) == fits_as_defined(index)
    assert fits_as_kept(index) == fits_as_defined(index)
