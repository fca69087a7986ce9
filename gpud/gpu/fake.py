"""A fake GPU backend for tests and demos: N GPUs that see their processes, with faults another process sets.

The GPUs are described by the node name and a count, so a node that
restarts sees the same UUIDs. Each GPU's processes, their utilisation and
memory are simulated from the processes themselves (see
:mod:`gpud.gpu.fakesim`: a process is on the GPUs its CUDA_VISIBLE_DEVICES
names, its CPU use is its GPU load, the ``fake-gpu-mem`` memory files it
holds are its GPU memory), so the backend measures both utilisation and
memory, as NVML does. ``GPUD_FAKE_GPU_SIMULATE=0`` in the daemon's
environment turns the simulation off: the GPUs then measure nothing
(``measures`` is empty) and report only injected usage.

Faults and injected per-process usage live in a small JSON file in the
node's state directory (``fake-gpus.json``), written with
:func:`inject_fault` and :func:`set_process_usage`, so a test in another
process can change what the daemon sees; injected usage of a process
replaces what is simulated of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

from gpud.gpu.base import HEALTH_KINDS, MEMORY, UTILIZATION, GpuInfo, GpuProcess, GpuUsage, HealthEvent
from gpud.gpu.fakesim import ProcessScan

SIMULATE_ENV = "GPUD_FAKE_GPU_SIMULATE"

FAULT_FILE = "fake-gpus.json"
MODEL = "NVIDIA A100-SXM4-80GB"
MEMORY_GIB = 80.0


def fake_uuid(node_name: str, index: int) -> str:
    """The stable UUID of fake GPU ``index`` of node ``node_name``, shaped like NVML's."""
    h = hashlib.sha256(f"gpud-fake:{node_name}:{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _path(state_dir: str) -> str:
    return os.path.join(state_dir, FAULT_FILE)


def _read(state_dir: str) -> dict:
    try:
        with open(_path(state_dir), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(state_dir: str, data: dict) -> None:
    os.makedirs(state_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=state_dir, prefix=".fake-gpus.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(data))
    os.replace(tmp, _path(state_dir))


def inject_fault(state_dir: str, gpu_index: int, kind: str = "lost") -> None:
    """Make fake GPU ``gpu_index`` of the node using ``state_dir`` fail: "lost" or "ecc_uncorrectable"."""
    if kind not in HEALTH_KINDS:
        raise ValueError(f"unknown fault {kind!r}; known: {', '.join(HEALTH_KINDS)}")
    data = _read(state_dir)
    data.setdefault("faults", {})[str(gpu_index)] = kind
    _write(state_dir, data)


def clear_faults(state_dir: str) -> None:
    """Make every fake GPU of the node using ``state_dir`` healthy again."""
    data = _read(state_dir)
    data["faults"] = {}
    _write(state_dir, data)


def set_gpu_cpus(state_dir: str, cpus: dict[int, list[int]]) -> None:
    """Declare the fake GPUs' topology: the CPUs near each GPU, e.g. {0: [0, 1], 1: [2, 3]} (GPUs 0 and 1 on two
    NUMA nodes). Without it the topology is unknown and tasks are pinned to the least-used CPUs."""
    data = _read(state_dir)
    data["gpu_cpus"] = {str(gpu): sorted(set(found)) for gpu, found in cpus.items()}
    _write(state_dir, data)


def set_process_usage(state_dir: str, pid: int, gpu_index: int, memory_gib: float,
                      utilization: float) -> None:
    """Make process ``pid`` appear to use ``memory_gib`` and ``utilization`` percent of a fake GPU."""
    data = _read(state_dir)
    entries = [p for p in data.get("processes", []) if (p.get("pid"), p.get("gpu")) != (pid, gpu_index)]
    entries.append({"pid": pid, "gpu": gpu_index, "memory_gib": memory_gib, "utilization": utilization})
    data["processes"] = entries
    _write(state_dir, data)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def simulating() -> bool:
    """Whether fake GPUs simulate their processes' use: yes unless GPUD_FAKE_GPU_SIMULATE is 0/off/no/false."""
    return os.environ.get(SIMULATE_ENV, "1").strip().lower() not in ("0", "off", "no", "false")


class FakeBackend:
    """``count`` A100-like GPUs with UUIDs derived from ``node_name``; faults read from ``state_dir``.

    With ``simulate`` (default: :func:`simulating`) each GPU's processes and
    their use are measured from the processes themselves.
    """

    def __init__(self, node_name: str, count: int, state_dir: str, *, model: str = MODEL,
                 memory_gib: float = MEMORY_GIB, simulate: bool | None = None) -> None:
        if count < 0:
            raise ValueError("the number of fake GPUs must not be negative")
        self.node_name = node_name
        self.count = count
        self.state_dir = state_dir
        self.model = model
        self.memory_gib = memory_gib
        self._reported: set[tuple[int, str]] = set()
        self.simulate = simulating() if simulate is None else simulate
        # Without the simulation it reports only the usage set with set_process_usage: nothing is measured.
        self.measures: tuple[str, ...] = (UTILIZATION, MEMORY) if self.simulate else ()
        self._scan = (ProcessScan([fake_uuid(node_name, i) for i in range(count)], state_dir) if self.simulate
                      else None)

    def _faults(self) -> dict[int, str]:
        faults = {}
        for key, kind in _read(self.state_dir).get("faults", {}).items():
            if str(key).isdigit() and int(key) < self.count and kind in HEALTH_KINDS:
                faults[int(key)] = kind
        return faults

    def gpus(self) -> tuple[GpuInfo, ...]:
        """Every fake GPU; one with an injected fault is unhealthy."""
        faults = self._faults()
        return tuple(GpuInfo(i, fake_uuid(self.node_name, i), self.model, self.memory_gib, i not in faults)
                     for i in range(self.count))

    def processes(self) -> tuple[GpuProcess, ...]:
        """Every process on a fake GPU with its memory and utilisation: simulated, or as a test set it."""
        found: dict[tuple[int, int], GpuProcess] = {}
        if self._scan is not None:
            for pid, gpu, memory_gib, utilization in self._scan.sample():
                found[(pid, gpu)] = GpuProcess(pid, gpu, memory_gib, utilization)
        for entry in _read(self.state_dir).get("processes", []):
            try:
                proc = GpuProcess(int(entry["pid"]), int(entry["gpu"]), float(entry["memory_gib"]),
                                  float(entry["utilization"]))
            except (KeyError, TypeError, ValueError):
                continue
            if 0 <= proc.gpu_index < self.count and _alive(proc.pid):
                found[(proc.pid, proc.gpu_index)] = proc
        return tuple(found.values())

    def gpu_cpus(self) -> dict[int, tuple[int, ...]]:
        """The topology declared with :func:`set_gpu_cpus`; {} (unknown) when none was."""
        found: dict[int, tuple[int, ...]] = {}
        declared = _read(self.state_dir).get("gpu_cpus")
        for key, cpus in (declared.items() if isinstance(declared, dict) else ()):
            if str(key).isdigit() and int(key) < self.count and isinstance(cpus, list) \
                    and all(isinstance(c, int) and c >= 0 for c in cpus):
                found[int(key)] = tuple(cpus)
        return found

    def gpu_usage(self) -> tuple[GpuUsage, ...]:
        """Each fake GPU's utilisation (its processes' sum, at most 100) and memory used (their sum)."""
        util = [0.0] * self.count
        memory = [0.0] * self.count
        for proc in self.processes():
            util[proc.gpu_index] += proc.utilization
            memory[proc.gpu_index] += proc.memory_gib
        return tuple(GpuUsage(i, min(100.0, util[i]), memory[i]) for i in range(self.count))

    def health_events(self) -> tuple[HealthEvent, ...]:
        """Faults injected since the previous call; a cleared fault may be reported again later."""
        faults = self._faults()
        current = {(i, kind) for i, kind in faults.items()}
        new = sorted(current - self._reported)
        self._reported = current
        return tuple(HealthEvent(i, fake_uuid(self.node_name, i), kind, "injected fault") for i, kind in new)

    def close(self) -> None:
        """Nothing to release."""
