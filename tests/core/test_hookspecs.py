"""Plugins: every hook is documented, built-ins are ordinary plugins that can be switched off, site plugins load."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap

import pytest

from gpud import hookspecs
from gpud.core import schedule
from gpud.errors import ConfigError
from gpud.model import JobSpec, NodeSpec, Snapshot, TaskRequest
from gpud.plugins import BUILTIN_PLUGINS, make_plugin_manager, placement_strategies, short_name
from gpud.policy import Department, Policy, Project
from gpud.policy_file import parse_policy

HOOKS = sorted(name for name, f in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("gpud_"))


def is_first_result(name: str) -> bool:
    return bool(getattr(hookspecs, name).gpud_spec.get("firstresult"))


def test_hookspecs_declare_hooks():
    assert {"gpud_node_candidates", "gpud_gpu_order", "gpud_victim_order_key", "gpud_can_evict"} <= set(HOOKS)


@pytest.mark.parametrize("name", HOOKS)
def test_every_hook_has_a_docstring(name):
    doc = inspect.getdoc(getattr(hookspecs, name))
    assert doc and len(doc.split()) >= 10, f"{name} needs a docstring saying when it runs and what it returns"


@pytest.mark.parametrize("name", HOOKS)
def test_docstring_says_whether_the_first_result_wins(name):
    doc = inspect.getdoc(getattr(hookspecs, name)).lower()
    if is_first_result(name):
        assert "first result" in doc, f"{name} is firstresult but its docstring does not say so"
    else:
        assert "first result." not in doc, f"{name} is not firstresult but its docstring says it is"


def test_every_hook_spec_is_registered():
    pm = make_plugin_manager()
    for name in HOOKS:
        assert getattr(pm.hook, name).spec is not None, name


@pytest.mark.parametrize("module", BUILTIN_PLUGINS)
def test_builtin_plugins_are_registered_under_their_short_name(module):
    pm = make_plugin_manager()
    plugin = pm.get_plugin(short_name(module))
    assert plugin is not None and getattr(plugin, "__name__", type(plugin).__module__) == module


def test_builtin_strategies_are_known():
    assert {"binpack", "spread"} <= placement_strategies(make_plugin_manager())


def test_a_disabled_builtin_is_not_registered_and_its_strategy_is_unknown():
    pm = make_plugin_manager(disable=["spread"])
    assert pm.get_plugin("spread") is None
    assert pm.get_plugin("binpack") is not None
    known = placement_strategies(pm)
    assert "spread" not in known and "binpack" in known
    with pytest.raises(ConfigError) as caught:
        parse_policy({"placement": "spread"}, "policy.toml", known)
    assert "placement" in str(caught.value) and "spread" in str(caught.value)


def test_a_builtin_can_be_disabled_by_its_full_module_name():
    pm = make_plugin_manager(disable=["gpud.policies.spread"])
    assert "spread" not in placement_strategies(pm)


def test_disabling_an_unknown_plugin_is_a_config_error():
    with pytest.raises(ConfigError) as caught:
        make_plugin_manager(disable=["no-such-plugin"])
    assert "no-such-plugin" in str(caught.value)


# --- a site plugin loaded from a directory ------------------------------------------------------

LASTNODE = textwrap.dedent('''\
    """Places every task on the node whose name sorts last, and on its highest-numbered free GPU."""
    from gpud import hookimpl

    NAME = "lastnode"


    @hookimpl
    def gpud_placement_strategies():
        return [NAME]


    @hookimpl
    def gpud_node_candidates(strategy, request, index):
        if strategy != NAME:
            return None
        return iter(sorted(index.nodes, key=lambda node: node.name, reverse=True))


    @hookimpl
    def gpud_gpu_order(strategy, request, node):
        if strategy != NAME:
            return None
        return list(reversed(range(node.gpus)))
    ''')


@pytest.fixture
def plugin_dir(tmp_path):
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "lastnode.py").write_text(LASTNODE)
    return folder


def three_empty_nodes() -> Snapshot:
    return Snapshot(nodes=tuple(NodeSpec(f"n{i}", gpus=4) for i in (1, 2, 3)),
                    jobs=(JobSpec("j", "p1", TaskRequest(gpus=1)),), now=0.0)


def test_a_plugin_from_a_directory_provides_a_strategy_the_scheduler_uses(plugin_dir):
    pm = make_plugin_manager(directory=plugin_dir)
    assert pm.get_plugin("lastnode") is not None
    assert "lastnode" in placement_strategies(pm)
    policy = parse_policy({"placement": "lastnode", "projects": [{"name": "p1"}]}, "policy.toml",
                          placement_strategies(pm))
    plan = schedule(three_empty_nodes(), policy, pm)
    (bind,) = plan.binds
    assert bind.placement.node == "n3" and bind.placement.gpu_index == (3,)


def test_the_same_cluster_with_binpack_does_not_pick_the_last_node(plugin_dir):
    # Guards the test above: the plugin, not luck, chose n3.
    pm = make_plugin_manager(directory=plugin_dir)
    policy = Policy(departments={"default": Department("default", implicit=True)},
                    projects={"p1": Project("p1")})
    (bind,) = schedule(three_empty_nodes(), policy, pm).binds
    assert (bind.placement.node, bind.placement.gpu_index) != ("n3", (3,))


def test_a_directory_plugin_can_be_disabled_by_file_name(plugin_dir):
    pm = make_plugin_manager(disable=["lastnode"], directory=plugin_dir)
    assert "lastnode" not in placement_strategies(pm)


def test_a_broken_directory_plugin_names_its_file(tmp_path):
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError) as caught:
        make_plugin_manager(directory=tmp_path)
    assert "broken.py" in str(caught.value)


def test_gpuctl_simulate_uses_the_policys_plugin_directory(plugin_dir, tmp_path):
    scenario = tmp_path / "lastnode.toml"
    scenario.write_text(textwrap.dedent(f"""\
        [policy]
        placement = "lastnode"
        [policy.plugins]
        directory = "{plugin_dir}"
        [[policy.projects]]
        name = "p1"
        [[nodes]]
        name = "n1"
        gpus = 2
        [[nodes]]
        name = "n2"
        gpus = 2
        [[jobs]]
        name = "j"
        project = "p1"
        gpus = 1
        [expect]
        placement = {{ j = ["n2"] }}
        gpu_index = {{ j = [[1]] }}
        """))
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "simulate", str(scenario)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
