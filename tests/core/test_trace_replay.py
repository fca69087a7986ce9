"""Time replay through the warm scheduler, on trace slices with known answers."""

from __future__ import annotations

import pytest

from gpud.plugins import make_plugin_manager
from gpud.trace.alibaba import read_nodes, read_pods
from gpud.trace.projects import QuotaTable, trace_policy
from gpud.trace.replay import replay, summary
from trace_helpers import TRACE_DIR, write_nodes, write_pods


def run(tmp_path, pod_rows, node_rows, shares=(("p", 1.0),), project=lambda pod: "p", placement="binpack"):
    pods = read_pods(write_pods(tmp_path / "p.csv", pod_rows))
    nodes = read_nodes(write_nodes(tmp_path / "n.csv", node_rows))
    policy = trace_policy(QuotaTable("test", "-", tuple(shares)), sum(n.gpus for n in nodes), placement)
    return replay(pods, nodes, policy, make_plugin_manager(), project)


def test_a_pod_waits_for_the_gpu_and_then_runs_its_production_time(tmp_path):
    result = run(tmp_path, [("a", 1000, 1024, 1, 1000, "", "Burstable", "Succeeded", 0, 100, 0),
                            ("b", 1000, 1024, 1, 1000, "", "Burstable", "Succeeded", 10, 60, 10)],
                 [("n", 8000, 65536, 1, "T4")])
    assert (result.jobs, result.started, result.finished, result.never_started) == (2, 2, 2, 0)
    assert result.wait_s["mean"] == 45 and result.wait_s["p99"] == 90
    assert result.jct_s["mean"] == 120 and result.jct_s["p99"] == 140
    assert result.production_wait_s["mean"] == 0
    assert result.utilisation_pct == pytest.approx(100.0)
    assert result.evictions == 0


def test_never_started_pods_are_left_out_and_fractions_share_a_gpu(tmp_path):
    result = run(tmp_path, [("a", 1000, 1024, 1, 500, "", "Burstable", "Running", 0, 100, 0),
                            ("b", 1000, 1024, 1, 500, "", "Burstable", "Running", 0, 100, 0),
                            ("c", 1000, 1024, 1, 1000, "", "LS", "Pending", 0, None, None)],
                 [("n", 8000, 65536, 1, "T4")])
    assert result.jobs == 2 and result.wait_s["p99"] == 0
    assert result.utilisation_pct == pytest.approx(100.0)


def test_an_over_quota_preemptible_job_is_reclaimed_requeued_and_rerun(tmp_path):
    # Two projects with one GPU of quota each; a best-effort 2-GPU job of "a" holds both GPUs
    # when a 1-GPU job of "b" arrives after the minimum run time: "a" is evicted, waits for
    # "b" to finish, and runs its whole time again.
    result = run(tmp_path, [("a1", 1000, 1024, 2, 1000, "", "BE", "Running", 0, 1000, 0),
                            ("b1", 1000, 1024, 1, 1000, "", "Burstable", "Running", 400, 420, 400)],
                 [("n", 8000, 65536, 2, "T4")], shares=(("a", 0.5), ("b", 0.5)),
                 project=lambda pod: pod.name[0])
    assert result.evictions == 1 and result.moves == 0
    assert result.finished == 2
    assert result.jct_s["p99"] == 1420
    assert result.wait_s["mean"] == 0
    assert set(result.fairness) == {"a", "b"} and result.fairness["b"]["quota_gpus"] == 1.0


def test_summary_statistics():
    assert summary([]) == {"mean": 0.0, "median": 0.0, "p99": 0.0, "count": 0}
    stats = summary(list(range(1, 101)))
    assert (stats["mean"], stats["median"], stats["p99"], stats["count"]) == (50.5, 50.5, 99, 100)


def test_a_slice_of_the_real_trace_on_the_whole_cluster_starts_every_pod_on_arrival():
    pods_path, nodes_path = TRACE_DIR / "openb_pod_list_default.csv", TRACE_DIR / "openb_node_list_gpu_node.csv"
    pods = [p for p in read_pods(str(pods_path)) if p.duration is not None][:300]
    nodes = read_nodes(str(nodes_path))
    policy = trace_policy(QuotaTable("test", "-", (("p", 1.0),)), 6212, "fragaware")
    result = replay(pods, nodes, policy, make_plugin_manager(), lambda pod: "p")
    # The recorded load is far below 6,212 GPUs, so nothing waits and every pod runs its own time.
    assert (result.jobs, result.started, result.finished) == (300, 300, 300)
    assert result.wait_s["p99"] == 0
    assert result.jct_s["mean"] == pytest.approx(sum(p.duration for p in pods) / 300)
    assert result.evictions == 0
