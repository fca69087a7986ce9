"""gpud-nvlink: the group parsing, the GPU order, and the plugin inside the real scheduler (gpuctl simulate)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gpud_nvlink
from gpud.core.nodes import NodeState
from gpud.model import NodeSpec, TaskRequest
from gpud.plugins import make_plugin_manager, placement_strategies

EIGHT = "0-1-2-3,4-5-6-7"


def node(free: list[float], label: str | None = EIGHT) -> NodeState:
    state = NodeState(NodeSpec("n1", gpus=len(free), labels={"nvlink": label} if label else {}))
    state.free_share[:] = free
    return state


def test_groups_from_the_label() -> None:
    assert gpud_nvlink.parse_groups(EIGHT, 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert gpud_nvlink.parse_groups("0-1, 2-3", 5) == [[0, 1], [2, 3], [4]]
    assert gpud_nvlink.parse_groups("0-1-9,1-x", 2) == [[0, 1]]  # out of range and repeats ignored


def test_a_task_goes_to_one_group_rather_than_the_lowest_free_gpus() -> None:
    # GPUs 1-3 and 4 are busy: the lowest free pair (0, 5) would span the groups.
    free = [1, 0, 0, 0, 0, 1, 1, 1]
    order = gpud_nvlink.gpud_gpu_order("nvlink", TaskRequest(gpus=2), node(free))
    assert order[:2] == [5, 6]


def test_best_fit_keeps_a_roomy_group_whole() -> None:
    free = [1, 0, 0, 0, 1, 1, 1, 1]
    assert gpud_nvlink.gpud_gpu_order("nvlink", TaskRequest(gpus=1), node(free))[0] == 0
    assert gpud_nvlink.gpud_gpu_order("nvlink", TaskRequest(gpus=4), node(free))[:4] == [4, 5, 6, 7]


def test_a_task_no_group_holds_takes_the_roomiest_groups_first() -> None:
    free = [1, 1, 0, 0, 1, 1, 1, 0]
    assert gpud_nvlink.gpud_gpu_order("nvlink", TaskRequest(gpus=4), node(free))[:5] == [4, 5, 6, 0, 1]


def test_other_strategies_fractions_and_unlabelled_nodes_are_left_alone() -> None:
    assert gpud_nvlink.gpud_gpu_order("binpack", TaskRequest(gpus=2), node([1] * 8)) is None
    shared = gpud_nvlink.gpud_gpu_order("nvlink", TaskRequest(gpus=0.5), node([1, 0.5, 1, 1, 1, 1, 1, 1]))
    assert shared[0] == 1  # packed onto the GPU already shared, as bin-pack does
    assert gpud_nvlink.gpud_gpu_order("nvlink", TaskRequest(gpus=2), node([1] * 4, label=None)) == [0, 1, 2, 3]


def test_gpud_finds_the_plugin_through_its_entry_point() -> None:
    pm = make_plugin_manager()
    assert "nvlink" in placement_strategies(pm)
    assert any(getattr(p, "__name__", "") == "gpud_nvlink" for p in pm.get_plugins())


SCENARIO = """\
[policy]
placement = "binpack"
gpu_placement = "{strategy}"

[[policy.projects]]
name = "p"
gpu_quota = 8

[[nodes]]
name = "n1"
gpus = 8
labels = {{ nvlink = "0-1-2-3,4-5-6-7" }}

[[jobs]]
name = "small"
project = "p"
gpus = 3
running_on = ["n1"]
gpu_index = [[1, 2, 3]]

[[jobs]]
name = "one"
project = "p"
gpus = 1
running_on = ["n1"]
gpu_index = [[4]]

[[jobs]]
name = "pair"
project = "p"
gpus = 2
submitted = 10

[expect]
running = ["small", "one", "pair"]
gpu_index = {{ pair = [{expected}] }}
"""


@pytest.mark.parametrize("strategy, expected", [("nvlink", "[5, 6]"), ("binpack", "[0, 5]")])
def test_the_scheduler_places_a_pair_inside_one_group(tmp_path: Path, strategy: str, expected: str) -> None:
    scenario = tmp_path / "nvlink.toml"
    scenario.write_text(SCENARIO.format(strategy=strategy, expected=expected))
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "simulate", str(scenario)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
