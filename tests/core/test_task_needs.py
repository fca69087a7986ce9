"""What one task of a job needs (``ClusterState.task_need``) is worked out once per thing asked, not per job.

Jobs that ask alike (the same amounts, and for a memory slice the same
pool) share one answer. Over random clusters of every job shape (single
tasks, gangs, elastic gangs, fractions, memory slices, CPU-only,
departments), with amounts given as ints or floats and slices in pools of
different GPU sizes, each job's answer equals the one worked out for it
alone, and the plans are those made with every answer worked out anew.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gpud.core.state import ClusterState
from gpud.model import JobSpec, NodeSpec, Resources, Snapshot, TaskRequest
from gpud.policy import Department, Policy, Project

from test_properties import NOW, PM, assert_plans_unchanged_with, cases, python_core_only

SETTINGS = settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
POOLS = {"small": 40.0, "large": 80.0}  # each pool's GPU memory


def task_need_alone(state: ClusterState, job: JobSpec) -> Resources:
    """What one task of the job needs, worked out for this job alone, as ``task_need`` promises."""
    request = job.request
    if request.gpu_memory_gib is not None:
        size = state.indexes[state.pool_of(job)].smallest_gpu_holding(request.gpu_memory_gib)
        return Resources(request.gpu_memory_gib / (size or request.gpu_memory_gib), request.cpus,
                         request.memory_gib)
    return Resources(request.gpus, request.cpus, request.memory_gib)


def _typed(amount: Resources) -> tuple:
    """The amounts with their types: an int given is an int kept (reasons show 8, not 8.0)."""
    return tuple((type(value), value) for value in (amount.gpu, amount.cpu, amount.memory))


@st.composite
def amounts(draw, low: int, high: int) -> float:
    """A whole amount, given as an int or as a float."""
    value = draw(st.integers(low, high))
    return float(value) if draw(st.booleans()) else value


@st.composite
def asked(draw) -> TaskRequest:
    """A request of any kind, its amounts ints or floats, drawn from few values so that jobs ask alike."""
    kind = draw(st.sampled_from(["whole", "fraction", "memory", "cpu"]))
    cpus, memory = draw(amounts(0, 2)), draw(amounts(0, 2))
    if kind == "whole":
        return TaskRequest(gpus=draw(amounts(1, 2)), cpus=cpus, memory_gib=memory)
    if kind == "fraction":
        return TaskRequest(gpus=draw(st.sampled_from([0.25, 0.5])), cpus=cpus, memory_gib=memory)
    if kind == "memory":
        return TaskRequest(gpus=0.0, gpu_memory_gib=draw(st.sampled_from([10, 20.0, 40, 60.0])), cpus=cpus,
                           memory_gib=memory)
    return TaskRequest(gpus=0, cpus=draw(amounts(1, 2)), memory_gib=memory)


@st.composite
def pending_jobs(draw) -> tuple[Snapshot, Policy]:
    """Pending jobs of one project in two pools whose GPUs differ in memory."""
    nodes = tuple(NodeSpec(f"{pool}{i}", gpus=2, gpu_memory_gib=size, pool=pool)
                  for pool, size in POOLS.items() for i in range(draw(st.integers(1, 2))))
    jobs = tuple(JobSpec(f"j{seq}", "p", draw(asked()), pool=draw(st.sampled_from(sorted(POOLS))),
                         tasks=draw(st.integers(1, 3)), submitted=float(seq), seq=seq)
                 for seq in range(draw(st.integers(1, 30))))
    return Snapshot(nodes, jobs, NOW), Policy(departments={"d": Department("d")},
                                               projects={"p": Project("p", department="d")})


@SETTINGS
@given(pending_jobs())
def test_jobs_that_ask_alike_share_the_answer_each_would_get_alone(drawn):
    snapshot, policy = drawn
    state = ClusterState(snapshot, policy, PM)
    for job in snapshot.jobs:
        need = state.task_need(job)
        assert _typed(need) == _typed(task_need_alone(state, job)), job
        assert state.task_need(job) is need  # asked again: the answer kept


def _task_need_anew(self, job):
    return task_need_alone(self, job)


@python_core_only
@SETTINGS
@given(cases())
def test_answers_shared_by_jobs_that_ask_alike_give_the_plans_of_answers_worked_out_anew(case):
    # Allocation, reclaim, preemption, the queue order and the reasons all ask what a task needs. Every
    # answer worked out anew for each job must give the very same plans.
    assert_plans_unchanged_with(case, ClusterState, "task_need", _task_need_anew)
