"""The fake GPU backend: stable UUIDs, faults and usage set from another process, and the NVML backend's refusal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from gpud.gpu import NoGpuError, make_backend
from gpud.gpu.fake import FakeBackend, clear_faults, fake_uuid, inject_fault, set_process_usage
from programs import FOREVER
from waiting import poll


def test_uuids_are_stable_per_node_and_index(tmp_path):
    first = FakeBackend("n1", 4, str(tmp_path)).gpus()
    again = FakeBackend("n1", 4, str(tmp_path)).gpus()
    other = FakeBackend("n2", 4, str(tmp_path)).gpus()
    assert [g.uuid for g in first] == [g.uuid for g in again]
    assert len({g.uuid for g in first} | {g.uuid for g in other}) == 8
    assert [g.index for g in first] == [0, 1, 2, 3]
    assert all(g.uuid.startswith("GPU-") and g.healthy and g.memory_gib == 80.0 and "A100" in g.model
               for g in first)
    assert first[2].uuid == fake_uuid("n1", 2)


def test_fault_injected_from_another_process_is_seen_once(tmp_path):
    backend = make_backend("fake", node_name="n1", state_dir=str(tmp_path), fake_gpus=2)
    assert backend.health_events() == ()
    subprocess.run([sys.executable, "-c", "import sys; from gpud.gpu.fake import inject_fault; "
                    "inject_fault(sys.argv[1], 1, 'ecc_uncorrectable')", str(tmp_path)], check=True)
    assert [g.healthy for g in backend.gpus()] == [True, False]
    (event,) = backend.health_events()
    assert (event.gpu_index, event.kind, event.uuid) == (1, "ecc_uncorrectable", fake_uuid("n1", 1))
    assert backend.health_events() == ()
    inject_fault(str(tmp_path), 0, "lost")
    assert [e.kind for e in backend.health_events()] == ["lost"]
    clear_faults(str(tmp_path))
    assert all(g.healthy for g in backend.gpus())


def test_unknown_fault_kind_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown fault"):
        inject_fault(str(tmp_path), 0, "melted")


def test_process_usage_is_reported_for_live_processes_only(tmp_path):
    backend = FakeBackend("n1", 2, str(tmp_path), simulate=False)
    child = subprocess.Popen(["sleep", "30"])
    try:
        set_process_usage(str(tmp_path), child.pid, 1, 12.5, 70.0)
        set_process_usage(str(tmp_path), os.getpid(), 0, 1.0, 5.0)
        set_process_usage(str(tmp_path), child.pid, 1, 20.0, 90.0)
        usage = {(p.pid, p.gpu_index): (p.memory_gib, p.utilization) for p in backend.processes()}
        assert usage == {(child.pid, 1): (20.0, 90.0), (os.getpid(), 0): (1.0, 5.0)}
    finally:
        child.kill()
        child.wait()
    assert [p.pid for p in backend.processes()] == [os.getpid()]


def test_nvml_without_a_driver_says_no_gpu(tmp_path):
    try:
        backend = make_backend("nvml", node_name="n1", state_dir=str(tmp_path))
    except NoGpuError as exc:
        assert "GPU" in str(exc)
    else:
        backend.close()
        pytest.skip("this host has NVIDIA GPUs")


def test_only_the_nvml_module_imports_pynvml():
    import ast
    import gpud
    root = os.path.dirname(gpud.__file__)
    importers = []
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                tree = ast.parse(open(path, encoding="utf-8").read())
                for node in ast.walk(tree):
                    names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                             else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                    if any(n.split(".")[0] == "pynvml" for n in names):
                        importers.append(os.path.relpath(path, root))
    assert importers == [os.path.join("gpu", "nvml.py")]


BUSY_WITH_MEMORY = ("import os, sys, time\n"
                    "from gpud.gpu.fakesim import hold_gpu_memory\n"
                    "fd = hold_gpu_memory(3 << 30)\n"
                    "other = hold_gpu_memory(1 << 30, ordinal=1)\n"
                    "print('ready', flush=True)\n"
                    "if sys.argv[1] == 'busy':\n"
                    "    while True: pass\n" + FOREVER)


def on_gpus(uuids: list[str], mode: str, **extra: str) -> subprocess.Popen:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(uuids), **extra}
    child = subprocess.Popen([sys.executable, "-c", BUSY_WITH_MEMORY, mode], env=env, stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"ready\n"
    return child


def usage_after(backend: FakeBackend, seconds: float) -> dict:
    backend.processes()
    time.sleep(seconds)
    return {(p.pid, p.gpu_index): (round(p.memory_gib, 2), p.utilization) for p in backend.processes()}


def test_fake_gpus_see_their_processes_load_and_declared_memory(tmp_path):
    name = f"sim-{os.getpid()}"  # no other test's processes are on this node's GPUs
    backend = FakeBackend(name, 3, str(tmp_path), simulate=True)
    assert backend.measures == ("utilization", "memory")
    busy = on_gpus([fake_uuid(name, 2), fake_uuid(name, 0)], "busy")
    idle = on_gpus([fake_uuid(name, 1), fake_uuid("other-node", 0)], "idle")
    # A task of another node of that name (its checkpoint directory in another state directory) is not on them.
    elsewhere = on_gpus([fake_uuid(name, 1)], "idle",
                        GPUD_CHECKPOINT_DIR=str(tmp_path / "other" / "checkpoints" / "x"))
    try:
        usage = usage_after(backend, 0.5)
        # The busy one: 3 GiB on its first visible GPU (fake GPU 2), 1 GiB on its second (GPU 0), busy on both.
        assert {k: v[0] for k, v in usage.items()} == {(busy.pid, 2): 3.0, (busy.pid, 0): 1.0, (idle.pid, 1): 3.0}
        # Busy is what the process's CPU time says: on a loaded host (other test workers) it gets a share of a core.
        assert usage[(busy.pid, 2)][1] > 5 and usage[(busy.pid, 0)][1] > 5, usage
        assert usage[(idle.pid, 1)][1] < 1.0, usage
        by_gpu = {u.gpu_index: u for u in backend.gpu_usage()}
        assert [round(by_gpu[i].memory_used_gib, 2) for i in range(3)] == [1.0, 3.0, 3.0]
        assert by_gpu[1].utilization < 1.0 <= by_gpu[2].utilization <= 100.0
        os.kill(busy.pid, signal.SIGSTOP)  # a frozen job is an idle GPU
        assert poll(lambda: all(p.utilization == 0.0 for p in backend.processes() if p.pid == busy.pid), 10, 0.1)
    finally:
        for child in (busy, idle, elsewhere):
            child.kill()
            child.wait()
    assert backend.processes() == ()


def test_without_the_simulation_fake_gpus_measure_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUD_FAKE_GPU_SIMULATE", "0")
    backend = FakeBackend("n1", 1, str(tmp_path))
    assert backend.measures == ()
    busy = on_gpus([fake_uuid("n1", 0)], "busy")
    try:
        assert usage_after(backend, 0.2) == {}  # not even processes of other tests on an "n1"
    finally:
        busy.kill()
        busy.wait()
