"""A job that consolidation moves is stopped and started again: the warm scheduler restarts its run.

Consolidation picks the task to move by the victim order (with
``least_lost_work``, the job that checkpointed just now before a younger
one that never did); the moved job then counts its minimum run time from
the move, not from its first start, as it does on its nodes.
"""

from __future__ import annotations

from gpud.core import Scheduler, schedule
from gpud.model import JobSpec, NodeSpec, Snapshot, TaskRequest
from gpud.plugins import make_plugin_manager
from gpud.policy import LEAST_LOST_WORK, YOUNGEST_FIRST, Department, Policy, Project, Resources

from test_properties import NOW, POOL

PM = make_plugin_manager()


def _policy(victim_order: str, min_runtime: float) -> Policy:
    """One project whose quota holds the whole cluster: neither reclaim nor preemption has a say."""
    return Policy(departments={"default": Department("default", implicit=True)},
                  projects={"p": Project("p", quota={POOL: Resources(1000.0, 1000.0, 10000.0)})},
                  min_runtime_s=min_runtime, victim_order=victim_order)


def _one_gpu_job(job_id: str, node: str, started: float, checkpointed: float | None, seq: int) -> JobSpec:
    from gpud.model import TaskPlacement
    return JobSpec(id=job_id, project="p", request=TaskRequest(gpus=1.0), priority=50, submitted=started,
                   started=started, placements=(TaskPlacement(node, (0,), 1.0),), seq=seq, checkpointed=checkpointed)


def _two_nodes_half_full(victim_order: str, swap: bool) -> tuple[Policy, Snapshot]:
    """x (old, checkpointed 10 s ago) and y (younger, never checkpointed) each hold one of a node's two
    GPUs; a job of two GPUs waits."""
    x = _one_gpu_job("x", "n2" if swap else "n1", 100.0, 990.0, 1)
    y = _one_gpu_job("y", "n1" if swap else "n2", 500.0, None, 2)
    want = JobSpec(id="want", project="p", request=TaskRequest(gpus=2.0), priority=50, submitted=995.0, seq=3)
    nodes = (NodeSpec("n1", gpus=2, pool=POOL), NodeSpec("n2", gpus=2, pool=POOL))
    return _policy(victim_order, 60.0), Snapshot(nodes, (x, y, want), NOW)


def test_the_job_checkpointed_just_now_moves_not_the_younger_one():
    for swap in (False, True):
        policy, snapshot = _two_nodes_half_full(LEAST_LOST_WORK, swap)
        plan = schedule(snapshot, policy, PM)
        assert [(e.job, e.rule, e.moved) for e in plan.evictions] == [("x", "consolidate", True)]
        assert sorted(b.job for b in plan.binds) == ["want", "x"]


def test_youngest_first_moves_the_younger_job():
    for swap in (False, True):
        policy, snapshot = _two_nodes_half_full(YOUNGEST_FIRST, swap)
        plan = schedule(snapshot, policy, PM)
        assert [(e.job, e.rule) for e in plan.evictions] == [("y", "consolidate")]


def test_a_moved_job_restarts_so_it_is_no_victim_before_its_minimum_run_time():
    # Cycle 1 moves x (checkpointed 10 s ago) to make room for "want". x restarted then: 10 s later a
    # higher-priority job needs a GPU, and x, too young to be a victim, stays; y goes.
    policy, snapshot = _two_nodes_half_full(LEAST_LOST_WORK, False)
    scheduler = Scheduler(snapshot, policy, PM)
    first = scheduler.cycle(NOW)
    assert [(e.job, e.moved) for e in first.evictions] == [("x", True)]
    scheduler.submit(JobSpec(id="urgent", project="p", request=TaskRequest(gpus=1.0), priority=75,
                             submitted=NOW + 5.0, seq=4))
    second = scheduler.cycle(NOW + 10.0)
    assert [(e.job, e.rule) for e in second.evictions] == [("y", "preempt")]
    assert [b.job for b in second.binds] == ["urgent"]
