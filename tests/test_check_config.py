"""`gpud check-config` on the shipped example files and on node files."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpud.cli.gpud_main import main
from gpud.node.config import load_node_config

ETC = Path(__file__).resolve().parent.parent / "etc" / "gpud"


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
