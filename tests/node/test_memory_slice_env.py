"""A memory slice reaches the job (environment, PyTorch startup hook); the slice manager asks the plan hook."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pluggy

from gpud import hookimpl, hookspecs
from gpud.node.slicemgr import SliceManager
from gpud.node.slicer import Holder
from gpud.node.spec import STARTUP_HOOK_DIR, TaskSpec, sharing_env
from gpud.node.taskstate import Layout

FAKE_TORCH = textwrap.dedent('''\
    import os
    calls = []
    class cuda:
        @staticmethod
        def is_available():
            return True
        @staticmethod
        def device_count():
            return 2
        @staticmethod
        def set_per_process_memory_fraction(fraction, device):
            calls.append((fraction, device))
    ''')


def run_python(code: str, tmp_path, env_extra: dict) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", ""), **env_extra}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)


def slice_env(tmp_path, other_path: str) -> dict:
    spec = TaskSpec.decode({"user": "u", "workdir": "/", "command": ["x"], "gpu_indices": [0],
                       "memory_slice": {"limit_mib": 20480, "fraction": 0.25}})
    return sharing_env(spec, other_path)


def test_torch_is_capped_to_the_slice_on_import(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "torch.py").write_text(FAKE_TORCH)
    env = slice_env(tmp_path, str(tmp_path / "lib"))
    assert env["PYTHONPATH"].split(os.pathsep) == [STARTUP_HOOK_DIR, str(tmp_path / "lib")]
    result = run_python("import torch; print(torch.calls)", tmp_path, env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[(0.25, 0), (0.25, 1)]"


def test_the_sites_own_sitecustomize_still_runs(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text("import builtins\nbuiltins.SITE_RAN = True\n")
    env = slice_env(tmp_path, str(tmp_path / "site"))
    result = run_python("print(SITE_RAN)", tmp_path, env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_a_job_without_torch_is_not_bothered(tmp_path):
    result = run_python("import json; print('ok')", tmp_path, slice_env(tmp_path, ""))
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_no_slice_no_variables():
    spec = TaskSpec.decode({"user": "u", "workdir": "/", "command": ["x"]})
    assert sharing_env(spec) == {}


class HalfToFirst:
    @hookimpl
    def gpud_time_slice_plan(self, gpu_index, mode, holders, probe):
        return {holders[0].key: 0.9, holders[1].key: 0.1}


def test_the_slice_manager_asks_the_plan_hook(tmp_path):
    pm = pluggy.PluginManager("gpud")
    pm.add_hookspecs(hookspecs)
    manager = SliceManager(Layout(str(tmp_path)), None, None)
    holders = [Holder("a", 0.5, 0.5), Holder("b", 0.5, 0.5)]
    assert manager._shares(0, "strict", holders, 0.05) == {"a": 0.5, "b": 0.5}
    pm.register(HalfToFirst())
    manager.pm = pm
    assert manager._shares(0, "strict", holders, 0.05) == {"a": 0.9, "b": 0.1}


class Broken:
    @hookimpl
    def gpud_time_slice_plan(self, gpu_index, mode, holders, probe):
        raise RuntimeError("boom")


def test_a_failing_plan_hook_falls_back_to_the_built_in_plan(tmp_path):
    pm = pluggy.PluginManager("gpud")
    pm.add_hookspecs(hookspecs)
    pm.register(Broken())
    manager = SliceManager(Layout(str(tmp_path)), None, pm)
    holders = [Holder("a", 0.25, 0.25), Holder("b", 0.75, 0.75)]
    assert manager._shares(0, "strict", holders, 0.05) == {"a": 0.25, "b": 0.75}
