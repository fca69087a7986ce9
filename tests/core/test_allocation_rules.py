"""Allocation: one test per rule of DESIGN.md "Scheduling semantics" items 2, 3 and 8.

Each scenario is built so that its outcome would differ if the rule were broken.
"""

from __future__ import annotations

import re

import pytest

from sched_helpers import evictions, gpu_index, gpus, job, nodes_of, reason, run
from gpud.reasons import pending_texts


# --- order ----------------------------------------------------------------------------------------

def test_most_deprived_queue_is_served_first():
    # 3 GPUs, four projects: fair share 0.75 each, so no reclaim can repair a wrong order. A already
    # holds a GPU and submitted first; the two free GPUs go to B and C, which hold nothing.
    sim = run("""
        [[policy.projects]]
        name = "A"
        [[policy.projects]]
        name = "B"
        [[policy.projects]]
        name = "C"
        [[policy.projects]]
        name = "D"
        [[nodes]]
        name = "n1"
        gpus = 3
        [[jobs]]
        name = "a0"
        project = "A"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "a"
        project = "A"
        count = 2
        gpus = 1
        submitted = 0
        [[jobs]]
        name = "b"
        project = "B"
        count = 2
        gpus = 1
        submitted = 10
        [[jobs]]
        name = "c"
        project = "C"
        count = 2
        gpus = 1
        submitted = 20
        [[jobs]]
        name = "d"
        project = "D"
        count = 2
        gpus = 1
        submitted = 30
        """)
    assert [gpus(sim, p) for p in "ABCD"] == [1, 1, 1, 0]
    assert evictions(sim) == []


def test_inside_a_queue_higher_priority_runs_first():
    # Non-preemptible jobs, so preemption cannot repair a wrong order: one GPU of quota, two jobs.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 1
        [[nodes]]
        name = "n1"
        gpus = 1
        [[jobs]]
        name = "early"
        project = "p1"
        priority = "build"
        gpus = 1
        submitted = 0
        [[jobs]]
        name = "urgent"
        project = "p1"
        priority = "inference"
        gpus = 1
        submitted = 50
        """)
    assert sim.running() == {"urgent"}
    assert sim.pending() == {"early"}


def test_inside_a_queue_equal_priority_runs_in_submit_order():
    # "second" is listed first in the file but was submitted later.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 1
        [[nodes]]
        name = "n1"
        gpus = 1
        [[jobs]]
        name = "second"
        project = "p1"
        priority = "build"
        gpus = 1
        submitted = 20
        [[jobs]]
        name = "first"
        project = "p1"
        priority = "build"
        gpus = 1
        submitted = 10
        """)
    assert sim.running() == {"first"}


def test_bulk_high_priority_submission_does_not_monopolize():
    sim = run("""
        [[policy.projects]]
        name = "bob"
        [[policy.projects]]
        name = "alice"
        [[nodes]]
        name = "n1"
        gpus = 8
        [[jobs]]
        name = "b"
        count = 40
        project = "bob"
        priority = 90
        gpus = 1
        submitted = 0
        [[jobs]]
        name = "a"
        count = 10
        project = "alice"
        gpus = 1
        submitted = 500
        """)
    assert (gpus(sim, "bob"), gpus(sim, "alice")) == (4, 4)


def test_high_priority_submission_never_takes_gpus_from_another_project():
    # Both projects sit at their fair share; bob's new urgent jobs wait instead of evicting alice.
    sim = run("""
        [[policy.projects]]
        name = "bob"
        [[policy.projects]]
        name = "alice"
        [[nodes]]
        name = "n1"
        gpus = 8
        [[jobs]]
        name = "b"
        count = 4
        project = "bob"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "a"
        count = 4
        project = "alice"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "urgent"
        count = 10
        project = "bob"
        priority = "interactive-preemptible"
        gpus = 1
        submitted = 1000
        """)
    assert gpus(sim, "alice") == 4
    assert not any(e.job.startswith("a-") for e in evictions(sim))


# --- gangs ----------------------------------------------------------------------------------------

GANG_CLUSTER = """
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
    name = "fill1"
    project = "p1"
    priority = "build"
    gpus = 3
    running_on = ["n1"]
    [[jobs]]
    name = "fill2"
    project = "p1"
    priority = "build"
    gpus = 3
    running_on = ["n2"]
"""


def test_gang_starts_all_tasks_or_none():
    # 2 GPUs are free (one per node), so one task of 2 GPUs could never fit; neither may start alone.
    sim = run(GANG_CLUSTER + """
        [[jobs]]
        name = "g"
        project = "p1"
        tasks = 2
        gpus = 2
        """)
    assert job(sim, "g").running_tasks == 0
    assert all(b.job != "g" for plan in sim.plans for b in plan.binds)


def test_gang_that_fits_starts_whole_across_nodes():
    sim = run(GANG_CLUSTER + """
        [[jobs]]
        name = "g"
        project = "p1"
        tasks = 2
        gpus = 1
        """)
    assert sorted(nodes_of(sim, "g")) == ["n1", "n2"]


def test_gang_waits_while_only_some_of_its_tasks_fit():
    sim = run(GANG_CLUSTER + """
        [[jobs]]
        name = "g"
        project = "p1"
        tasks = 3
        gpus = 1
        """)
    assert job(sim, "g").running_tasks == 0
    assert "needs 3" in reason(sim, "g")


def test_elastic_gang_starts_with_what_fits_above_min_tasks():
    sim = run(GANG_CLUSTER + """
        [[jobs]]
        name = "g"
        project = "p1"
        tasks = 4
        min_tasks = 2
        gpus = 1
        [expect]
        running_tasks = { g = 2 }
        """)
    assert job(sim, "g").running_tasks == 2


def test_elastic_gang_does_not_start_below_min_tasks():
    sim = run(GANG_CLUSTER + """
        [[jobs]]
        name = "g"
        project = "p1"
        tasks = 4
        min_tasks = 3
        gpus = 1
        """)
    assert job(sim, "g").running_tasks == 0


def test_elastic_gang_grows_when_room_appears():
    sim = run("""
        [[policy.projects]]
        name = "p1"
        [[nodes]]
        name = "n1"
        gpus = 4
        [[jobs]]
        name = "g"
        project = "p1"
        tasks = 4
        min_tasks = 2
        gpus = 1
        running_on = ["n1", "n1", "", ""]
        """)
    assert job(sim, "g").running_tasks == 4


# --- quota ----------------------------------------------------------------------------------------

def test_non_preemptible_jobs_run_only_within_project_quota():
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 2
        [[nodes]]
        name = "n1"
        gpus = 8
        [[jobs]]
        name = "ws"
        count = 4
        project = "p1"
        priority = "build"
        gpus = 1
        """)
    assert sim.running() == {"ws-1", "ws-2"}
    assert gpus(sim, "p1") == 2


def test_non_preemptible_quota_counts_only_non_preemptible_jobs():
    # Training jobs already use idle GPUs over the project's quota; a notebook still starts within quota
    # on an idle GPU (without stopping anything), and a second one would pass the quota and waits.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 2
        [[nodes]]
        name = "n1"
        gpus = 8
        [[jobs]]
        name = "t"
        count = 5
        project = "p1"
        gpus = 1
        running_on = ["n1"]
        [[jobs]]
        name = "ws"
        count = 3
        project = "p1"
        priority = "build"
        gpus = 1
        submitted = 100
        """)
    assert sim.running() == {"t-1", "t-2", "t-3", "t-4", "t-5", "ws-1", "ws-2"}
    assert sim.preempted == set()
    assert "non-preemptible jobs hold 2/2 GPUs" in reason(sim, "ws-3")


def test_non_preemptible_jobs_run_only_within_department_quota():
    # The project's own quota (4) would allow more; the department's (2) does not.
    sim = run("""
        [[policy.departments]]
        name = "D"
        gpu_quota = 2
        [[policy.projects]]
        name = "p1"
        department = "D"
        gpu_quota = 4
        [[nodes]]
        name = "n1"
        gpus = 8
        [[jobs]]
        name = "ws"
        count = 4
        project = "p1"
        priority = "build"
        gpus = 1
        """)
    assert gpus(sim, "p1") == 2
    assert "department D" in reason(sim, "ws-3")


def test_preemptible_jobs_use_idle_gpus_over_quota():
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 1
        [[policy.projects]]
        name = "idle"
        gpu_quota = 3
        [[nodes]]
        name = "n1"
        gpus = 4
        [[jobs]]
        name = "t"
        count = 4
        project = "p1"
        gpus = 1
        """)
    assert gpus(sim, "p1") == 4


def test_implicit_default_department_never_blocks_non_preemptible_jobs():
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 3
        [[nodes]]
        name = "n1"
        gpus = 4
        [[jobs]]
        name = "ws"
        count = 3
        project = "p1"
        priority = "build"
        gpus = 1
        """)
    assert gpus(sim, "p1") == 3


# --- fractions and memory slices ------------------------------------------------------------------

def test_fractions_on_one_gpu_never_add_up_to_more_than_one():
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 1
        [[nodes]]
        name = "n1"
        gpus = 1
        [[jobs]]
        name = "f"
        count = 3
        project = "p1"
        gpus = 0.4
        """)
    assert sim.running() == {"f-1", "f-2"}
    assert gpus(sim, "p1") == pytest.approx(0.8)
    assert "pool default has 0.2 free, the job needs 0.4" in reason(sim, "f-3")


def test_memory_slices_share_one_gpu_by_memory():
    # 80 GiB GPUs: 40 GiB + 0.5 fill GPU 0 exactly; 50 GiB does not fit beside 40 GiB and takes GPU 1.
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 2
        [[nodes]]
        name = "n1"
        gpus = 2
        gpu_memory_gib = 80
        [[jobs]]
        name = "m40"
        project = "p1"
        gpu_memory_gib = 40
        submitted = 0
        [[jobs]]
        name = "half"
        project = "p1"
        gpus = 0.5
        submitted = 1
        [[jobs]]
        name = "m50"
        project = "p1"
        gpu_memory_gib = 50
        submitted = 2
        """)
    assert gpu_index(sim, "m40") == gpu_index(sim, "half") == [(0,)]
    assert gpu_index(sim, "m50") == [(1,)]
    placement = job(sim, "m50").task_placement(0)
    assert placement.gpu_share == pytest.approx(50 / 80)


def test_memory_slice_larger_than_any_gpu_cannot_run():
    sim = run("""
        [[policy.projects]]
        name = "p1"
        [[nodes]]
        name = "n1"
        gpus = 2
        gpu_memory_gib = 40
        [[jobs]]
        name = "m"
        project = "p1"
        gpu_memory_gib = 48
        """)
    assert sim.pending() == {"m"}
    assert "cannot run as asked" in reason(sim, "m")


# --- placement strategies -------------------------------------------------------------------------

def placement_cluster(placement: str) -> str:
    return f"""
        [policy]
        placement = "{placement}"
        [[policy.projects]]
        name = "p1"
        [[nodes]]
        name = "n1"
        gpus = 8
        [[nodes]]
        name = "n2"
        gpus = 8
        [[nodes]]
        name = "n3"
        gpus = 8
        [[jobs]]
        name = "fill"
        project = "p1"
        gpus = 4
        running_on = ["n2"]
        [[jobs]]
        name = "fill3"
        project = "p1"
        gpus = 2
        running_on = ["n3"]
        [[jobs]]
        name = "j"
        project = "p1"
        gpus = 2
        submitted = 10
    """


def test_binpack_fills_the_fullest_node_that_fits():
    assert nodes_of(run(placement_cluster("binpack")), "j") == ["n2"]


def test_spread_uses_the_emptiest_node():
    assert nodes_of(run(placement_cluster("spread")), "j") == ["n1"]


def gpu_cluster(gpu_placement: str) -> str:
    return f"""
        [policy]
        placement = "binpack"
        gpu_placement = "{gpu_placement}"
        [[policy.projects]]
        name = "p1"
        [[nodes]]
        name = "n1"
        gpus = 3
        [[jobs]]
        name = "quarter"
        project = "p1"
        gpus = 0.25
        running_on = ["n1"]
        gpu_index = [[1]]
        [[jobs]]
        name = "half"
        project = "p1"
        gpus = 0.5
        running_on = ["n1"]
        gpu_index = [[2]]
        [[jobs]]
        name = "f"
        project = "p1"
        gpus = 0.25
        submitted = 10
    """


def test_gpu_placement_binpack_shares_the_fullest_gpu():
    assert gpu_index(run(gpu_cluster("binpack")), "f") == [(2,)]


def test_gpu_placement_spread_takes_the_emptiest_gpu():
    assert gpu_index(run(gpu_cluster("spread")), "f") == [(0,)]


def test_cpu_placement_is_chosen_apart_from_gpu_placement():
    template = """
        [policy]
        placement = "binpack"
        cpu_placement = "{cpu}"
        [[policy.projects]]
        name = "p1"
        [[nodes]]
        name = "n1"
        gpus = 0
        cpus = 16
        [[nodes]]
        name = "n2"
        gpus = 0
        cpus = 16
        [[jobs]]
        name = "busy"
        project = "p1"
        cpus = 8
        running_on = ["n2"]
        [[jobs]]
        name = "c"
        project = "p1"
        cpus = 4
        submitted = 10
    """
    assert nodes_of(run(template.format(cpu="binpack")), "c") == ["n2"]
    assert nodes_of(run(template.format(cpu="spread")), "c") == ["n1"]


# --- where a job may run --------------------------------------------------------------------------

def test_a_job_in_one_node_pool_never_lands_in_another():
    sim = run("""
        [[policy.projects]]
        name = "p1"
        [[nodes]]
        name = "a1"
        gpus = 4
        pool = "a100"
        [[nodes]]
        name = "h1"
        gpus = 4
        pool = "h100"
        [[jobs]]
        name = "busy"
        project = "p1"
        gpus = 4
        pool = "h100"
        priority = "build"
        running_on = ["h1"]
        [[jobs]]
        name = "j"
        project = "p1"
        gpus = 1
        pool = "h100"
        [[jobs]]
        name = "anywhere"
        project = "p1"
        gpus = 1
        """)
    assert sim.pending() == {"j", "anywhere"}
    assert nodes_of(sim, "busy") == ["h1"]
    assert "h100" in reason(sim, "j")
    assert "no schedulable nodes in pool default" in reason(sim, "anywhere")


def test_node_selector_restricts_nodes_to_matching_labels():
    sim = run("""
        [policy]
        placement = "binpack"
        [[policy.projects]]
        name = "p1"
        [[nodes]]
        name = "n1"
        gpus = 4
        labels = { gpu = "a100" }
        [[nodes]]
        name = "n2"
        gpus = 4
        labels = { gpu = "h100", rack = "r1" }
        [[jobs]]
        name = "fill"
        project = "p1"
        gpus = 3
        running_on = ["n1"]
        [[jobs]]
        name = "j"
        project = "p1"
        gpus = 1
        node_selector = { gpu = "h100", rack = "r1" }
        [[jobs]]
        name = "k"
        project = "p1"
        gpus = 1
        node_selector = { gpu = "h100", rack = "r2" }
        """)
    assert nodes_of(sim, "j") == ["n2"]
    assert sim.pending() == {"k"}


def test_cpu_only_jobs_run_without_gpus_and_respect_cpus_and_memory():
    sim = run("""
        [[policy.projects]]
        name = "p1"
        [[nodes]]
        name = "n1"
        gpus = 2
        cpus = 16
        memory_gib = 64
        [[jobs]]
        name = "gpu"
        project = "p1"
        gpus = 2
        cpus = 2
        running_on = ["n1"]
        [[jobs]]
        name = "c"
        count = 3
        project = "p1"
        gpus = 0
        cpus = 6
        memory_gib = 8
        [[jobs]]
        name = "fat"
        project = "p1"
        gpus = 0
        cpus = 1
        memory_gib = 100
        """)
    assert sim.running() == {"gpu", "c-1", "c-2"}
    assert job(sim, "c-1").task_placement(0).gpu_index == ()
    assert gpus(sim, "p1") == 2
    assert "waiting for CPUs" in reason(sim, "c-3")
    assert "cannot run as asked" in reason(sim, "fat")


# --- why pending ----------------------------------------------------------------------------------

def test_reason_of_non_preemptible_over_quota_job_names_project_and_numbers():
    sim = run("""
        [[policy.projects]]
        name = "vision"
        gpu_quota = 2
        [[nodes]]
        name = "n1"
        gpus = 8
        [[jobs]]
        name = "ws"
        count = 3
        project = "vision"
        priority = "build"
        gpus = 1
        """)
    text = reason(sim, "ws-3")
    assert "project vision" in text
    assert re.search(r"\b2(\+1)?/2 GPUs", text), text
    assert "quota" in text and "non-preemptible" in text


def test_quota_reason_does_not_mention_quotas_that_are_not_set():
    sim = run("""
        [[policy.projects]]
        name = "vision"
        gpu_quota = 2
        [[nodes]]
        name = "n1"
        gpus = 8
        [[jobs]]
        name = "ws"
        count = 3
        project = "vision"
        priority = "build"
        gpus = 1
        """)
    text = reason(sim, "ws-3")
    assert "CPUs" not in text and "GiB" not in text, text


def test_reason_when_no_node_matches_the_selector():
    sim = run("""
        [[policy.projects]]
        name = "p1"
        [[nodes]]
        name = "n1"
        gpus = 4
        labels = { gpu = "a100" }
        [[jobs]]
        name = "j"
        project = "p1"
        gpus = 1
        node_selector = { gpu = "v100" }
        """)
    assert "no node in pool default matches constraint gpu=v100" in reason(sim, "j")


def test_reason_when_a_task_is_larger_than_any_node():
    sim = run("""
        [[policy.projects]]
        name = "p1"
        [[nodes]]
        name = "n1"
        gpus = 8
        [[jobs]]
        name = "huge"
        project = "p1"
        gpus = 16
        """)
    text = reason(sim, "huge")
    assert "cannot run as asked" in text
    assert "16 GPUs" in text


def test_reason_when_the_pool_is_full_says_how_much_is_free():
    sim = run("""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 8
        [[nodes]]
        name = "n1"
        gpus = 4
        [[jobs]]
        name = "busy"
        project = "p1"
        priority = "build"
        gpus = 3
        running_on = ["n1"]
        [[jobs]]
        name = "j"
        project = "p1"
        gpus = 2
        """)
    assert "pool default has 1 free, the job needs 2" in reason(sim, "j")


def test_every_pending_job_has_a_reason_and_running_jobs_none():
    sim = run(GANG_CLUSTER + """
        [[jobs]]
        name = "g"
        project = "p1"
        tasks = 2
        gpus = 2
        [[jobs]]
        name = "ok"
        project = "p1"
        gpus = 1
        """)
    reasons = pending_texts(sim.last_plan)
    assert set(reasons) == sim.pending()
    assert all(reasons[j] for j in reasons)


def test_a_gpu_out_of_service_takes_no_work_and_leaves_the_pool_capacity():
    from gpud.core import schedule
    from gpud.model import JobSpec, NodeSpec, Snapshot, TaskRequest
    from gpud.plugins import make_plugin_manager
    from gpud.policy_file import parse_policy

    policy = parse_policy({"projects": [{"name": "p"}]}, "test")
    node = NodeSpec("n1", gpus=4, out_of_service=(1, 2))
    jobs = tuple(JobSpec(id=f"j{i}", project="p", request=TaskRequest(gpus=1), seq=i) for i in range(3))
    plan = schedule(Snapshot((node,), jobs, 0.0), policy, make_plugin_manager())
    assert sorted(b.placement.gpu_index for b in plan.binds) == [(0,), (3,)]
    assert "j2" in pending_texts(plan)
    (queue,) = [q for q in plan.queues if q.name == "p"]
    assert queue.fair_share.gpu == 2.0


def test_a_larger_job_blocked_after_a_smaller_one_states_its_own_need():
    from gpud.core import Scheduler
    from gpud.model import JobSpec, NodeSpec, Snapshot, TaskRequest
    from gpud.plugins import make_plugin_manager
    from gpud.policy_file import parse_policy

    policy = parse_policy({"projects": [{"name": "a", "gpu_quota": 2}]}, "test")
    jobs = [JobSpec(id=f"one-{i}", project="a", request=TaskRequest(gpus=1), seq=i) for i in range(3)]
    jobs.append(JobSpec(id="four", project="a", request=TaskRequest(gpus=4), seq=9))
    plan = Scheduler(Snapshot((NodeSpec("n", gpus=2),), tuple(jobs), 0.0), policy, make_plugin_manager()).cycle()
    assert pending_texts(plan)["one-2"].endswith("has 0 free, the job needs 1")
    assert pending_texts(plan)["four"].endswith("has 0 free, the job needs 4")


def test_a_larger_job_blocked_after_a_fragmented_one_is_told_of_its_own_request():
    # Two 4-GPU nodes with one GPU free each: a 2-GPU task fits on neither. The jobs that failure
    # blocks are each told of their own request: scattered room for 2 GPUs and 6 CPUs, too few free
    # GPUs for 4, and no node large enough for 8.
    from gpud.core import Scheduler, schedule
    from gpud.model import JobSpec, NodeSpec, Snapshot, TaskPlacement, TaskRequest
    from gpud.plugins import make_plugin_manager
    from gpud.policy_file import parse_policy

    policy = parse_policy({"projects": [{"name": "a"}]}, "test")
    nodes = (NodeSpec("n1", gpus=4, cpus=16), NodeSpec("n2", gpus=4, cpus=16))
    running = [JobSpec(id=f"run-{n}", project="a", request=TaskRequest(gpus=3, cpus=1), started=0.0,
                       placements=(TaskPlacement(n, (0, 1, 2)),)) for n in ("n1", "n2")]
    pending = [JobSpec(id="two", project="a", request=TaskRequest(gpus=2, cpus=2), seq=1),
               JobSpec(id="two-more-cpus", project="a", request=TaskRequest(gpus=2, cpus=6), seq=2),
               JobSpec(id="four", project="a", request=TaskRequest(gpus=4, cpus=2), seq=3),
               JobSpec(id="eight", project="a", request=TaskRequest(gpus=8, cpus=2), seq=4)]
    jobs = (*running, *pending)
    for plan in (schedule(Snapshot(nodes, jobs, 0.0), policy, make_plugin_manager()),
                 Scheduler(Snapshot(nodes, jobs, 0.0), policy, make_plugin_manager()).cycle()):
        texts = pending_texts(plan)
        assert texts["two"].endswith("fragmented: pool default has 2 GPUs free, but no node holds 2 GPUs, 2 CPUs, 1 GiB")
        assert texts["two-more-cpus"].endswith("no node holds 2 GPUs, 6 CPUs, 1 GiB"), texts["two-more-cpus"]
        assert texts["four"].endswith("waiting for GPUs: pool default has 2 free, the job needs 4"), texts["four"]
        assert "cannot run as asked: no node in pool default is large enough" in texts["eight"], texts["eight"]


def test_every_job_of_a_queue_passed_over_whole_says_why_even_after_the_next_cycle():
    # Once the smallest requests of a queue are blocked, its other jobs are passed over at once and
    # their reasons are worked out when read: each states its own need or the quota rule that
    # binds it, and stays readable while the scheduler goes on.
    from gpud.core import Scheduler
    from gpud.model import JobSpec, NodeSpec, Snapshot, TaskRequest
    from gpud.plugins import make_plugin_manager
    from gpud.policy_file import parse_policy

    policy = parse_policy({"projects": [{"name": "a", "gpu_quota": 1}]}, "test")
    small = [JobSpec(id=f"small-{i}", project="a", request=TaskRequest(gpus=1, cpus=2), seq=i, submitted=i)
             for i in range(3)]
    sizes = {"two": 2, "four": 4, "eight": 8, "one-more-cpu": 1}
    larger = [JobSpec(id=name, project="a", request=TaskRequest(gpus=n, cpus=3), seq=10 + i, submitted=10 + i)
              for i, (name, n) in enumerate(sizes.items())]
    fixed = [JobSpec(id=f"fixed-{i}", project="a", request=TaskRequest(gpus=2, cpus=2), priority=125, seq=20 + i,
                     submitted=20 + i) for i in range(2)]
    jobs = small + larger + fixed
    scheduler = Scheduler(Snapshot((NodeSpec("n", gpus=2),), tuple(jobs), 0.0), policy, make_plugin_manager())
    plan = scheduler.cycle()
    assert sorted(b.job for b in plan.binds) == ["small-0", "small-1"]
    assert set(pending_texts(plan)) == {j.id for j in jobs} - {"small-0", "small-1"}
    scheduler.cycle(10.0)  # the next cycle runs before anyone reads the first plan's reasons
    for job in jobs[2:]:
        reason = pending_texts(plan)[job.id]
        assert reason.startswith("project a: 2/1 GPUs of quota"), reason
        if job.preemptible:
            assert reason.endswith(f"has 0 free, the job needs {job.request.gpus:g}"), reason
        else:
            assert "has no quota left for it (non-preemptible jobs hold 0/1 GPUs" in reason, reason
