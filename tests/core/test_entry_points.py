"""Third-party plugins arrive through the ``gpud`` entry-point group, like pytest's and datasette's."""

from __future__ import annotations

import importlib
import textwrap
import tomllib

import pytest

from gpud.core import schedule
from gpud.plugins import make_plugin_manager, placement_strategies
from gpud.scenario import parse_scenario

PLUGIN = '''
from gpud import hookimpl


@hookimpl
def gpud_placement_strategies():
    return ["lastnode"]


@hookimpl
def gpud_node_candidates(strategy, request, index):
    if strategy != "lastnode":
        return None
    return iter(sorted(index.nodes, key=lambda node: node.name, reverse=True))
'''


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch):
    """A distribution gpud-lastnode 0.1 on sys.path, with module gpud_lastnode in the ``gpud`` group."""
    (tmp_path / "gpud_lastnode.py").write_text(PLUGIN)
    info = tmp_path / "gpud_lastnode-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpud-lastnode\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[gpud]\nlastnode = gpud_lastnode\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield "lastnode"


def test_an_installed_plugin_is_found_through_the_entry_point_group(installed_plugin):
    pm = make_plugin_manager()
    assert "lastnode" in placement_strategies(pm)
    sc = parse_scenario(tomllib.loads(textwrap.dedent("""
        [policy]
        placement = "lastnode"
        [[policy.projects]]
        name = "p1"
        [[nodes]]
        name = "a"
        gpus = 4
        [[nodes]]
        name = "z"
        gpus = 4
        [[jobs]]
        name = "j"
        project = "p1"
        gpus = 1
        """)), "<inline>", placement_strategies(pm))
    plan = schedule(sc.snapshot, sc.policy, pm)
    assert [(b.job, b.placement.node) for b in plan.binds] == [("j", "z")]


def test_an_installed_plugin_can_be_disabled_by_its_entry_point_name(installed_plugin):
    pm = make_plugin_manager(disable=["lastnode"])
    assert "lastnode" not in placement_strategies(pm)


def test_entry_points_are_skipped_when_asked(installed_plugin):
    pm = make_plugin_manager(load_entry_points=False)
    assert "lastnode" not in placement_strategies(pm)
