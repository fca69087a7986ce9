"""``gpuctl simulate --trace``: fill and replay from the command line, JSON, plots and refusals."""

from __future__ import annotations

import json

import pytest

from gpud.cli.gpuctl import main
from trace_helpers import write_nodes, write_pods

PUBLISHED = ("workload,policy,seeds,total_gpus,alloc_pct_at_arrived_50,alloc_pct_at_arrived_100\n"
             "tiny,06-FGD,10,2,50.0,99.0\nother,06-FGD,10,2,1.0,1.0\n")


@pytest.fixture
def trace(tmp_path):
    csv = tmp_path / "csv"
    csv.mkdir()
    (tmp_path / "published").mkdir()
    (tmp_path / "published" / "fgd_atc23_expected_results_summary.csv").write_text(PUBLISHED)
    pods = write_pods(csv / "openb_pod_list_tiny.csv",
                      [(f"p{i}", 1000, 1024, 1, 500, "", "LS" if i % 2 else "BE", "Running", 10 * i, 10 * i + 50,
                        10 * i) for i in range(4)])
    nodes = write_nodes(csv / "openb_node_list_gpu_node.csv", [("a", 64000, 65536, 1, "T4"),
                                                                ("b", 64000, 65536, 1, "T4")])
    quotas = tmp_path / "q.csv"
    quotas.write_text("date,vcA,vcB,total\n2020-04-01,1,1,2\n")
    return pods, nodes, str(quotas)


def test_fill_prints_gpud_beside_the_published_rows(trace, capsys):
    pods, nodes, _ = trace
    assert main(["simulate", "--trace", pods, "--nodes", nodes, "--fill", "--seeds", "42,43",
                 "--ratio", "1.0"]) == 0
    out = capsys.readouterr().out
    assert "workload tiny" in out and "06-FGD" in out and "FGD paper" in out
    assert "binpack" in out and "fragaware" in out


def test_fill_json_has_every_level_and_seed(trace, capsys):
    pods, nodes, _ = trace
    assert main(["simulate", "--trace", pods, "--nodes", nodes, "--fill", "--seeds", "42-44", "--ratio", "1.0",
                 "--placement", "spread", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mode"] == "fill" and doc["gpus"] == 2 and doc["workload"] == "tiny"
    (entry,) = doc["placements"]
    assert entry["placement"] == "spread" and entry["seeds"] == [42, 43, 44]
    assert entry["alloc_pct"]["100"] == pytest.approx(100.0) and len(entry["per_seed_alloc_pct_130"]) == 3
    assert doc["published"] == [{"policy": "06-FGD", "alloc_pct": {"50": 50.0, "100": 99.0}}]


def test_replay_json_reports_waits_utilisation_and_projects(trace, capsys):
    pods, nodes, quotas = trace
    assert main(["simulate", "--trace", pods, "--nodes", nodes, "--quotas", quotas, "--placement", "fragaware",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mode"] == "replay" and doc["jobs"] == 4 and doc["finished"] == 4
    assert doc["queueing_delay_s"]["p99"] == 0 and doc["evictions"] == 0
    assert set(doc["projects"]) <= {"vcA", "vcB"} and doc["allocation_ratio_series"]
    assert main(["simulate", "--trace", pods, "--nodes", nodes]) == 0
    assert "Queueing delay" in capsys.readouterr().out


def test_plots_are_written(trace, tmp_path):
    pytest.importorskip("matplotlib")
    pods, nodes, quotas = trace
    fill_png, replay_png = tmp_path / "fill.png", tmp_path / "replay.png"
    assert main(["simulate", "--trace", pods, "--nodes", nodes, "--fill", "--seeds", "1", "--ratio", "1.0",
                 "--plot", str(fill_png)]) == 0
    assert main(["simulate", "--trace", pods, "--nodes", nodes, "--quotas", quotas, "--plot", str(replay_png)]) == 0
    assert fill_png.read_bytes()[:4] == b"\x89PNG" and replay_png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("extra", [["--placement", "nosuch"], ["--placement", "binpack,spread"]])
def test_bad_trace_options_are_refused(trace, capsys, extra):
    pods, nodes, _ = trace
    assert main(["simulate", "--trace", pods, "--nodes", nodes, *extra]) == 2
    assert "gpuctl simulate:" in capsys.readouterr().err


def test_trace_needs_nodes(trace, capsys):
    pods, _, _ = trace
    assert main(["simulate", "--trace", pods]) == 2
    assert "--nodes" in capsys.readouterr().err


def test_a_policy_file_selects_fragaware_like_any_builtin(tmp_path, capsys):
    scenario = tmp_path / "s.toml"
    scenario.write_text("""
[policy]
placement = "fragaware"

[[policy.projects]]
name = "p"
gpu_quota = 2

[[nodes]]
name = "n1"
gpus = 2

[[jobs]]
name = "half1"
project = "p"
gpus = 0.5

[[jobs]]
name = "half2"
project = "p"
gpus = 0.5
submitted = 1

[[jobs]]
name = "whole"
project = "p"
gpus = 1
submitted = 2

[expect]
running = ["half1", "half2", "whole"]
""")
    assert main(["simulate", str(scenario), "--json"]) == 0
    jobs = {j["job"]: j for j in json.loads(capsys.readouterr().out)["jobs"]}
    assert jobs["half1"]["gpu_index"] == jobs["half2"]["gpu_index"]


def test_replay_with_history_compares_delivered_and_entitled_gpu_hours(trace, capsys, tmp_path):
    pods, nodes, quotas = trace
    assert main(["simulate", "--trace", pods, "--nodes", nodes, "--quotas", quotas, "--history", "2",
                 "--half-life", "1", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    for run in (document, document["with_history"]):
        projects = run["entitlement"]["projects"]
        assert set(projects) == {"vcA", "vcB"}
        owed = sum(p["entitled_gpu_hours"] for p in projects.values())
        off = sum(abs(p["delivered_gpu_hours"] - p["entitled_gpu_hours"]) for p in projects.values())
        assert owed > 0 and run["entitlement"]["deviation_pct"] == pytest.approx(100 * off / owed, abs=0.01)
    assert document["with_history"]["history_strength"] == 2
    assert main(["simulate", "--trace", pods, "--nodes", nodes, "--quotas", quotas, "--history", "1"]) == 0
    out = capsys.readouterr().out
    assert "deviation of delivered from entitled GPU-hours: without history" in out
    assert main(["simulate", "--trace", pods, "--nodes", nodes, "--history", "-1"]) == 2
    assert "--history is a strength from 0 to 100" in capsys.readouterr().err


def test_history_plot_is_written_beside_the_replay_plot(trace, tmp_path):
    pytest.importorskip("matplotlib")  # an optional dependency (the plot extra)
    pods, nodes, quotas = trace
    replay_png = tmp_path / "replay.png"
    assert main(["simulate", "--trace", pods, "--nodes", nodes, "--quotas", quotas, "--history", "1",
                 "--plot", str(replay_png)]) == 0
    assert (tmp_path / "replay-history.png").read_bytes()[:4] == b"\x89PNG"
