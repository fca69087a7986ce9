"""Every reference scenario passes, and `gpuctl simulate` reports pass, failure and bad files by exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpud.plugins import make_plugin_manager
from gpud.scenario import load_scenario
from gpud.simulate import simulate

HERE = Path(__file__).resolve().parents[1]
LOCAL_SCENARIOS = sorted((HERE / "scenarios").glob("*.toml"))
SHARED_DIR = Path(__file__).resolve().parents[3] / "shared" / "scenarios"
SHARED_SCENARIOS = sorted(SHARED_DIR.glob("*.toml")) if SHARED_DIR.is_dir() else []
PASSING = HERE / "scenarios" / "seed003-reclaim-over-fairshare-first.toml"


def _check(path: Path) -> None:
    scenario = load_scenario(path)
    pm = make_plugin_manager(scenario.policy.plugins.disable, scenario.policy.plugins.directory)
    sim = simulate(scenario, pm)
    assert scenario.expect is not None, f"{path.name} has no [expect] table: it tests nothing"
    assert not sim.failures, f"{path.name}:\n  " + "\n  ".join(sim.failures)


def test_local_scenarios_exist():
    assert LOCAL_SCENARIOS, "tests/scenarios/ holds no scenario"


@pytest.mark.parametrize("path", LOCAL_SCENARIOS, ids=lambda p: p.stem)
def test_local_scenario_passes(path):
    _check(path)


@pytest.mark.skipif(not SHARED_SCENARIOS, reason=f"no reference scenarios in {SHARED_DIR}")
@pytest.mark.parametrize("path", SHARED_SCENARIOS or [None], ids=lambda p: p.stem if p else "none")
def test_shared_scenario_passes(path):
    _check(path)


# --- the real command line --------------------------------------------------------------------------

def gpuctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "simulate", *args],
                          capture_output=True, text=True, timeout=120)


WRONG_EXPECT = """\
[[policy.projects]]
name = "p1"
gpu_quota = 2

[[nodes]]
name = "n1"
gpus = 2

[[jobs]]
name = "j1"
project = "p1"
gpus = 1

[expect]
pending = ["j1"]
"""


def test_cli_exits_0_when_expectations_hold():
    result = gpuctl(str(PASSING))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Expectations hold." in result.stdout


def test_cli_exits_1_and_names_the_failed_expectation(tmp_path):
    path = tmp_path / "wrong.toml"
    path.write_text(WRONG_EXPECT)
    result = gpuctl(str(path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED" in result.stdout
    assert "pending: expected [j1], got []" in result.stdout


def test_cli_exits_2_naming_table_and_key_of_a_bad_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(textwrap.dedent("""\
        [[nodes]]
        name = "n1"
        gpus = 2
        gpu_count = 4
        """))
    result = gpuctl(str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "bad.toml" in result.stderr
    assert "nodes[1]" in result.stderr and "gpu_count" in result.stderr
    assert result.stdout == ""


def test_cli_exits_2_for_a_missing_file(tmp_path):
    result = gpuctl(str(tmp_path / "nowhere.toml"))
    assert result.returncode == 2
    assert "nowhere.toml" in result.stderr


def test_cli_json_is_one_document_with_jobs_queues_and_evictions():
    result = gpuctl("--json", str(PASSING))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    jobs = {row["job"]: row for row in doc["jobs"]}
    assert jobs["z-1"]["state"] == "running"
    assert jobs["x-7"]["state"] == "pending" and jobs["x-7"]["reason"]
    queues = {(q["queue"], q["kind"]): q for q in doc["queues"]}
    assert queues[("p3", "project")]["allocated_gpus"] == 2
    assert queues[("p1", "project")]["fair_share_gpus"] == pytest.approx(5.0)
    assert {e["job"] for e in doc["evictions"]} == {"x-6", "x-7"}
    assert all(e["rule"] == "reclaim" and e["reason"] for e in doc["evictions"])
    assert doc["expect"] == {"checked": True, "ok": True, "failures": []}


def test_cli_json_reports_failures_with_exit_1(tmp_path):
    path = tmp_path / "wrong.toml"
    path.write_text(WRONG_EXPECT)
    result = gpuctl("--json", str(path))
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    assert doc["expect"]["ok"] is False
    assert any("pending" in f for f in doc["expect"]["failures"])


def test_simulate_output_does_not_depend_on_the_hash_seed():
    # The quickstart reclaims, leaves evicted jobs pending and prints every reason: a run must give
    # the same document whatever order Python happens to hash strings in.
    quickstart = HERE.parent / "examples" / "quickstart.toml"
    outputs = set()
    for seed in ("1", "2", "3"):
        result = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "simulate", "--json", str(quickstart)],
                                capture_output=True, text=True, timeout=120,
                                env={**os.environ, "PYTHONHASHSEED": seed})
        assert result.returncode == 0, result.stderr
        outputs.add(result.stdout)
    assert len(outputs) == 1
