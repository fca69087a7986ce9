"""`gpuctl why` tells the truth (hypothesis): each "would start if" condition, brought about, starts the job.

Random small clusters (nodes, projects with quotas and limits, running jobs
of several shapes) and one pending job of project p1 (a single task, a gang,
a fraction, CPU-only, non-preemptible) are built in the controller's real
Cluster state machine and scheduled by its real cycles. For each condition of
the job's why-answer the scenario is built again, the condition is brought
about by a small function of its kind (ending jobs on the named node, ending
the project's jobs, raising the quota, lifting the limit, adding nodes of the
named size, resubmitting with the suggested shape), and the job (or its
resubmission) must start within three cycles.

A job said never to start stays pending when every other job ends; each
change the answer offers for it then removes the obstacle it names (the job
starts, or fewer rules still say never). A job not said never starts once
every other job ends. ``smaller_tasks`` ("submit again with smaller tasks")
names no size and is the one condition not brought about mechanically.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gpud.controller.cluster import Cluster
from gpud.controller.nodes import Gpu, NodeRecord
from gpud.controller.why import explain
from gpud.lifecycle import PENDING
from gpud.model import EPS

from test_why import make_cluster, submit, cycle

# WHY_TRUTH_EXAMPLES=1000 runs the figure.
TRUTH = settings(max_examples=int(os.environ.get("WHY_TRUTH_EXAMPLES", examples(100))), deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
NOT_MECHANICAL = {"smaller_tasks"}  # names no size to resubmit with
CYCLES = 3


@dataclass
class Scenario:
    """A recipe for a cluster: policy, nodes, running jobs (submitted in order), the pending job."""

    policy: dict
    nodes: list[tuple[str, int, float]]
    running: list[tuple[str, dict]]
    pending: dict
    extra_nodes: list[tuple[str, int, float]] = field(default_factory=list)


def shape(draw, cpus_hi: int) -> dict:
    """One job's fields: whole GPUs, a fraction, or CPU-only; maybe a gang, maybe elastic."""
    kind = draw(st.sampled_from(["whole", "whole", "fraction", "cpu"]))
    fields: dict = {"cpus": float(draw(st.integers(1, cpus_hi))) / draw(st.sampled_from([1, 2])),
                    "memory_gib": float(draw(st.sampled_from([0, 8, 64])))}
    if kind == "whole":
        fields["gpus"] = float(draw(st.integers(1, 4)))
    elif kind == "fraction":
        fields["gpus"] = draw(st.sampled_from([0.25, 0.5]))
    else:
        fields["gpus"] = 0.0
    tasks = draw(st.integers(1, 3))
    if tasks > 1:
        fields["tasks"] = tasks
    fields["priority"] = draw(st.sampled_from([50, 50, 75, 100]))
    return fields


@st.composite
def scenarios(draw) -> Scenario:
    """Nodes, three projects (some with limits), running jobs of every shape, one pending job of p1."""
    nodes = [(f"n{i}", draw(st.integers(2, 8)), float(draw(st.sampled_from([4, 8, 16]))))
             for i in range(1, draw(st.integers(1, 3)) + 1)]
    capacity = sum(n[1] for n in nodes)
    projects = []
    for name in ("p1", "p2", "p3"):
        project: dict = {"name": name, "gpu_quota": draw(st.integers(0, max(1, capacity // 2)))}
        if draw(st.booleans()):
            project["gpu_limit"] = project["gpu_quota"] + draw(st.integers(0, 3))
        projects.append(project)
    running = [(draw(st.sampled_from(["p1", "p1", "p2", "p3"])), shape(draw, 4))
               for _ in range(draw(st.integers(2, 14)))]
    pending = shape(draw, 8)
    pending["priority"] = draw(st.sampled_from([50, 50, 50, 75, 100]))
    if pending.get("tasks", 1) > 1 and draw(st.booleans()):
        pending["min_tasks"] = draw(st.integers(1, pending["tasks"]))
    return Scenario({"projects": projects}, nodes, running, pending)


def build(scenario: Scenario) -> tuple[Cluster, str | None]:
    """The scenario in a real Cluster after its cycles; the pending job's id (None when it started at once)."""
    cluster = make_cluster(scenario.policy, scenario.nodes)
    add_nodes(cluster, scenario.extra_nodes)
    for project, fields in scenario.running:
        submit(cluster, project, **fields)
    cycle(cluster)
    for job in [j for j in cluster.jobs.values() if j.state == PENDING]:
        cluster.job_service.cancel(job, "test")  # what did not start is no part of the load
    job = submit(cluster, "p1", **scenario.pending)
    cycle(cluster)
    return cluster, (job.id if job.state == PENDING else None)


def add_nodes(cluster: Cluster, nodes: list[tuple[str, int, float]]) -> None:
    """Register nodes (name, GPUs, CPUs) with the cluster."""
    for name, gpus, cpus in nodes:
        cluster.node_messages.register(NodeRecord(name, cpus=cpus, memory_gib=256,
                                                  gpus=[Gpu(i, f"GPU-{name}-{i}") for i in range(gpus)]), tasks=[])
    cluster.outbox.take()


def started(cluster: Cluster, job_id: str) -> bool:
    """Whether the job left PENDING within the cycles."""
    for _ in range(CYCLES):
        job = cluster.jobs.get(job_id)
        if job is None or job.state != PENDING:
            return True
        cycle(cluster)
    job = cluster.jobs.get(job_id)
    return job is None or job.state != PENDING


def newest_first(cluster: Cluster, keep: str) -> list:
    """Running jobs other than ``keep``, most recently submitted first."""
    return sorted((j for j in cluster.jobs.values() if j.id != keep and j.state != PENDING),
                  key=lambda j: -j.seq)


def end_until(cluster: Cluster, job_id: str, jobs: list, done) -> None:
    """End ``jobs`` one by one until ``done()`` holds (each ending is a load change the cluster may see)."""
    for other in jobs:
        if done():
            return
        if other.id in cluster.jobs:
            cluster.job_service.cancel(other, "test")
    assert done(), f"ending every job the condition names did not bring it about: {explain(cluster.jobs[job_id], cluster)}"


def gpu_shares(cluster: Cluster, node: str) -> list[float]:
    """The free share of each GPU of the node."""
    held = [0.0] * len(cluster.nodes[node].gpus)
    for other in cluster.jobs.values():
        for run in other.runs:
            p = run.placement
            if p is not None and p.node == node:
                for i in p.gpu_index:
                    held[i] += p.gpu_share
    return [1.0 - h for h in held]


def node_free(cluster: Cluster, node: str) -> tuple[float, int, float, float]:
    """(largest free share of one GPU, free whole GPUs, free CPUs, free memory) on the node."""
    record = cluster.nodes[node]
    cpu, mem = 0.0, 0.0
    for other in cluster.jobs.values():
        for run in other.runs:
            p = run.placement
            if p is not None and p.node == node:
                cpu += other.cpus
                mem += other.memory_gib
    shares = gpu_shares(cluster, node)
    return (max(shares, default=0.0), sum(1 for s in shares if s >= 1 - EPS), record.cpus - cpu,
            record.memory_gib - mem)


def pool_free(cluster: Cluster) -> float:
    """Free GPU share over all nodes."""
    return sum(sum(gpu_shares(cluster, n)) for n in cluster.nodes)


def task_slots(cluster: Cluster, fields: dict) -> int:
    """How many tasks of the job's shape fit on what is free now (counted here, not by why.py)."""
    gpus, cpus, mem = fields.get("gpus", 0.0), fields.get("cpus", 1.0), fields.get("memory_gib", 0.0)
    total = 0
    for name in cluster.nodes:
        _, whole, cpu, free_mem = node_free(cluster, name)
        counts = []
        if gpus >= 1:
            counts.append(math.floor(whole / gpus + EPS))
        elif gpus > EPS:
            counts.append(sum(math.floor(s / gpus + EPS) for s in gpu_shares(cluster, name)))
        if cpus > EPS:
            counts.append(math.floor(cpu / cpus + EPS))
        if mem > EPS:
            counts.append(math.floor(free_mem / mem + EPS))
        total += max(0, min(counts)) if counts else 1
    return total


def held_by(cluster: Cluster, project: str, job_id: str, non_preemptible: bool = False) -> float:
    """GPUs the project's other jobs (only its non-preemptible ones, if asked) hold."""
    return sum(j.gpus_held() for j in cluster.jobs.values() if j.project == project and j.id != job_id
               and (not non_preemptible or j.priority >= 100))


def with_setting(scenario: Scenario, project: str, key: str, value: float) -> Scenario:
    """The scenario with one setting of one project changed."""
    projects = [dict(p, **{key: value}) if p["name"] == project else p for p in scenario.policy["projects"]]
    return replace(scenario, policy={**scenario.policy, "projects": projects})


def bring_about(scenario: Scenario, condition: dict) -> tuple[Cluster, str]:
    """The scenario built again with the condition brought about; the id of the job that should start."""
    kind = condition["condition"]
    if kind in ("limit_at_least", "quota_at_least"):
        assert condition["level"] == "project"
        key = "gpu_limit" if kind == "limit_at_least" else "gpu_quota"
        scenario = with_setting(scenario, condition["name"], key, condition["gpu"])
        if "limit" in condition:
            scenario = with_setting(scenario, condition["name"], "gpu_limit", condition["limit"])
    elif kind in ("larger_node", "more_nodes"):
        need = condition["per_task"]
        scenario = replace(scenario, extra_nodes=[(f"x{i}", math.ceil(need["gpu"]), max(need["cpu"], 1.0))
                                                  for i in range(condition["tasks"])])
    elif kind == "preemptible":
        scenario = replace(scenario, pending={**scenario.pending, "priority": condition["priority_below"] - 50})
    elif kind == "fewer_tasks":
        pending = {**scenario.pending, "tasks": condition["tasks"]}
        pending.pop("min_tasks", None)
        scenario = replace(scenario, pending=pending)
    cluster, job_id = build(scenario)
    if job_id is None:
        return cluster, ""
    if "conditions" in condition or condition["who"] in ("cluster", "project"):
        # The same scenario built again: the same answer, so the condition is brought about where it was given.
        assert condition in explain(cluster.jobs[job_id], cluster)["would_start"]
    before = {"nodes": {name: node_free(cluster, name) for name in cluster.nodes},
              "slots": task_slots(cluster, scenario.pending)}
    for part in condition.get("conditions", [condition]):
        try:
            bring_about_load(cluster, job_id, scenario, part, before)
        except AssertionError as error:
            raise AssertionError(f"{error}\ncondition {part} of {condition}") from None
    return cluster, job_id


def bring_about_load(cluster: Cluster, job_id: str, scenario: Scenario, condition: dict, before: dict) -> None:
    """Jobs ending until the load condition holds (amounts freed are counted from ``before``)."""
    kind = condition["condition"]
    job = cluster.jobs[job_id]
    if kind == "idle_gpus":
        end_until(cluster, job_id, newest_first(cluster, job_id),
                  lambda: pool_free(cluster) + EPS >= condition["gpu"])
    elif kind == "level_holds_at_most":
        end_until(cluster, job_id, [j for j in newest_first(cluster, job_id) if j.project == condition["name"]],
                  lambda: held_by(cluster, condition["name"], job_id) <= condition["gpu"] + EPS)
    elif kind == "non_preemptible_at_most":
        end_until(cluster, job_id, [j for j in newest_first(cluster, job_id)
                                    if j.project == condition["name"] and j.priority >= 100],
                  lambda: held_by(cluster, condition["name"], job_id, True) <= condition["gpu"] + EPS)
    elif kind == "node_frees":
        node = condition["node"]
        whole = job.gpus >= 1 and job.gpu_memory_gib is None
        end_until(cluster, job_id, [j for j in newest_first(cluster, job_id)
                                    if any(r.placement is not None and r.placement.node == node for r in j.runs)],
                  lambda: freed_enough(before["nodes"][node], node_free(cluster, node), condition, whole))
    elif kind == "task_room":
        want = before["slots"] + condition["tasks"]
        end_until(cluster, job_id, newest_first(cluster, job_id),
                  lambda: task_slots(cluster, scenario.pending) >= want)
    elif kind not in ("limit_at_least", "quota_at_least", "larger_node", "more_nodes", "preemptible",
                      "fewer_tasks"):
        raise AssertionError(f"no way to bring about condition {kind}: {condition}")


def freed_enough(before: tuple, after: tuple, condition: dict, whole: bool) -> bool:
    """Whether the node freed what a node_frees condition names (whole GPUs for a job of whole GPUs)."""
    gpu = (after[1] - before[1]) if whole else (after[0] - before[0])
    return (gpu + EPS >= condition["gpu"] and after[2] - before[2] + EPS >= condition["cpu"]
            and after[3] - before[3] + EPS >= condition["memory"])


def end_all_but(cluster: Cluster, job_id: str) -> None:
    """End every running job but the one asked about."""
    for other in newest_first(cluster, job_id):
        cluster.job_service.cancel(other, "test")


def never_rules(answer: dict) -> int:
    """How many blockers say the job can never start."""
    return sum(1 for b in answer["blockers"] if b.get("never"))


@given(scenarios())
@TRUTH
def test_each_would_start_condition_brought_about_starts_the_job(scenario: Scenario):
    cluster, job_id = build(scenario)
    if job_id is None:
        event("started at once")
        return
    answer = explain(cluster.jobs[job_id], cluster)
    event("never" if answer["never"] else "waits")
    assert answer["blockers"], f"a pending job with no blocker: {answer}"
    if answer["never"]:
        end_all_but(cluster, job_id)
        assert not started(cluster, job_id), f"said never to start, but started once the others ended: {answer}"
        assert all(c["who"] in ("owner", "admin") for c in answer["would_start"]), answer
    else:
        end_all_but(cluster, job_id)
        assert started(cluster, job_id), f"not said never, yet waits on an empty cluster: {answer}"
    assert answer["would_start"], f"no condition given: {answer}"
    for condition in answer["would_start"]:
        event(f"condition {condition['condition']}")
        if condition["condition"] in NOT_MECHANICAL:
            continue
        changed, new_id = bring_about(scenario, condition)
        if not new_id:
            continue  # the change let it start in its first cycle
        if answer["never"]:
            end_all_but(changed, new_id)
            if started(changed, new_id):
                continue
            again = explain(changed.jobs[new_id], changed)
            assert never_rules(again) < never_rules(answer), (
                f"condition {condition} did not remove what it names:\nbefore {answer}\nafter {again}")
        else:
            assert started(changed, new_id), (
                f"condition {condition} brought about, the job still waits:\nbefore {answer}\n"
                f"after {explain(changed.jobs[new_id], changed)}")
