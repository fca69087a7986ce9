"""The project-weighted plan: parsing weights, the shares, and gpud asking the plugin through its hook."""

from __future__ import annotations

import importlib

import pytest

import gpud_project_slices
from gpud.node.slicer import Holder
from gpud.plugins import make_plugin_manager


def test_weights_are_parsed():
    assert gpud_project_slices.parse_weights(" research=3, teaching = 1 ,") == {"research": 3.0, "teaching": 1.0}
    assert gpud_project_slices.parse_weights("") == {}


@pytest.mark.parametrize("bad", ["research", "research=lots", "=2", "research=-1"])
def test_bad_weights_are_refused_by_entry(bad):
    with pytest.raises(ValueError, match="GPUD_PROJECT_SLICE_WEIGHTS"):
        gpud_project_slices.parse_weights(bad)


def test_spare_time_follows_the_project_weights():
    holders = [Holder("a", 0.2, 1.0, project="research"), Holder("b", 0.2, 1.0, project="teaching")]
    shares = gpud_project_slices.weighted_shares(holders, 0.05, {"research": 3.0})
    assert shares == {"a": pytest.approx(0.2 + 0.45), "b": pytest.approx(0.2 + 0.15)}


def test_an_idle_projects_time_goes_to_the_busy_ones_by_weight():
    holders = [Holder("a", 0.25, 1.0, project="research"), Holder("b", 0.25, 1.0, project="teaching"),
               Holder("c", 0.5, 1.0, project="teaching", idle=True)]
    shares = gpud_project_slices.weighted_shares(holders, 0.1, {"research": 2.0})
    # c keeps a 0.1 probe; the 0.5 left goes 2:1
    assert shares == {"a": pytest.approx(0.25 + 0.4 * 2 / 3), "b": pytest.approx(0.25 + 0.4 / 3),
                      "c": pytest.approx(0.1)}


@pytest.fixture
def weighted(monkeypatch):
    monkeypatch.setenv(gpud_project_slices.WEIGHTS_ENV, "research=3")
    importlib.reload(gpud_project_slices)
    yield gpud_project_slices
    monkeypatch.delenv(gpud_project_slices.WEIGHTS_ENV)
    importlib.reload(gpud_project_slices)


def ask(pm, mode):
    holders = [Holder("a", 0.0, 1.0, project="research"), Holder("b", 0.0, 1.0, project="teaching")]
    return pm.hook.gpud_time_slice_plan(gpu_index=0, mode=mode, holders=holders, probe=0.05)


def test_gpud_asks_the_plugin_before_its_built_in_plan(weighted):
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(weighted, name="project_slices")
    assert ask(pm, "fair") == {"a": pytest.approx(0.75), "b": pytest.approx(0.25)}
    assert ask(pm, "strict") == {"a": pytest.approx(0.5), "b": pytest.approx(0.5)}  # gpud's own, unweighted


def test_without_weights_gpud_plans_as_usual():
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(gpud_project_slices, name="project_slices")
    assert ask(pm, "fair") == {"a": pytest.approx(0.5), "b": pytest.approx(0.5)}


def test_the_installed_distribution_registers_through_the_entry_point():
    from importlib.metadata import entry_points
    names = {ep.name: ep.value for ep in entry_points(group="gpud")}
    if "project_slices" not in names:
        pytest.skip("gpud-project-slices is not installed (pip install ./plugins/gpud-project-slices)")
    assert names["project_slices"] == "gpud_project_slices"
    assert make_plugin_manager().get_plugin("project_slices") is not None
