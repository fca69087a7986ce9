"""The node configuration file: defaults, overrides by flags, and mistakes refused by file and key."""

from __future__ import annotations

import os

import pytest

from gpud.errors import ConfigError
from gpud.node.config import NodeConfig, load_node_config


def write(tmp_path, text: str):
    path = tmp_path / "node.toml"
    path.write_text(text)
    (tmp_path / "cluster.key").write_text("  secret-key \n")
    return str(path)


def test_the_example_file_is_valid_apart_from_its_key_file():
    with pytest.raises(ConfigError, match="cluster_key_file: cannot read the cluster key file /etc/gpud/cluster.key"):
        load_node_config("etc/gpud/node.toml")


def test_file_values_and_relative_paths(tmp_path):
    path = write(tmp_path, 'controller_url = "http://ctl:6830"\ncluster_key_file = "cluster.key"\n'
                           'state_dir = "state"\nrun_dir = "/run/gpud/node"\nname = "gpu-1"\npool = "h100"\ngpu_backend = "fake"\n'
                           'fake_gpus = 4\n[labels]\nrack = "r2"\n')
    config = load_node_config(path)
    assert config.cluster_key == "secret-key"
    assert config.state_dir == str(tmp_path / "state")
    assert config.run_dir == "/run/gpud/node"
    assert (config.name, config.pool, dict(config.labels)) == ("gpu-1", "h100", {"rack": "r2"})
    assert (config.gpu_backend, config.fake_gpus) == ("fake", 4)
    assert config.connect_url == "ws://ctl:6830/api/v1/node/connect"


def test_flags_override_the_file(tmp_path):
    path = write(tmp_path, 'controller_url = "http://ctl:6830"\nname = "a"\n')
    config = load_node_config(path, controller="https://other:1", state_dir=str(tmp_path / "s"), fake_gpus=2,
                              name="b", cluster_key_file=str(tmp_path / "cluster.key"), run_dir="r")
    assert config.connect_url == "wss://other:1/api/v1/node/connect"
    assert (config.name, config.gpu_backend, config.fake_gpus) == ("b", "fake", 2)
    assert config.state_dir == str(tmp_path / "s")
    assert config.run_dir == os.path.abspath("r")


def test_defaults_without_a_file():
    config = load_node_config(None)
    assert config == NodeConfig(name=config.name)
    assert config.gpu_backend == "nvml" and config.cluster_key == ""


@pytest.mark.parametrize(("text", "message"), [
    ("pol = 'x'\n", 'node.toml: pol: unknown key; did you mean "pool"?'),
    ("gpu_backend = 'cuda'\n", 'node.toml: gpu_backend: unknown GPU backend "cuda" (known: fake, nvml)'),
    ("gpu_backend = 'fake'\n", 'node.toml: fake_gpus: is required when gpu_backend = "fake"'),
    ("fake_gpus = -1\n", "node.toml: fake_gpus: must not be negative (got -1)"),
    ("controller_url = 'ctl:6830'\n", "node.toml: controller_url: expected a URL"),
    ("[labels]\nrack = 3\n", "node.toml: labels.rack: expected a string, got an integer (3)"),
    ("name = \n", "node.toml: line 1, column 8: TOML syntax error"),
])
def test_mistakes_are_refused_naming_file_and_key(tmp_path, text, message):
    with pytest.raises(ConfigError) as info:
        load_node_config(write(tmp_path, text))
    assert message in str(info.value)


def test_an_empty_key_file_is_refused(tmp_path):
    (tmp_path / "empty.key").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        load_node_config(None, cluster_key_file=str(tmp_path / "empty.key"))


def test_a_fake_node_reports_a_realistic_host_unless_told_otherwise(tmp_path):
    assert (load_node_config(None, fake_gpus=4).cpus, load_node_config(None, fake_gpus=4).memory_gib) == (32, 256)
    path = write(tmp_path, 'gpu_backend = "fake"\nfake_gpus = 2\ncpus = 6\n')
    config = load_node_config(path)
    assert (config.cpus, config.memory_gib) == (6, 128)
    config = load_node_config(path, cpus=3, memory_gib=12)
    assert (config.cpus, config.memory_gib) == (3, 12)
    assert load_node_config(None).cpus is None  # a real node counts its own CPUs
    with pytest.raises(ConfigError, match="--fake-cpus: must be more than 0"):
        load_node_config(None, fake_gpus=1, cpus=0)
