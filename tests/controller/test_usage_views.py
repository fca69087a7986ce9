"""The standing of ``gpuctl usage`` and the groups of ``gpuctl report``, from known amounts and jobs."""

from __future__ import annotations

import pytest

from gpud.accounting.report import percentile, report_rows
from gpud.accounting.standing import usage_rows
from gpud.jobs import Job
from gpud.model import Resources
from gpud.policy import Department, Policy, Project

H = 3600.0


def policy() -> Policy:
    return Policy(departments={"research": Department("research", quota={"default": Resources(gpu=8)}),
                               "ops": Department("ops", quota={"default": Resources(gpu=8)})},
                  projects={"a": Project("a", quota={"default": Resources(gpu=6)}, department="research"),
                            "b": Project("b", quota={"default": Resources(gpu=2)}, department="research"),
                            "c": Project("c", department="ops")})


def test_standing_is_entitlement_share_over_usage_share_among_siblings():
    amounts = {("department", "default", "research"): (8 * H, 0.0, 0.0),
               ("project", "default", "a"): (2 * H, 0.0, 0.0), ("project", "default", "b"): (6 * H, 0.0, 0.0),
               ("user", "default", "a/alice"): (1.5 * H, 0.0, 0.0), ("user", "default", "a/bob"): (0.5 * H, 0, 0)}
    rows = {(r["level"], r["name"]): r for r in usage_rows(policy(), amounts, {("project", "default", "a"): 7.0},
                                                          {"default"})}
    a, b = rows[("project", "a")], rows[("project", "b")]
    assert (a["entitlement_share"], a["usage_share"]) == (0.75, 0.25) and a["standing"] == pytest.approx(3.0)
    assert (b["entitlement_share"], b["usage_share"]) == (0.25, 0.75) and b["standing"] == pytest.approx(1 / 3)
    assert a["quota"] == 6 and a["fair_share"] == 7.0 and a["gpu_hours"] == pytest.approx(2.0)
    # Users of a project are entitled equally.
    assert rows[("user", "a/alice")]["standing"] == pytest.approx(0.5 / 0.75)
    assert rows[("user", "a/bob")]["standing"] == pytest.approx(0.5 / 0.25)
    # A queue that used nothing has no standing; departments with equal quotas are entitled equally.
    assert rows[("department", "ops")]["standing"] is None
    assert rows[("department", "research")]["entitlement_share"] == 0.5


def test_rows_come_department_then_its_projects_then_their_users():
    amounts = {("user", "default", "a/alice"): (H, 0.0, 0.0)}
    order = [(r["level"], r["name"]) for r in usage_rows(policy(), amounts, {}, {"default"})]
    assert order == [("department", "ops"), ("project", "c"), ("department", "research"), ("project", "a"),
                     ("user", "a/alice"), ("project", "b")]


def job(id: str, user: str, project: str, gpus: float, ran: float, waited: float, hosts: list[str],
        samples: tuple[float, int] = (0.0, 0), peak: float | None = None) -> Job:
    return Job(id=id, user=user, project=project, workdir="/", gpus=gpus, gpu_seconds=gpus * ran, cpus=2,
               run_seconds=ran, submitted=100.0, started=100.0 + waited, ended=100.0 + waited + ran,
               state="COMPLETED", hosts=hosts, gpu_util_sum=samples[0], gpu_util_samples=samples[1],
               gpu_memory_peak_gib=peak)


def test_report_groups_hours_waits_and_efficiency():
    jobs = [job("1", "alice", "a", 2, H, 10, ["n1"], (180.0, 3), 12.0),
            job("2", "alice", "b", 1, H, 30, ["n1", "n2"], (20.0, 1), 40.0),
            job("3", "bob", "c", 4, H / 2, 0, ["n2"])]
    by_user = {r["user"]: r for r in report_rows(jobs, "user", 1e9, lambda p: {"c": "ops"}.get(p, "research"))}
    alice = by_user["alice"]
    assert alice["gpu_hours"] == pytest.approx(3.0) and alice["cpu_hours"] == pytest.approx(4.0)
    assert alice["jobs"] == 2 and alice["mean_wait_s"] == 20 and alice["p95_wait_s"] == 30
    assert alice["gpu_utilization"] == pytest.approx(50.0) and alice["gpu_memory_peak_gib"] == 40.0
    assert by_user["bob"]["gpu_utilization"] is None and by_user["bob"]["gpu_memory_peak_gib"] is None
    by_dept = {r["department"]: r["gpu_hours"] for r in report_rows(jobs, "department", 1e9,
                                                                    lambda p: {"c": "ops"}.get(p, "research"))}
    assert by_dept == {"research": pytest.approx(3.0), "ops": pytest.approx(2.0)}
    by_node = {r["node"]: r["gpu_hours"] for r in report_rows(jobs, "node", 1e9, lambda p: "x")}
    assert by_node == {"n1": pytest.approx(2.5), "n2": pytest.approx(2.5)}   # job 2 split over its two nodes
    with pytest.raises(ValueError, match="unknown grouping 'team'"):
        report_rows(jobs, "team", 1e9, lambda p: "x")


def test_p95_is_the_nearest_rank():
    assert percentile([], 0.95) is None
    assert percentile([5.0], 0.95) == 5.0
    assert percentile([float(i) for i in range(1, 101)], 0.95) == 95.0
    assert percentile([float(i) for i in range(1, 21)], 0.95) == 19.0
