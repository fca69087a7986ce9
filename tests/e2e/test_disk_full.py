"""A real full filesystem under a real controller, several clients submitting at once: nothing acknowledged is lost
and nothing refused runs.

The scene is bench/disk_full.py's (one run of it): a small tmpfs mounted
here as the controller's state directory (root only; skipped, saying so,
when mount is impossible; unmounted afterwards), a node daemon running the
jobs, clients submitting while the filesystem fills and another program's
files take and give back space, then space freed, a clean restart, and
every job the restarted controller read back run.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "disk_full.py"


def disk_full():
    spec = importlib.util.spec_from_file_location("disk_full", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_filling_disk_loses_no_acknowledged_job_and_runs_no_refused_one(tmp_path):
    bench = disk_full()
    try:
        result = bench.one_run(tmp_path, workers=6, jobs=30, size_kib=4096, free_kib=1200)
    except bench.MountError as exc:
        pytest.skip(f"a small filesystem to fill needs mount (root): {exc}")
    assert result["other"] == {}, result
    assert result["acknowledged"] and result["refused"], result
    assert "the state store refused the write: database or disk is full" in result["refusal"]["error"], result
    assert "free space in the controller's state directory" in result["refusal"]["error"], result
    assert result["alive_when_full"] and result["recovered"], result
    assert (result["lost"], result["refused_stored"], result["refused_ran"]) == (0, 0, 0), result
