"""GPU backends: what the node daemon knows about its GPUs, from NVML or from a fake."""

from __future__ import annotations

from gpud.gpu.base import GpuBackend, GpuInfo, GpuProcess, GpuUsage, HealthEvent, NoGpuError

BACKENDS = ("nvml", "fake")

__all__ = ["BACKENDS", "GpuBackend", "GpuInfo", "GpuProcess", "GpuUsage", "HealthEvent", "NoGpuError", "make_backend"]


def make_backend(kind: str, *, node_name: str, state_dir: str, fake_gpus: int = 0) -> GpuBackend:
    """Open the backend named ``kind`` ("nvml" or "fake").

    The fake backend has ``fake_gpus`` GPUs whose UUIDs derive from
    ``node_name``, with its fault file in ``state_dir``. The NVML backend
    raises NoGpuError when there is no driver or no GPU.
    """
    if kind == "fake":
        from gpud.gpu.fake import FakeBackend
        return FakeBackend(node_name, fake_gpus, state_dir)
    if kind == "nvml":
        from gpud.gpu.nvml import NvmlBackend
        return NvmlBackend()
    raise ValueError(f"unknown GPU backend {kind!r}; known: {', '.join(BACKENDS)}")
