"""Reading the Alibaba trace format into gpud nodes, requests, priorities and projects."""

from __future__ import annotations

import pytest

from gpud.trace.alibaba import MODEL_LABEL, pod_job, read_nodes, read_pods, workload_profile
from gpud.trace.projects import QuotaTable, project_of, read_helios_quotas, trace_policy
from gpud.trace.scale import scale_nodes
from trace_helpers import TRACE_DIR, write_nodes, write_pods


def test_pods_map_to_fractions_whole_gpus_cpu_only_and_constraints(tmp_path):
    path = write_pods(tmp_path / "p.csv", [
        ("a", 6000, 12288, 1, 460, "", "LS", "Running", 0, 100, 2),
        ("b", 12000, 16384, 2, 1000, "V100M16|V100M32", "BE", "Failed", 5, 50, 5),
        ("c", 8000, 1024, 0, 0, "", "Burstable", "Succeeded", 7, 9, 8),
        ("d", 1000, 1024, 1, 1000, "T4", "Guaranteed", "Pending", 9, None, None),
    ])
    a, b, c, d = read_pods(path)
    assert a.request().gpus == pytest.approx(0.46) and a.request().is_shared
    assert a.request().cpus == 6 and a.request().memory_gib == 12
    assert a.duration == 98 and a.gpu_milli_total == 460
    assert b.request().whole_gpus == 2 and b.gpu_spec == ("V100M16", "V100M32") and b.selector() == {}
    assert not c.request().uses_gpu and c.request().cpus == 8
    assert d.duration is None and d.selector() == {MODEL_LABEL: "T4"}
    priorities = [pod_job(p, p.name, "x", 0, i).priority for i, p in enumerate((a, b, c, d))]
    assert priorities == [125, 25, 50, 125]
    assert pod_job(b, "b", "x", 0, 0, model="V100M32").node_selector == {MODEL_LABEL: "V100M32"}


def test_nodes_carry_their_gpu_model_as_a_label(tmp_path):
    path = write_nodes(tmp_path / "n.csv", [("n0", 96000, 393216, 8, "G2"), ("n1", 32000, 131072, 4, "V100M16"),
                                            ("n2", 64000, 262144, 0, "")])
    g2, v100, cpu = read_nodes(path)
    assert (g2.gpus, g2.cpus, g2.memory_gib, g2.labels) == (8, 96, 384, {MODEL_LABEL: "G2"})
    assert v100.gpu_memory_gib == 16 and cpu.gpus == 0 and cpu.labels == {}


def test_profile_counts_gpu_shapes_only():
    pods_path = TRACE_DIR / "openb_pod_list_default.csv"
    profile = workload_profile(read_pods(str(pods_path)))
    assert all(shape.num_gpu for shape, _ in profile)
    assert sum(w for _, w in profile) == 7064
    top, count = profile[0]
    assert (top.num_gpu, top.gpu_milli, top.cpu_milli, count) == (1, 810, 3152, 1047)


def test_projects_follow_quota_shares_and_are_stable(tmp_path):
    quota = tmp_path / "q.csv"
    quota.write_text("date,vcA,vcB,vcC,total\n2020-04-01,10,30,0,40\n2020-04-02,20,60,0,80\n")
    table = read_helios_quotas(str(quota))
    assert table.day == "2020-04-02" and table.shares == (("vcA", 0.25), ("vcB", 0.75))
    picks = [project_of(f"pod-{i}", table, 7) for i in range(4000)]
    assert picks == [project_of(f"pod-{i}", table, 7) for i in range(4000)]
    assert 0.70 < picks.count("vcB") / len(picks) < 0.80
    assert picks != [project_of(f"pod-{i}", table, 8) for i in range(4000)]
    policy = trace_policy(table, 8.0, "fragaware")
    assert policy.projects["vcA"].quota_in("default").gpu == 2.0
    assert policy.projects["vcB"].quota_in("default").gpu == 6.0


def test_scaled_cluster_keeps_every_gpu_count(tmp_path):
    rows = [(f"n{i}", 96000, 393216, 8, "G2") for i in range(90)] + [("s0", 8000, 32768, 1, "P100")]
    nodes = read_nodes(write_nodes(tmp_path / "n.csv", rows))
    small = scale_nodes(nodes, 0.05, seed=3)
    assert {n.gpus for n in small} == {1, 8}
    assert len(small) in (5, 6)
    assert [n.name for n in small] == [n.name for n in nodes if n in small]
    assert scale_nodes(nodes, 0.05, seed=3) == small and scale_nodes(nodes, 1.0) == nodes
