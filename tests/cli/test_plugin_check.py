"""A plugin that implements no gpud hook (a misspelt name) is refused when the plugins load, naming itself."""

from __future__ import annotations

import importlib
import textwrap
from pathlib import Path

import pytest

from gpud.cli.gpud_main import main
from gpud.controller.service import load_policy_and_plugins
from gpud.errors import ConfigError
from gpud.plugins import make_plugin_manager

MISSPELT = textwrap.dedent('''\
    """Meant to keep work off nodes under maintenance; the hook's name lacks its last letter."""
    from gpud import hookimpl


    @hookimpl
    def gpud_filter_nod(job, node):
        return "node is under maintenance" if node.labels.get("maintenance") == "yes" else None
    ''')

CORRECT = MISSPELT.replace("gpud_filter_nod(", "gpud_filter_node(")

WRONG_ARGUMENT = MISSPELT.replace("gpud_filter_nod(job, node)", "gpud_filter_node(job, node, pool)")


def policy_with_plugins(folder: Path) -> Path:
    policy = folder / "policy.toml"
    policy.write_text(textwrap.dedent(f"""\
        [plugins]
        directory = "{folder / 'plugins'}"
        [[projects]]
        name = "p1"
        """))
    return policy


@pytest.fixture
def site(tmp_path: Path) -> Path:
    (tmp_path / "plugins").mkdir()
    return tmp_path


def test_a_misspelt_hook_in_a_site_plugin_is_refused_naming_plugin_hook_and_file(site: Path) -> None:
    (site / "plugins" / "maintenance.py").write_text(MISSPELT)
    with pytest.raises(ConfigError) as caught:
        make_plugin_manager(directory=site / "plugins")
    message = str(caught.value)
    assert "'maintenance'" in message and "'gpud_filter_nod'" in message
    assert str(site / "plugins" / "maintenance.py") in message
    assert "did you mean 'gpud_filter_node'" in message


def test_the_same_plugin_spelt_right_loads(site: Path) -> None:
    # Guards the test above: the name, nothing else, is what is refused.
    (site / "plugins" / "maintenance.py").write_text(CORRECT)
    pm = make_plugin_manager(directory=site / "plugins")
    assert pm.get_plugin("maintenance") is not None
    assert len(pm.hook.gpud_filter_node.get_hookimpls()) == 1


def test_the_controller_refuses_to_start_on_a_policy_whose_plugin_is_misspelt(site: Path) -> None:
    (site / "plugins" / "maintenance.py").write_text(MISSPELT)
    with pytest.raises(ConfigError) as caught:
        load_policy_and_plugins(str(policy_with_plugins(site)))
    assert "'gpud_filter_nod'" in str(caught.value)


def test_check_config_reports_the_misspelt_hook(site: Path, capsys: pytest.CaptureFixture) -> None:
    (site / "plugins" / "maintenance.py").write_text(MISSPELT)
    policy = policy_with_plugins(site)
    assert main(["check-config", str(policy)]) == 1
    err = capsys.readouterr().err
    assert "maintenance" in err and "gpud_filter_nod" in err


def test_a_hook_with_an_argument_it_does_not_have_is_refused_naming_the_plugin(site: Path) -> None:
    (site / "plugins" / "maintenance.py").write_text(WRONG_ARGUMENT)
    with pytest.raises(ConfigError) as caught:
        make_plugin_manager(directory=site / "plugins")
    message = str(caught.value)
    assert "'maintenance'" in message and "pool" in message


def test_an_installed_plugin_with_a_misspelt_hook_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gpud_maintenance.py").write_text(MISSPELT)
    info = tmp_path / "gpud_maintenance-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpud-maintenance\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[gpud]\nmaintenance = gpud_maintenance\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    with pytest.raises(ConfigError) as caught:
        make_plugin_manager()
    message = str(caught.value)
    assert "'maintenance'" in message and "'gpud_filter_nod'" in message
    assert make_plugin_manager(disable=["maintenance"]).get_plugin("maintenance") is None
