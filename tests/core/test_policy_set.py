"""The policies the core calls (gpud.core.policy_set): the registered built-ins themselves, plugins of
one's own asked before them, and pluggy's whole call where hooks are wrapped or traced."""

from __future__ import annotations

import pluggy
import pytest

from gpud import hookimpl, hookspecs
from gpud.core import schedule
from gpud.core.orders import JobOrder, PriorityJobOrder
from gpud.core.policy_set import PolicySet
from gpud.core.state import ClusterState
from gpud.core.strategies import Strategy
from gpud.model import JobSpec, NodeSpec, Resources, Snapshot, TaskPlacement, TaskRequest
from gpud.plugins import make_plugin_manager
from gpud.policies.binpack import BinPackPlugin
from gpud.policies.job_order import JobOrderPlugin
from gpud.policies.queue_order import QueueOrderPlugin
from gpud.policies.victim_order import VictimOrderPlugin
from gpud.policy import Department, Policy, Project
from gpud.reasons import pending_texts


def manager(*plugins: object) -> pluggy.PluginManager:
    pm = pluggy.PluginManager("gpud")
    pm.add_hookspecs(hookspecs)
    for plugin in plugins:
        pm.register(plugin)
    return pm


def binds(plan) -> list[tuple[str, str, tuple[int, ...]]]:
    return sorted((b.job, b.placement.node, b.placement.gpu_index) for b in plan.binds)


def one_project(placement: str = "binpack") -> Policy:
    return Policy(departments={"d": Department("d")}, projects={"p": Project("p", department="d")},
                  placement=placement)


# --- the built-ins: the registered plugin is the object the core calls --------------------------

def test_the_core_calls_the_registered_built_in_objects_themselves():
    pm = make_plugin_manager(load_entry_points=False)
    policies = PolicySet(pm)
    assert policies.job_order is pm.get_plugin("job_order")
    assert policies.queue_order is pm.get_plugin("queue_order")
    assert policies.victim_order is pm.get_plugin("victim_order")
    for name in ("binpack", "spread"):
        assert policies.strategy(name) is pm.get_plugin(name)
    assert policies.strategy("fragaware") is policies.strategy("fgd") is pm.get_plugin("fragaware")


def test_a_built_in_answers_the_core_as_its_hook_answers_pluggy():
    pm = make_plugin_manager(load_entry_points=False)
    job = JobSpec("j1", "p1", TaskRequest(1), priority=75, submitted=3.0, seq=7)
    assert PolicySet(pm).job_order.key(job) == pm.hook.gpud_job_order_key(job=job) == (-75, 3.0, 7, "j1")


def test_the_built_in_job_order_declares_priority_first_and_a_plugin_before_it_declares_nothing():
    pm = make_plugin_manager(load_entry_points=False)
    assert PolicySet(pm).job_order.priority_first
    pm.register(ByPriority())
    assert not PolicySet(pm).job_order.priority_first


# --- plugins of one's own, asked before the built-ins, as pluggy asks them ------------------------

class ByPriority:
    @hookimpl
    def gpud_job_order_key(self, job):
        return ("priority", job)


class Abstains:
    @hookimpl
    def gpud_job_order_key(self, job):
        return None


class QueueOnly:
    """Takes fewer arguments than the hook gives."""

    @hookimpl
    def gpud_queue_order_key(self, queue):
        return ("queue", queue)


class Wrapper:
    @hookimpl(wrapper=True)
    def gpud_job_order_key(self, job):
        result = yield
        return ("wrapped", result)


@pytest.mark.parametrize("plugins", [
    (ByPriority(),),
    (Abstains(),),
    (ByPriority(), Abstains()),  # the last registered is asked first, abstains, and the other answers
    (Abstains(), ByPriority()),
    (ByPriority(), Wrapper()),
    (JobOrderPlugin(), Abstains()),
    (ByPriority(), JobOrderPlugin()),  # the built-in object, registered last, answers first
], ids=["one", "one that abstains", "abstains first", "answers first", "with a wrapper",
        "abstains before the built-in", "the built-in last"])
def test_the_job_order_key_is_what_pluggy_answers(plugins):
    pm = manager(*plugins)
    job = JobSpec("j1", "p1", TaskRequest(1), priority=75, submitted=3.0, seq=7)
    assert PolicySet(pm).job_order.key(job) == pm.hook.gpud_job_order_key(job=job)


def test_a_plugin_taking_fewer_arguments_gets_only_those():
    pm = manager(QueueOnly())
    state = ClusterState(Snapshot((NodeSpec("n1", gpus=2),), (), 0.0), one_project(), pm)
    queue = next(iter(state.queues.values()))
    job = JobSpec("j1", "p", TaskRequest(1))
    assert state.policies.queue_order.key(queue, job, Resources(gpu=1)) == ("queue", queue)


def test_a_wrapper_still_runs():
    pm = manager(ByPriority(), Wrapper())
    job = JobSpec("j1", "p1", TaskRequest(1))
    assert PolicySet(pm).job_order.key(job) == ("wrapped", ("priority", job))


class UrgentFirst:
    """Puts the jobs named "oncall-..." ahead of every priority; leaves the others to the next plugin."""

    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def gpud_job_order_key(self, job):
        self.calls += 1
        if not job.id.startswith("oncall-"):
            return None
        return (-10 ** 6, job.submitted, job.seq, job.id)


def test_a_job_order_plugin_reorders_only_the_jobs_it_answers_for():
    # One node of two GPUs, four one-GPU jobs: the built-in order runs b (priority 90) and d (earliest).
    # The plugin answers for oncall-c alone, which then runs first; the built-in still orders the rest.
    jobs = (JobSpec("a", "p", TaskRequest(1), priority=50, submitted=1.0, seq=1, placements=(None,)),
            JobSpec("b", "p", TaskRequest(1), priority=90, submitted=2.0, seq=2, placements=(None,)),
            JobSpec("oncall-c", "p", TaskRequest(1), priority=50, submitted=3.0, seq=3, placements=(None,)),
            JobSpec("d", "p", TaskRequest(1), priority=50, submitted=0.5, seq=4, placements=(None,)))
    snapshot = Snapshot((NodeSpec("n1", gpus=2),), jobs, 10.0)
    built_in = schedule(snapshot, one_project(), make_plugin_manager(load_entry_points=False))
    assert {job_id for job_id, _, _ in binds(built_in)} == {"b", "d"}
    pm = make_plugin_manager(load_entry_points=False)
    urgent = UrgentFirst()
    pm.register(urgent, name="urgent-first")
    plan = schedule(snapshot, one_project(), pm)
    assert {job_id for job_id, _, _ in binds(plan)} == {"oncall-c", "b"}
    assert urgent.calls >= len(jobs)
    order = PolicySet(pm).job_order
    assert [order.key(job) for job in jobs[:2] + jobs[3:]] == [PriorityJobOrder().key(job) for job in jobs[:2] + jobs[3:]]


class OwnOrder(PriorityJobOrder):
    """A job order object of one's own: the core calls its ``key``, and it declares priority first."""

    @hookimpl
    def gpud_job_order_key(self, job):
        return self.key(job)


def test_a_job_order_object_of_ones_own_is_called_directly_and_keeps_the_user_order():
    pm = make_plugin_manager(disable=["job_order"], load_entry_points=False)
    own = OwnOrder()
    pm.register(own, name="own-order")
    snapshot = Snapshot((NodeSpec("n1", gpus=2),), (), 0.0)
    state = ClusterState(snapshot, one_project(), pm)
    assert state.policies.job_order is own and state.user_order
    pm.register(ByPriority())
    assert not ClusterState(snapshot, one_project(), pm).user_order


def test_a_job_order_object_declares_nothing_unless_it_says_so():
    assert not JobOrder().priority_first and PriorityJobOrder().priority_first


# --- strategies of one's own -----------------------------------------------------------------------

class LastNode(Strategy):
    """The ``lastnode`` strategy as a strategy object: the core passes it by for other strategies."""

    def __init__(self) -> None:
        super().__init__(("lastnode",))
        self.calls = 0

    def candidates(self, strategy, request, index):
        self.calls += 1
        return iter(sorted(index.nodes, key=lambda node: node.name, reverse=True))

    def gpu_order(self, strategy, request, node):
        self.calls += 1
        return list(reversed(range(node.gpus)))

    @hookimpl
    def gpud_placement_strategies(self):
        return list(self.names)

    @hookimpl
    def gpud_node_candidates(self, strategy, request, index):
        return self.candidates(strategy, request, index) if strategy in self.names else None

    @hookimpl
    def gpud_gpu_order(self, strategy, request, node):
        return self.gpu_order(strategy, request, node) if strategy in self.names else None


class LastNodeFunctions:
    """The ``lastnode`` strategy as plain hook functions: asked for every strategy, None for the others."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    @hookimpl
    def gpud_placement_strategies(self):
        return ["lastnode"]

    @hookimpl
    def gpud_node_candidates(self, strategy, request, index):
        self.calls[strategy] = self.calls.get(strategy, 0) + 1
        if strategy != "lastnode":
            return None
        return iter(sorted(index.nodes, key=lambda node: node.name, reverse=True))

    @hookimpl
    def gpud_gpu_order(self, strategy, request, node):
        if strategy != "lastnode":
            return None
        return list(reversed(range(node.gpus)))


def three_nodes_four_jobs() -> Snapshot:
    nodes = tuple(NodeSpec(f"n{i}", gpus=4, cpus=16, memory_gib=64) for i in (1, 2, 3))
    jobs = tuple(JobSpec(f"j{i}", "p", TaskRequest(1, cpus=1, memory_gib=1), seq=i, placements=(None,))
                 for i in range(4))
    return Snapshot(nodes, jobs, 0.0)


def test_a_strategy_object_of_ones_own_is_never_called_for_a_binpack_pool():
    snapshot = three_nodes_four_jobs()
    built_in = schedule(snapshot, one_project(), make_plugin_manager(load_entry_points=False))
    pm = make_plugin_manager(load_entry_points=False)
    last = LastNode()
    pm.register(last, name="lastnode")
    assert PolicySet(pm).strategy("binpack") is pm.get_plugin("binpack")
    assert binds(schedule(snapshot, one_project(), pm)) == binds(built_in)
    assert last.calls == 0
    plan = schedule(snapshot, one_project("lastnode"), pm)
    assert binds(plan) == [(f"j{i}", "n3", (3 - i,)) for i in range(4)]
    assert last.calls > 0


def test_a_strategy_of_plain_functions_costs_its_own_calls_and_changes_no_binpack_plan():
    snapshot = three_nodes_four_jobs()
    built_in = schedule(snapshot, one_project(), make_plugin_manager(load_entry_points=False))
    pm = make_plugin_manager(load_entry_points=False)
    functions = LastNodeFunctions()
    pm.register(functions, name="lastnode")
    assert binds(schedule(snapshot, one_project(), pm)) == binds(built_in)
    assert functions.calls == {"binpack": len(snapshot.jobs)}  # one search per job, each answered None
    plan = schedule(snapshot, one_project("lastnode"), pm)
    assert binds(plan) == [(f"j{i}", "n3", (3 - i,)) for i in range(4)]


# --- hook tracing ----------------------------------------------------------------------------------

class Counted:
    """Counts the calls of a built-in policy method, whether the core or the policy's hook makes them."""

    calls = 0


class CountedJobOrder(JobOrderPlugin, Counted):
    def key(self, job):
        self.calls += 1
        return super().key(job)


class CountedQueueOrder(QueueOrderPlugin, Counted):
    def key(self, queue, job, need):
        self.calls += 1
        return super().key(queue, job, need)


class CountedVictimOrder(VictimOrderPlugin, Counted):
    def key(self, victim):
        self.calls += 1
        return super().key(victim)


class CountedBinPack(BinPackPlugin, Counted):
    def candidates(self, strategy, request, index):
        self.calls += 1
        return super().candidates(strategy, request, index)


COUNTED = {"job_order": ("gpud_job_order_key", CountedJobOrder),
           "queue_order": ("gpud_queue_order_key", CountedQueueOrder),
           "victim_order": ("gpud_victim_order_key", CountedVictimOrder),
           "binpack": ("gpud_node_candidates", CountedBinPack)}


def contended() -> Snapshot:
    """n1 busy with two low-priority jobs that ran long enough to be preempted, n2 free: a two-GPU job
    goes to n2, and an urgent one-GPU job preempts on n1."""
    nodes = (NodeSpec("n1", gpus=2), NodeSpec("n2", gpus=2))
    running = tuple(JobSpec(f"r{i}", "p", TaskRequest(1), priority=20, started=0.0, seq=i,
                            placements=(TaskPlacement("n1", (i,)),)) for i in (0, 1))
    pending = (JobSpec("wide", "p", TaskRequest(2), priority=90, submitted=900.0, seq=5, placements=(None,)),
               JobSpec("urgent", "p", TaskRequest(1), priority=90, submitted=950.0, seq=6, placements=(None,)))
    return Snapshot(nodes, running + pending, 1000.0)


def counted_manager() -> tuple[pluggy.PluginManager, dict[str, Counted]]:
    pm = make_plugin_manager(disable=list(COUNTED), load_entry_points=False)
    counted = {}
    for name, (_, kind) in COUNTED.items():
        counted[name] = kind()
        pm.register(counted[name], name=f"counted-{name}")
    return pm, counted


def test_hook_tracing_sees_every_call_the_core_makes_and_the_plan_stays(monkeypatch):
    pm, direct = counted_manager()
    plan = schedule(contended(), one_project(), pm)
    assert plan.evictions and {b.job for b in plan.binds} >= {"wide"}
    monkeypatch.setenv("GPUD_TRACE_HOOKS", "1")
    traced_pm, through_pluggy = counted_manager()
    lines: list[str] = []
    traced_pm.trace.root.setwriter(lines.append)
    traced_plan = schedule(contended(), one_project(), traced_pm)
    assert (traced_plan.binds, traced_plan.evictions) == (plan.binds, plan.evictions)
    assert dict(pending_texts(traced_plan)) == dict(pending_texts(plan))
    for name, (hook, _) in COUNTED.items():
        calls = sum(1 for line in lines if line.lstrip().startswith(f"{hook} [hook]"))
        assert direct[name].calls > 0, name
        assert calls == through_pluggy[name].calls == direct[name].calls, name


def test_hook_tracing_turned_on_by_hand_is_seen_as_well():
    pm = make_plugin_manager(load_entry_points=False)
    lines: list[str] = []
    pm.trace.root.setwriter(lines.append)
    pm.enable_tracing()
    job = JobSpec("j1", "p1", TaskRequest(1), priority=75, submitted=3.0, seq=7)
    policies = PolicySet(pm)
    assert policies.job_order.key(job) == (-75, 3.0, 7, "j1")
    assert sum(1 for line in lines if line.lstrip().startswith("gpud_job_order_key [hook]")) == 1
    assert policies.job_order.priority_first  # the built-in alone gives every key, through pluggy too
