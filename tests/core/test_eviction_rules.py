"""Eviction: reclaim, preemption, consolidation, gangs, minimum run time, reasons and stability.

One test per rule of DESIGN.md items 4-7; each scenario's outcome would differ if the rule were broken.
"""

from __future__ import annotations

import pytest

from sched_helpers import evicted_jobs, evictions, fair_share, gpus, job, nodes_of, queue, reason, run, scenario
from gpud import hookimpl
from gpud.core import Scheduler
from gpud.plugins import make_plugin_manager
from gpud.simulate import simulate
from gpud.reasons import eviction_text, pending_texts


# --- reclaim --------------------------------------------------------------------------------------

RECLAIM_OVER_FAIR_SHARE_FIRST = """
    # p1 holds 7 (fair share 5), p2 holds 5 (fair share 5, quota 2): p2's jobs are the lowest priority
    # and the most recent, so victim order alone would pick them; p1 is over its fair share and goes first.
    [[policy.projects]]
    name = "p1"
    gpu_quota = 2
    [[policy.projects]]
    name = "p2"
    gpu_quota = 2
    [[policy.projects]]
    name = "p3"
    gpu_quota = 6
    [[nodes]]
    name = "n1"
    gpus = 12
    [[jobs]]
    name = "x"
    count = 7
    project = "p1"
    gpus = 1
    submitted = 0
    running_on = ["n1"]
    [[jobs]]
    name = "y"
    count = 5
    project = "p2"
    priority = 40
    gpus = 1
    submitted = 50
    running_on = ["n1"]
    [[jobs]]
    name = "z"
    count = 2
    project = "p3"
    gpus = 1
    submitted = 100
"""


def test_reclaim_takes_from_queues_over_fair_share_first():
    sim = run(RECLAIM_OVER_FAIR_SHARE_FIRST)
    assert evicted_jobs(sim) == {"x-6", "x-7"}
    assert all(e.rule == "reclaim" for e in evictions(sim))
    assert (gpus(sim, "p1"), gpus(sim, "p2"), gpus(sim, "p3")) == (5, 5, 2)


OVER_QUOTA_ONLY = """
    # p1 holds all of n1 and is at its fair share (4) but over its quota ({p1_quota}); the free GPUs of n2
    # do not carry the label p3's job needs.
    [[policy.projects]]
    name = "p1"
    gpu_quota = {p1_quota}
    [[policy.projects]]
    name = "p3"
    gpu_quota = {p3_quota}
    [[nodes]]
    name = "n1"
    gpus = 4
    labels = {{ kind = "a" }}
    [[nodes]]
    name = "n2"
    gpus = 4
    labels = {{ kind = "b" }}
    [[jobs]]
    name = "x"
    count = 4
    project = "p1"
    gpus = 1
    running_on = ["n1"]
    [[jobs]]
    name = "z"
    project = "p3"
    gpus = 1
    node_selector = {{ kind = "a" }}
    submitted = 100
"""


def test_reclaim_from_a_queue_over_quota_when_none_is_over_fair_share():
    sim = run(OVER_QUOTA_ONLY.format(p1_quota=0, p3_quota=2))
    assert evicted_jobs(sim) == {"x-4"}
    assert nodes_of(sim, "z") == ["n1"]
    (eviction,) = evictions(sim)
    assert "project p1 4/0 GPUs over quota" in eviction_text(eviction.why)


def test_reclaim_from_over_quota_queue_only_while_reclaimer_stays_within_its_quota():
    sim = run(OVER_QUOTA_ONLY.format(p1_quota=0, p3_quota=0))
    assert evictions(sim) == []
    assert sim.pending() == {"z"}


def test_a_queue_at_its_quota_is_never_a_victim():
    # Quotas add up to more than the pool: p2 deserves 4 and holds nothing, but p1 is within its quota.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 4
        [[policy.projects]]
        name = "p2"
        gpu_quota = 4
        [[nodes]]
        name = "n1"
        gpus = 4
        [[jobs]]
        name = "x"
        count = 4
        project = "p1"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "y"
        count = 2
        project = "p2"
        gpus = 1
        submitted = 100
        """)
    assert evictions(sim) == []
    assert gpus(sim, "p1") == 4
    assert sim.pending() == {"y-1", "y-2"}


def test_reclaimer_never_ends_above_its_fair_share():
    # 3 GPUs, two projects: fair share 1.5 each. p2 takes one GPU; a second would put it at 2 > 1.5.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        [[policy.projects]]
        name = "p2"
        [[nodes]]
        name = "n1"
        gpus = 3
        [[jobs]]
        name = "x"
        count = 3
        project = "p1"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "y"
        count = 3
        project = "p2"
        gpus = 1
        submitted = 100
        """)
    assert (gpus(sim, "p1"), gpus(sim, "p2")) == (2, 1)
    assert evicted_jobs(sim) == {"x-3"}


def test_a_job_too_large_for_the_fair_share_in_gpus_does_not_hold_back_a_smaller_one_asking_more_cpus():
    # Fair share 2 GPUs each. p2's first job reclaims one GPU; "big" (2 GPUs) would then take p2 to 3
    # and waits. "wide" asks one GPU and more CPUs than "big": only its GPUs count, and they fit.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        [[policy.projects]]
        name = "p2"
        [[nodes]]
        name = "n1"
        gpus = 4
        [[jobs]]
        name = "x"
        count = 4
        project = "p1"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "first"
        project = "p2"
        gpus = 1
        submitted = 100
        [[jobs]]
        name = "big"
        project = "p2"
        gpus = 2
        submitted = 101
        [[jobs]]
        name = "wide"
        project = "p2"
        gpus = 1
        cpus = 8
        submitted = 102
        """)
    assert (gpus(sim, "p1"), gpus(sim, "p2")) == (2, 2)
    assert sim.pending() & {"first", "big", "wide"} == {"big"}


def test_elastic_reclaimer_stays_within_its_fair_share():
    # Fair share 1.5 each. Evicting p1's 2-GPU job frees 2 GPUs, but the elastic job may take only one.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        [[policy.projects]]
        name = "p2"
        [[nodes]]
        name = "n1"
        gpus = 3
        [[jobs]]
        name = "one"
        project = "p1"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "two"
        project = "p1"
        gpus = 2
        submitted = 10
        running_on = ["n1"]
        [[jobs]]
        name = "e"
        project = "p2"
        tasks = 3
        min_tasks = 1
        gpus = 1
        submitted = 100
        """)
    assert gpus(sim, "p2") <= 1.5


@pytest.mark.parametrize("setting", ["over_quota = false", "over_quota_weight = 0"])
def test_queue_within_gpu_quota_is_not_reclaimed_for_cpus(setting):
    # Same as test_a_queue_at_its_quota_is_never_a_victim, with a setting that only limits surplus.
    sim = run(f"""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 2
        {setting}
        [[policy.projects]]
        name = "p2"
        gpu_quota = 2
        [[nodes]]
        name = "n1"
        gpus = 2
        [[jobs]]
        name = "x"
        count = 2
        project = "p1"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "y"
        count = 2
        project = "p2"
        gpus = 1
        submitted = 100
        """)
    assert evictions(sim) == []
    assert gpus(sim, "p1") == 2


def test_queue_at_quota_is_not_reclaimed_for_a_job_started_this_cycle():
    sim = run("""
        [[policy.projects]]
        name = "p2"
        gpu_quota = 1
        [[policy.projects]]
        name = "p3"
        gpu_quota = 1
        [[nodes]]
        name = "n1"
        gpus = 4
        [[jobs]]
        name = "old"
        project = "p2"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "big"
        project = "p2"
        gpus = 3
        submitted = 10
        [[jobs]]
        name = "gang"
        project = "p3"
        tasks = 2
        gpus = 2
        submitted = 5
        [[jobs]]
        name = "small"
        project = "p3"
        gpus = 1
        submitted = 20
        """)
    assert "old" not in sim.preempted
    assert gpus(sim, "p2") <= fair_share(sim, "p2")


OVER_QUOTA_ONLY_IN_ANOTHER_RESOURCE = """
    # Each project ends at exactly its GPU fair share (p1 5, p2 2) with n2's last GPU, and each is over
    # a quota the other's job does not touch: p1 over its CPU quota (c1 and c2), p2 over its memory
    # quota (pm). pc (GPU and CPU) may take that GPU only from a p1 job holding CPUs, m (GPU and
    # memory) only from a p2 job holding memory. Taking it from the GPU-and-memory job m, and m taking
    # it back from the GPU-and-CPU job pc, would repeat every cycle.
    [policy]
    over_quota_weights = false
    [[policy.projects]]
    name = "p1"
    gpu_quota = 5
    cpu_quota = 1
    memory_quota_gib = 1
    over_quota_weight = 0
    [[policy.projects]]
    name = "p2"
    gpu_quota = 2
    cpu_quota = 1
    memory_quota_gib = 1
    over_quota_weight = 0
    [[nodes]]
    name = "n1"
    gpus = 1
    cpus = 2
    memory_gib = 8
    [[nodes]]
    name = "n2"
    gpus = 5
    cpus = 2
    memory_gib = 8
    [[jobs]]
    name = "c1"
    project = "p1"
    gpus = 1
    cpus = 1
    memory_gib = 0
    [[jobs]]
    name = "pm"
    project = "p2"
    gpus = 1
    cpus = 0
    memory_gib = 2
    [[jobs]]
    name = "g"
    count = 2
    project = "p1"
    gpus = 1
    cpus = 0
    memory_gib = 0
    [[jobs]]
    name = "c2"
    project = "p1"
    gpus = 1
    cpus = 1
    memory_gib = 0
    [[jobs]]
    name = "m"
    project = "p1"
    gpus = 1
    cpus = 0
    memory_gib = 1
    [[jobs]]
    name = "pc"
    project = "p2"
    gpus = 1
    cpus = 1
    memory_gib = 0
"""


def test_reclaim_over_quota_takes_only_from_a_job_holding_the_resource_over_quota():
    sim = run("cycles = 4\n" + OVER_QUOTA_ONLY_IN_ANOTHER_RESOURCE)
    assert evictions(sim) == []
    assert sim.pending() == {"c2"}
    assert (gpus(sim, "p1"), gpus(sim, "p2")) == (4, 2)


OVER_ONLY_IN_ANOTHER_RESOURCE = """
    # Jobs that may not be evicted hold 2 GPUs of pa (fair share 1) and 60 GiB of pb (fair share 8).
    # pb's GPU job needs n1's idle GPU and the 4 CPUs pa's CPU-only job holds there: pa is over its
    # share only in GPUs, which that job does not hold, so it is no victim. Were it one, pb would be one
    # in turn for pa's job, over its share only in memory, which the GPU job does not hold, and the two
    # jobs would take n1 from each other every cycle.
    [[policy.projects]]
    name = "pa"
    gpu_quota = 1
    cpu_quota = 4
    memory_quota_gib = 8
    over_quota_weight = 0
    [[policy.projects]]
    name = "pb"
    gpu_quota = 1
    cpu_quota = 4
    memory_quota_gib = 8
    over_quota_weight = 0
    [[nodes]]
    name = "n1"
    gpus = 1
    cpus = 4
    memory_gib = 16
    [[nodes]]
    name = "n2"
    gpus = 2
    cpus = 4
    memory_gib = 60
    [[jobs]]
    name = "a"
    count = 2
    project = "pa"
    priority = "build"
    gpus = 1
    cpus = 0
    memory_gib = 0
    running_on = ["n2"]
    [[jobs]]
    name = "cpu"
    project = "pa"
    cpus = 4
    memory_gib = 4
    running_on = ["n1"]
    [[jobs]]
    name = "mem"
    project = "pb"
    priority = "build"
    cpus = 0
    memory_gib = 60
    running_on = ["n2"]
    [[jobs]]
    name = "gpu"
    project = "pb"
    gpus = 1
    cpus = 4
    memory_gib = 0
    submitted = 5
"""


def test_reclaim_takes_only_from_a_queue_over_in_a_resource_the_victim_holds():
    sim = run("cycles = 4\n" + OVER_ONLY_IN_ANOTHER_RESOURCE)
    assert evictions(sim) == []
    assert sim.pending() == {"gpu"}
    assert nodes_of(sim, "cpu") == ["n1"]


DEPARTMENT_QUOTA_OVER_THE_POOL = """
    # The implicit department's quota, 7 GPUs, is more than the pool's 6. Were the surplus its projects
    # share out 7 less their quotas, p2 (quota 0) would get 3 GPUs that do not exist, reclaim for j0
    # from p1, leaving p1 below its quota with the gang, and p1 would take it back, every cycle.
    [[policy.projects]]
    name = "p1"
    gpu_quota = 2
    cpu_quota = 1
    memory_quota_gib = 1
    over_quota_weight = 0
    [[policy.projects]]
    name = "p2"
    cpu_quota = 1
    memory_quota_gib = 1
    [[policy.projects]]
    name = "p3"
    gpu_quota = 5
    cpu_quota = 1
    memory_quota_gib = 1
    over_quota_weight = 0
    [[nodes]]
    name = "n1"
    gpus = 6
    cpus = 2
    memory_gib = 8
    [[jobs]]
    name = "j0"
    project = "p2"
    gpus = 3
    cpus = 0
    memory_gib = 0
    [[jobs]]
    name = "j1"
    project = "p1"
    gpus = 1
    cpus = 0
    memory_gib = 0
    [[jobs]]
    name = "j2"
    project = "p1"
    gpus = 1
    cpus = 0
    memory_gib = 0
    submitted = 1
    [[jobs]]
    name = "j3"
    project = "p1"
    tasks = 2
    gpus = 1
    cpus = 0
    memory_gib = 0
    [[jobs]]
    name = "j4"
    project = "p1"
    count = 3
    gpus = 1
    cpus = 0
    memory_gib = 0
    [[jobs]]
    name = "j7"
    project = "p3"
    tasks = 2
    gpus = 1
    cpus = 0
    memory_gib = 0
"""


def test_a_department_quota_over_the_pool_shares_out_only_the_pool():
    sim = run("cycles = 4\n" + DEPARTMENT_QUOTA_OVER_THE_POOL)
    assert evictions(sim) == []
    assert fair_share(sim, "p2") == pytest.approx(2)  # the pool's 6 GPUs less p1's and p3's quotas (2 each)
    assert "j0" in sim.pending()


def test_reclaim_compares_departments_first():
    # Both departments sit at their fair share (4). Inside each, one project holds everything. p1 may
    # reclaim only from p2 (same department) and p4 only from p3, though p3's jobs are the most recent.
    sim = run("""
        [[policy.departments]]
        name = "D1"
        [[policy.departments]]
        name = "D2"
        [[policy.projects]]
        name = "p1"
        department = "D1"
        [[policy.projects]]
        name = "p2"
        department = "D1"
        [[policy.projects]]
        name = "p3"
        department = "D2"
        [[policy.projects]]
        name = "p4"
        department = "D2"
        [[nodes]]
        name = "n1"
        gpus = 8
        [[jobs]]
        name = "old"
        count = 4
        project = "p2"
        gpus = 1
        submitted = 0
        running_on = ["n1"]
        [[jobs]]
        name = "new"
        count = 4
        project = "p3"
        gpus = 1
        submitted = 50
        running_on = ["n1"]
        [[jobs]]
        name = "a"
        count = 2
        project = "p1"
        gpus = 1
        submitted = 100
        [[jobs]]
        name = "b"
        count = 2
        project = "p4"
        gpus = 1
        submitted = 100
        """)
    project = {j.id: j.project for j in sim.snapshot.jobs}
    pairs = {(project[e.for_job], project[e.job]) for e in evictions(sim)}
    assert pairs == {("p1", "p2"), ("p4", "p3")}
    assert [gpus(sim, p) for p in ("p1", "p2", "p3", "p4")] == [2, 2, 2, 2]


def test_reclaim_across_departments_names_both_levels():
    sim = run("""
        [[policy.departments]]
        name = "D1"
        [[policy.departments]]
        name = "D2"
        [[policy.projects]]
        name = "p1"
        department = "D1"
        [[policy.projects]]
        name = "p2"
        department = "D2"
        [[nodes]]
        name = "n1"
        gpus = 4
        [[jobs]]
        name = "x"
        count = 4
        project = "p1"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "y"
        count = 2
        project = "p2"
        gpus = 1
        submitted = 100
        """)
    assert (gpus(sim, "p1"), gpus(sim, "p2")) == (2, 2)
    first = evictions(sim)[0]
    assert [(o.kind, o.name, o.fair) for o in first.why.over] == [("department", "D1", True), ("project", "p1", True)]
    assert "department D1" in eviction_text(first.why) and "project p1" in eviction_text(first.why)


# --- preemption -----------------------------------------------------------------------------------

BUILD_JOB_AMONG_TRAINING = """
    # p1 fills n1 with four training jobs; a build job of p1 waits.
    [[policy.projects]]
    name = "p1"
    gpu_quota = 4
    [[nodes]]
    name = "n1"
    gpus = 4
    [[jobs]]
    name = "t"
    count = 4
    project = "p1"
    gpus = 1
    running_on = ["n1"]
    [[jobs]]
    name = "ws"
    project = "p1"
    priority = "build"
    gpus = 1
    submitted = 100
"""


def test_higher_priority_job_preempts_the_most_recent_lower_priority_job_of_its_project():
    sim = run(BUILD_JOB_AMONG_TRAINING)
    assert sim.preempted == {"t-4"}
    assert "ws" in sim.running()
    (eviction,) = evictions(sim)
    assert eviction.rule == "preempt" and eviction.for_job == "ws"


def test_preemption_frees_a_node_the_job_may_use_past_victims_on_nodes_it_may_not():
    # The nodes differ only in their labels; the most recent victims run on n1, which the job may not use.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 4
        [[nodes]]
        name = "n1"
        gpus = 2
        labels = { kind = "a" }
        [[nodes]]
        name = "n2"
        gpus = 2
        labels = { kind = "b" }
        [[jobs]]
        name = "old"
        count = 2
        project = "p1"
        gpus = 1
        submitted = 0
        running_on = ["n2"]
        [[jobs]]
        name = "new"
        count = 2
        project = "p1"
        gpus = 1
        submitted = 50
        running_on = ["n1"]
        [[jobs]]
        name = "ws"
        project = "p1"
        priority = "build"
        gpus = 1
        node_selector = { kind = "b" }
        submitted = 100
        """)
    assert len(sim.preempted) == 1 and sim.preempted <= {"old-1", "old-2"}
    assert nodes_of(sim, "ws") == ["n2"]


class OldestFirst:
    """A job order that ignores priority (oldest first): a queue's groups then come in no order of priority."""

    @hookimpl
    def gpud_job_order_key(self, job):
        return (job.submitted, job.id)


def test_a_job_order_without_priority_first_still_lets_the_higher_priority_job_preempt():
    # The old job comes first in the queue's order but outranks no victim; the build job comes after
    # it and outranks them. Which jobs may preempt follows their priority, whatever the job order.
    text = BUILD_JOB_AMONG_TRAINING + """
    [[jobs]]
    name = "old"
    project = "p1"
    gpus = 1
    submitted = 10
"""
    pm = make_plugin_manager(disable=["job_order"])
    pm.register(OldestFirst(), name="oldest-first")
    sim = simulate(scenario(text), pm)
    assert sim.preempted == {"t-4"} and "ws" in sim.running() and "old" not in sim.running()
    assert run(text).preempted == {"t-4"}  # the built-in order: the same preemption


def test_priority_means_nothing_across_projects():
    # p1 and p2 are at their fair share. p1's urgent job may only preempt p1's own training job.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        [[policy.projects]]
        name = "p2"
        [[nodes]]
        name = "n1"
        gpus = 4
        [[jobs]]
        name = "mine"
        count = 2
        project = "p1"
        gpus = 1
        submitted = 0
        running_on = ["n1"]
        [[jobs]]
        name = "theirs"
        count = 2
        project = "p2"
        priority = 10
        gpus = 1
        submitted = 50
        running_on = ["n1"]
        [[jobs]]
        name = "urgent"
        project = "p1"
        priority = "interactive-preemptible"
        gpus = 1
        submitted = 100
        """)
    assert evicted_jobs(sim) == {"mine-2"}
    assert gpus(sim, "p2") == 2


PREEMPTOR_OVER_FAIR_SHARE = """
    # p1 runs "low" (2 CPUs) and p2 "theirs" (4 CPUs) on a node of %d CPUs; both projects want more.
    # p1's "urgent" (%d CPUs) may evict "low" only if p1 then stays within its CPU fair share.
    [[policy.projects]]
    name = "p1"
    gpu_quota = 1
    cpu_quota = 4
    [[policy.projects]]
    name = "p2"
    gpu_quota = 1
    cpu_quota = 4
    [[nodes]]
    name = "n1"
    gpus = 2
    cpus = %d
    [[jobs]]
    name = "low"
    project = "p1"
    gpus = 1
    cpus = 2
    running_on = ["n1"]
    [[jobs]]
    name = "theirs"
    project = "p2"
    gpus = 1
    cpus = 4
    running_on = ["n1"]
    [[jobs]]
    name = "more"
    project = "p2"
    gpus = 0
    cpus = 4
    submitted = 50
    [[jobs]]
    name = "urgent"
    project = "p1"
    priority = "interactive-preemptible"
    gpus = 1
    cpus = %d
    submitted = 100
"""


def test_preemption_within_the_fair_share_goes_ahead():
    # 8 CPUs: p1's CPU fair share is its quota, 4; urgent takes p1 from 2 to 4 CPUs.
    sim = run(PREEMPTOR_OVER_FAIR_SHARE % (8, 4, 8, 4))
    assert evicted_jobs(sim, "preempt") == {"low"} and "urgent" in sim.running()


def test_preemption_never_takes_the_project_over_its_fair_share():
    # 9 CPUs: p1's CPU fair share is 4.5; urgent would take p1 to 5 CPUs, so "low" stays.
    sim = run(PREEMPTOR_OVER_FAIR_SHARE % (9, 5, 9, 5))
    assert evictions(sim) == [] and sim.running() == {"low", "theirs"}
    assert reason(sim, "urgent").endswith(
        "preempting lower-priority jobs cannot keep project p1 within its fair share "
        "(it holds 1/1 GPUs, 2/4.5 CPUs; the job needs 1 GPU, 5 CPUs)")


def test_a_refusal_read_after_the_next_cycle_gives_the_numbers_of_its_own_cycle():
    # Reasons are worded when read, and a plan may be read while the next cycle runs: the words
    # must still give what p1 held when "urgent" was refused, not what it holds after "low" is gone.
    sc = scenario(PREEMPTOR_OVER_FAIR_SHARE % (9, 5, 9, 5))
    scheduler = Scheduler(sc.snapshot, sc.policy, make_plugin_manager())
    refused = scheduler.cycle()
    scheduler.finish("low")
    after = scheduler.cycle()
    assert [b.job for b in after.binds] == ["urgent"]
    assert pending_texts(refused)["urgent"].endswith(
        "preempting lower-priority jobs cannot keep project p1 within its fair share "
        "(it holds 1/1 GPUs, 2/4.5 CPUs; the job needs 1 GPU, 5 CPUs)")


def test_each_job_refused_by_the_fair_share_says_so_and_a_smaller_one_still_preempts():
    # p1 and p2 sit at their fair share (4 GPUs each) on two nodes; p1's low-priority jobs hold 2 GPUs
    # on each. "big" (3 GPUs) and "narrow" (3 GPUs, fewer CPUs, so not judged with "big") could only
    # run by freeing 3 GPUs of p1 on one node: both wait and say why, "narrow" without a try (nothing
    # of p1 changed since "big" failed). "small" (1 GPU, but more CPUs than "big": only the GPUs were
    # short) evicts one low job.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 4
        [[policy.projects]]
        name = "p2"
        gpu_quota = 4
        [[nodes]]
        name = "n1"
        gpus = 4
        cpus = 64
        [[nodes]]
        name = "n2"
        gpus = 4
        cpus = 64
        [[jobs]]
        name = "low1"
        count = 2
        project = "p1"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "low2"
        count = 2
        project = "p1"
        gpus = 1
        running_on = ["n2"]
        [[jobs]]
        name = "theirs1"
        count = 2
        project = "p2"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "theirs2"
        count = 2
        project = "p2"
        gpus = 1
        running_on = ["n2"]
        [[jobs]]
        name = "more"
        project = "p2"
        gpus = 1
        submitted = 50
        [[jobs]]
        name = "big"
        project = "p1"
        priority = "interactive-preemptible"
        gpus = 3
        cpus = 4
        submitted = 100
        [[jobs]]
        name = "narrow"
        project = "p1"
        priority = "interactive-preemptible"
        gpus = 3
        cpus = 2
        submitted = 110
        [[jobs]]
        name = "small"
        project = "p1"
        priority = "interactive-preemptible"
        gpus = 1
        cpus = 8
        submitted = 120
        """)
    assert "small" in sim.running() and len(evicted_jobs(sim, "preempt")) == 1
    for job_id in ("big", "narrow"):
        assert reason(sim, job_id).endswith(
            "preempting lower-priority jobs cannot keep project p1 within its fair share "
            "(it holds 4/4 GPUs; the job needs 3 GPUs)"), reason(sim, job_id)


def test_preemption_evicts_as_many_jobs_as_the_fair_share_takes():
    # Evicting low-b alone makes room for urgent, but p1 would then hold 8 CPUs against its fair
    # share of 6: low-a goes too, and neither comes back.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 2
        cpu_quota = 6
        [[policy.projects]]
        name = "p2"
        gpu_quota = 2
        cpu_quota = 10
        [[nodes]]
        name = "n1"
        gpus = 4
        cpus = 16
        [[jobs]]
        name = "low-a"
        project = "p1"
        gpus = 1
        cpus = 3
        memory_gib = 0
        submitted = 0
        running_on = ["n1"]
        [[jobs]]
        name = "low-b"
        project = "p1"
        gpus = 0
        cpus = 3
        memory_gib = 0
        submitted = 10
        running_on = ["n1"]
        [[jobs]]
        name = "theirs"
        project = "p2"
        gpus = 2
        cpus = 6
        memory_gib = 0
        running_on = ["n1"]
        [[jobs]]
        name = "more"
        project = "p2"
        gpus = 2
        cpus = 6
        memory_gib = 0
        [[jobs]]
        name = "urgent"
        project = "p1"
        priority = "interactive-preemptible"
        gpus = 1
        cpus = 5
        memory_gib = 0
        submitted = 100
        """)
    assert evicted_jobs(sim, "preempt") == {"low-a", "low-b"}
    assert sim.running() == {"urgent", "theirs"}
    assert queue(sim, "p1").allocated.cpu == 5


def test_preemption_over_the_fair_share_may_swap_like_for_like():
    # p1 runs 4 one-GPU jobs, over its fair share of 2: p2's 3-GPU build job wants the other 2 but,
    # non-preemptible, may not go over p2's quota to take them. p1's urgent job takes the place of
    # one of p1's jobs: p1 holds no more than before.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 2
        [[policy.projects]]
        name = "p2"
        gpu_quota = 2
        [[nodes]]
        name = "n1"
        gpus = 4
        [[jobs]]
        name = "t"
        count = 4
        project = "p1"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "big"
        project = "p2"
        priority = "build"
        gpus = 3
        [[jobs]]
        name = "urgent"
        project = "p1"
        priority = "interactive-preemptible"
        gpus = 1
        submitted = 100
        """)
    assert fair_share(sim, "p1") == 2
    assert evicted_jobs(sim, "preempt") == {"t-4"} and "urgent" in sim.running()


def test_non_preemptible_jobs_are_never_evicted():
    # p1's build jobs hold its quota; p2 deserves 2 and may reclaim only p1's training jobs; p1's own
    # inference job cannot preempt the build jobs either.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 2
        [[policy.projects]]
        name = "p2"
        gpu_quota = 2
        [[nodes]]
        name = "n1"
        gpus = 4
        [[jobs]]
        name = "keep"
        count = 2
        project = "p1"
        priority = "build"
        gpus = 1
        submitted = 50
        running_on = ["n1"]
        [[jobs]]
        name = "t"
        count = 2
        project = "p1"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "y"
        count = 2
        project = "p2"
        gpus = 1
        submitted = 100
        [[jobs]]
        name = "inf"
        project = "p1"
        priority = "inference"
        gpus = 1
        submitted = 100
        """)
    assert {"keep-1", "keep-2"} <= sim.running()
    assert evicted_jobs(sim) == {"t-1", "t-2"}
    assert gpus(sim, "p2") == 2


@pytest.mark.parametrize("quota, outcome", [(1, "preempts"), (0, "waits")])
def test_non_preemptible_preemptor_must_fit_its_quota(quota, outcome):
    sim = run(f"""
        [[policy.projects]]
        name = "p1"
        gpu_quota = {quota}
        [[nodes]]
        name = "n1"
        gpus = 1
        [[jobs]]
        name = "t"
        project = "p1"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "ws"
        project = "p1"
        priority = "build"
        gpus = 1
        submitted = 100
        """)
    if outcome == "preempts":
        assert sim.running() == {"ws"} and sim.preempted == {"t"}
    else:
        assert sim.running() == {"t"} and evictions(sim) == []
        assert "non-preemptible" in reason(sim, "ws")


def test_a_non_preemptible_job_over_quota_in_gpus_does_not_hold_back_one_within_it_asking_more_cpus():
    # Quota 2 GPUs. "wide" (3 GPUs) would take p1's non-preemptible jobs over it and waits; "narrow"
    # asks one GPU and more CPUs than "wide": only GPUs were over quota, so it preempts a training job.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 2
        [[nodes]]
        name = "n1"
        gpus = 4
        cpus = 64
        [[jobs]]
        name = "t"
        count = 4
        project = "p1"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "wide"
        project = "p1"
        priority = "build"
        gpus = 3
        cpus = 2
        submitted = 100
        [[jobs]]
        name = "narrow"
        project = "p1"
        priority = "build"
        gpus = 1
        cpus = 8
        submitted = 110
        """)
    assert sim.pending() & {"wide", "narrow"} == {"wide"}
    assert len(sim.preempted) == 1
    assert "non-preemptible" in reason(sim, "wide")


def test_elastic_non_preemptible_preemptor_stays_within_quota():
    # Quota 2: the inference job may hold at most 2 GPUs however many training GPUs it could free.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 2
        [[nodes]]
        name = "n1"
        gpus = 4
        [[jobs]]
        name = "t"
        count = 4
        project = "p1"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "inf"
        project = "p1"
        priority = "inference"
        tasks = 4
        min_tasks = 1
        gpus = 1
        submitted = 100
        """)
    assert 1 <= job(sim, "inf").running_tasks <= 2


def test_an_elastic_job_at_its_minimum_grows_by_preempting_lower_priority_jobs_of_its_project():
    # The elastic job starts with its one task on the free GPU; its project's training jobs fill the
    # rest. As a pending job of its priority would, it takes their GPUs for its other tasks.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 4
        [[nodes]]
        name = "n1"
        gpus = 4
        [[jobs]]
        name = "e"
        project = "p1"
        priority = 75
        tasks = 3
        min_tasks = 1
        gpus = 1
        submitted = 100
        [[jobs]]
        name = "t"
        count = 3
        project = "p1"
        gpus = 1
        submitted = 0
        running_on = ["n1"]
        """)
    assert job(sim, "e").running_tasks == 3
    assert sim.preempted == {"t-2", "t-3"}
    assert {e.for_job for e in evictions(sim, "preempt")} == {"e"}


# --- consolidation --------------------------------------------------------------------------------

def test_consolidation_moves_as_few_jobs_as_possible():
    # n1 has 3 of 4 GPUs taken by a-1..a-3, n2 one by b: moving b (1 move) beats moving the a's (3 moves).
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 8
        [[nodes]]
        name = "n1"
        gpus = 4
        [[nodes]]
        name = "n2"
        gpus = 4
        [[jobs]]
        name = "a"
        count = 3
        project = "p1"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "b"
        project = "p1"
        gpus = 1
        running_on = ["n2"]
        [[jobs]]
        name = "big"
        project = "p1"
        gpus = 4
        submitted = 100
        """)
    (move,) = evictions(sim)
    assert move.job == "b" and move.moved and move.rule == "consolidate"
    assert nodes_of(sim, "b") == ["n1"] and nodes_of(sim, "big") == ["n2"]
    assert sim.pending() == set()


@pytest.mark.parametrize("cpus", [
    # Two halves on two GPUs leave one GPU's worth free but no whole GPU: one half moves next to the other.
    (1, 1, 1),
    # The halves hold 54 of 64 CPUs: neither fits anywhere else as things stand (10 CPUs free). Moving one
    # frees its GPU and its CPUs; "whole" takes the GPU and 5 CPUs, and the half fits beside the other.
    (40, 14, 5),
])
def test_consolidation_gathers_scattered_fractions_to_free_a_whole_gpu(cpus):
    a, b, whole = cpus
    sim = run(f"""
        [policy]
        gpu_placement = "spread"
        [[policy.projects]]
        name = "p1"
        gpu_quota = 2
        [[nodes]]
        name = "n1"
        gpus = 2
        cpus = 64
        [[jobs]]
        name = "a"
        project = "p1"
        gpus = 0.5
        cpus = {a}
        running_on = ["n1"]
        gpu_index = [[0]]
        [[jobs]]
        name = "b"
        project = "p1"
        gpus = 0.5
        cpus = {b}
        running_on = ["n1"]
        gpu_index = [[1]]
        [[jobs]]
        name = "whole"
        project = "p1"
        gpus = 1
        cpus = {whole}
        submitted = 100
        """)
    assert sim.running() == {"a", "b", "whole"}
    (move,) = evictions(sim)
    assert move.moved and move.rule == "consolidate"
    stayed = ({"a", "b"} - {move.job}).pop()
    assert job(sim, move.job).task_placement(0).gpu_index == job(sim, stayed).task_placement(0).gpu_index
    assert job(sim, "whole").task_placement(0).gpu_index != job(sim, stayed).task_placement(0).gpu_index


def test_consolidation_does_nothing_when_a_moved_job_could_not_be_placed_again():
    # Clearing n2 for big means moving b (2 GPUs); no other node has 2 free GPUs, so nothing moves.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 12
        [[nodes]]
        name = "n1"
        gpus = 4
        [[nodes]]
        name = "n2"
        gpus = 4
        [[nodes]]
        name = "n3"
        gpus = 4
        [[jobs]]
        name = "fixed1"
        project = "p1"
        priority = "build"
        gpus = 3
        running_on = ["n1"]
        [[jobs]]
        name = "b"
        project = "p1"
        gpus = 2
        running_on = ["n2"]
        [[jobs]]
        name = "fixed3"
        project = "p1"
        priority = "build"
        gpus = 3
        running_on = ["n3"]
        [[jobs]]
        name = "big"
        project = "p1"
        gpus = 4
        submitted = 100
        """)
    assert evictions(sim) == []
    assert nodes_of(sim, "b") == ["n2"]
    assert sim.pending() == {"big"}
    assert "fragmented" in reason(sim, "big")


# --- gangs ----------------------------------------------------------------------------------------

def test_evicting_below_a_gangs_minimum_evicts_the_whole_gang():
    sim = run("""
        [[policy.projects]]
        name = "p1"
        [[policy.projects]]
        name = "p2"
        [[nodes]]
        name = "n1"
        gpus = 4
        [[jobs]]
        name = "g"
        project = "p1"
        tasks = 2
        gpus = 2
        running_on = ["n1", "n1"]
        [[jobs]]
        name = "y"
        project = "p2"
        gpus = 2
        submitted = 100
        """)
    assert job(sim, "g").running_tasks == 0
    assert sim.preempted == {"g"}
    assert sorted(t for e in evictions(sim) for t in e.tasks) == [0, 1]
    assert nodes_of(sim, "y") == ["n1"]


@pytest.mark.parametrize("reclaimers, left", [(1, 3), (2, 2), (3, 2)])
def test_elastic_gang_loses_tasks_above_its_minimum_one_at_a_time_and_keeps_running(reclaimers, left):
    # g holds all 4 GPUs; p2 deserves 2. Each reclaimer takes one task; the gang never drops below 2.
    sim = run(f"""
        [[policy.projects]]
        name = "p1"
        [[policy.projects]]
        name = "p2"
        [[nodes]]
        name = "n1"
        gpus = 4
        [[jobs]]
        name = "g"
        project = "p1"
        tasks = 4
        min_tasks = 2
        gpus = 1
        running_on = ["n1", "n1", "n1", "n1"]
        [[jobs]]
        name = "y"
        count = {reclaimers}
        project = "p2"
        gpus = 1
        submitted = 100
        [expect]
        running_tasks = {{ g = {left} }}
        preempted = []
        """)
    (eviction,) = evictions(sim)
    assert eviction.job == "g" and not eviction.moved and len(eviction.tasks) == 4 - left
    assert gpus(sim, "p2") == 4 - left


# --- minimum run time -----------------------------------------------------------------------------

def test_min_runtime_protects_young_jobs():
    # Victim order would take the most recent (b-3, b-4); they ran 100 s of the 600 s minimum.
    sim = run("""
        now = 1000
        [policy]
        min_runtime = 600
        [[policy.projects]]
        name = "bob"
        [[policy.projects]]
        name = "alice"
        [[nodes]]
        name = "n1"
        gpus = 4
        [[jobs]]
        name = "old"
        count = 2
        project = "bob"
        gpus = 1
        started = 0
        running_on = ["n1"]
        [[jobs]]
        name = "young"
        count = 2
        project = "bob"
        gpus = 1
        submitted = 900
        started = 900
        running_on = ["n1"]
        [[jobs]]
        name = "a"
        count = 2
        project = "alice"
        gpus = 1
        submitted = 950
        """)
    assert sim.preempted == {"old-1", "old-2"}
    assert {"young-1", "young-2", "a-1", "a-2"} == sim.running()


def test_min_runtime_can_leave_the_reclaimer_waiting():
    sim = run("""
        now = 1000
        [policy]
        min_runtime = 600
        [[policy.projects]]
        name = "bob"
        [[policy.projects]]
        name = "alice"
        [[nodes]]
        name = "n1"
        gpus = 2
        [[jobs]]
        name = "young"
        count = 2
        project = "bob"
        gpus = 1
        submitted = 900
        running_on = ["n1"]
        [[jobs]]
        name = "a"
        project = "alice"
        gpus = 1
        submitted = 950
        """)
    assert evictions(sim) == []
    assert sim.pending() == {"a"}


# --- reasons --------------------------------------------------------------------------------------

def test_reclaim_reason_names_the_rule_the_queue_and_the_numbers():
    sim = run(RECLAIM_OVER_FAIR_SHARE_FIRST)
    reasons = {e.job: eviction_text(e.why) for e in evictions(sim)}
    assert reasons["x-7"].startswith("reclaim: project p1 7/5 GPUs over fair share")
    assert "for job z-1 of project p3" in reasons["x-7"]
    assert reasons["x-6"].startswith("reclaim: project p1 6/5 GPUs over fair share")


def test_reclaim_reason_names_the_resource_the_queue_is_over_in():
    # p1 holds all 8 CPUs (quota 2, fair share 4) and no GPU; p2's CPU-only job takes 4 back.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        cpu_quota = 2
        [[policy.projects]]
        name = "p2"
        cpu_quota = 4
        [[nodes]]
        name = "n1"
        gpus = 0
        cpus = 8
        [[jobs]]
        name = "x"
        count = 4
        project = "p1"
        cpus = 2
        running_on = ["n1"]
        [[jobs]]
        name = "y"
        project = "p2"
        cpus = 4
        submitted = 100
        """)
    reasons = {e.job: eviction_text(e.why) for e in evictions(sim, "reclaim")}
    assert reasons == {"x-4": "reclaim: project p1 8/4 CPUs over fair share; for job y of project p2 4/4 CPUs",
                       "x-3": "reclaim: project p1 6/4 CPUs over fair share; for job y of project p2 4/4 CPUs"}


def test_preempt_reason_names_both_jobs_and_priorities():
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 1
        [[nodes]]
        name = "n1"
        gpus = 1
        [[jobs]]
        name = "t"
        project = "p1"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "ws"
        project = "p1"
        priority = "build"
        gpus = 1
        submitted = 100
        """)
    (eviction,) = evictions(sim)
    assert eviction_text(eviction.why) == "preempt: job ws (priority 100) of project p1 outranks job t (priority 50)"


# --- stability ------------------------------------------------------------------------------------

STABLE_CASES = {
    "reclaim": RECLAIM_OVER_FAIR_SHARE_FIRST,
    "over-quota reclaim": OVER_QUOTA_ONLY.format(p1_quota=0, p3_quota=2),
    "over quota only in another resource": OVER_QUOTA_ONLY_IN_ANOTHER_RESOURCE,
    "over only in another resource": OVER_ONLY_IN_ANOTHER_RESOURCE,
    "department quota over the pool": DEPARTMENT_QUOTA_OVER_THE_POOL,
    "elastic gang": """
        [[policy.projects]]
        name = "p1"
        [[policy.projects]]
        name = "p2"
        [[nodes]]
        name = "n1"
        gpus = 5
        [[jobs]]
        name = "g"
        project = "p1"
        tasks = 4
        min_tasks = 2
        gpus = 1
        running_on = ["n1", "n1", "n1", "n1"]
        [[jobs]]
        name = "y"
        count = 3
        project = "p2"
        gpus = 1
        submitted = 100
    """,
    "fractional shares": """
        [[policy.projects]]
        name = "p1"
        [[policy.projects]]
        name = "p2"
        [[policy.projects]]
        name = "p3"
        [[nodes]]
        name = "n1"
        gpus = 4
        [[jobs]]
        name = "x"
        count = 4
        project = "p1"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "y"
        count = 4
        project = "p2"
        gpus = 0.5
        submitted = 100
        [[jobs]]
        name = "z"
        count = 4
        project = "p3"
        gpus = 1
        submitted = 200
    """,
}


@pytest.mark.parametrize("text", list(STABLE_CASES.values()), ids=list(STABLE_CASES.keys()))
def test_after_convergence_further_cycles_change_nothing(text):
    sc = scenario("cycles = 3\nstable_cycles = 5\n" + text)
    sim = simulate(sc, make_plugin_manager())
    assert len(sim.plans) == 8
    for number, plan in enumerate(sim.plans[3:], start=4):
        assert plan.binds == () and plan.evictions == (), f"cycle {number} changed something: {plan}"


RECLAIMED_THEN_PREEMPTED = """
    # p1's j0 reclaims the GPU from p2's j2 (p2 is over its 2-CPU quota). Were preemption to give
    # the room to p1's higher-priority gang j6, 12 CPUs against p1's CPU fair share of 11, j2 would
    # reclaim the gang at the next cycle, j0 the GPU the cycle after, and so on.
    [policy]
    over_quota_weights = false
    min_runtime = 0
    [[policy.projects]]
    name = "p1"
    gpu_quota = 1
    cpu_quota = 1
    memory_quota_gib = 1
    over_quota_weight = 0
    [[policy.projects]]
    name = "p2"
    gpu_quota = 1
    cpu_quota = 2
    memory_quota_gib = 1
    over_quota_weight = 0
    [[nodes]]
    name = "n1"
    gpus = 1
    gpu_memory_gib = 40
    cpus = 27
    memory_gib = 8
    [[jobs]]
    name = "j0"
    project = "p1"
    gpus = 1
    cpus = 1
    memory_gib = 0
    [[jobs]]
    name = "j1"
    project = "p1"
    gpus = 1
    cpus = 0
    memory_gib = 0
    [[jobs]]
    name = "j2"
    project = "p2"
    gpus = 1
    cpus = 1
    memory_gib = 0
    [[jobs]]
    name = "j3"
    project = "p1"
    count = 2
    gpus = 1
    cpus = 0
    memory_gib = 0
    [[jobs]]
    name = "j5"
    project = "p2"
    tasks = 3
    min_tasks = 1
    gpus = 0
    cpus = 5
    memory_gib = 0
    [[jobs]]
    name = "j6"
    project = "p1"
    tasks = 3
    gpus = 0.25
    cpus = 4
    memory_gib = 0
    priority = "interactive-preemptible"
"""


def test_what_reclaim_freed_is_not_preempted_over_the_fair_share():
    sim = simulate(scenario("cycles = 3\nstable_cycles = 5\n" + RECLAIMED_THEN_PREEMPTED), make_plugin_manager())
    for number, plan in enumerate(sim.plans[3:], start=4):
        assert plan.binds == () and plan.evictions == (), f"cycle {number} changed something: {plan}"
