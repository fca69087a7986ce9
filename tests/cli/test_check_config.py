"""`gpud check-config` on the shipped example files and on node files."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpud.cli.gpud_main import main
from gpud.node.config import load_node_config

ETC = Path(__file__).resolve().parents[2] / "etc" / "gpud"


def test_the_shipped_examples_pass_as_they_are(capsys: pytest.CaptureFixture) -> None:
    files = [str(ETC / name) for name in ("controller.toml", "node.toml", "policy.toml")]
    assert main(["check-config", *files]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok (") == 3


def test_a_missing_key_file_is_a_warning_for_a_node_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    node = tmp_path / "node.toml"
    node.write_text('cluster_key_file = "nowhere.key"\n')
    assert main(["check-config", str(node)]) == 0
    captured = capsys.readouterr()
    assert f"{node}: ok (node config" in captured.out
    assert "warning" in captured.err and "nowhere.key" in captured.err


def test_a_bad_node_file_is_still_an_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    node = tmp_path / "node.toml"
    node.write_text('cluster_key_file = "k"\nmetrics_listen = "no-port"\n')
    assert main(["check-config", str(node)]) == 1
    assert "metrics_listen" in capsys.readouterr().err


def test_metrics_listen_from_the_file_and_off(tmp_path: Path) -> None:
    node = tmp_path / "node.toml"
    node.write_text('metrics_listen = "0.0.0.0:9400"\n')
    assert load_node_config(str(node)).metrics_listen == "0.0.0.0:9400"
    node.write_text('metrics_listen = "off"\n')
    assert load_node_config(str(node)).metrics_listen == ""
    assert load_node_config(None).metrics_listen == "127.0.0.1:6831"


def test_the_shipped_node_file_puts_no_setting_in_its_labels_table() -> None:
    config = load_node_config(str(ETC / "node.toml"), read_key=False)
    assert dict(config.labels) == {}
    assert config.gpu_backend == "nvml"


MANY_MISTAKES = """\
grace_period = -1
min_runtme = 5

[priority_classes]
nightly = "low"

[[departments]]
name = "research"
gpu_quota = "four"

[[projects]]
name = "vision"
department = "reserch"
gpu_quota = 2
gpu_limit = 1

[[projects]]
name = "vision"

[[projects]]
gpu_quota = 1

[[projects]]
name = "nlp"
priorities = ["trian"]
over_quota_weight = -2
"""


def test_every_mistake_of_a_policy_file_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(MANY_MISTAKES)
    assert main(["check-config", str(policy)]) == 1
    err = capsys.readouterr().err
    expected = ['min_runtme: unknown key; did you mean "min_runtime"?',
                'priority_classes.nightly: expected an integer',
                'departments[1] (name = "research").gpu_quota: expected a number',
                'projects[1] (name = "vision").department: unknown department "reserch"',
                'projects[1] (name = "vision").gpu_limit: gpu_limit (1) is below gpu_quota (2)',
                'projects[2] (name = "vision").name: duplicate name',
                'projects[3].name: is required',
                'projects[4] (name = "nlp").over_quota_weight: must not be negative',
                'projects[4] (name = "nlp").priorities[1]: unknown priority class "trian"',
                'grace_period: must not be negative']
    for mistake in expected:
        assert f"{policy}: {mistake}" in err, (mistake, err)
    assert f"{policy}: 10 mistakes" in err
    assert err.count("gpud check-config:") == 11


def test_each_mistake_is_reported_once_and_a_good_file_after_a_bad_one_still_passes(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad, good = tmp_path / "bad.toml", tmp_path / "good.toml"
    bad.write_text('[[projects]]\nname = "a"\ngpu_quota = -1\n')
    good.write_text('[[projects]]\nname = "a"\n')
    assert main(["check-config", str(bad), str(good)]) == 1
    captured = capsys.readouterr()
    assert captured.err.count("gpu_quota: must not be negative") == 1 and "mistakes" not in captured.err
    assert f"{good}: ok (1 projects" in captured.out


@pytest.mark.parametrize("text", ["", "# nothing but a comment\n", "grace_period = 3\n",
                                  '[[departments]]\nname = "d"\n'])
def test_a_policy_without_projects_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture, text: str) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(text)
    assert main(["check-config", str(policy)]) == 1
    assert "projects: the policy has no projects, so every submit would be refused" in capsys.readouterr().err


def test_a_syntax_error_is_reported_alone(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[[projects]]\nname = "a\n')
    assert main(["check-config", str(policy)]) == 1
    assert capsys.readouterr().err.count("gpud check-config:") == 1
