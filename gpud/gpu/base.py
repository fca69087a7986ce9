"""The GPU backend interface and the values it returns.

Reading GPU use (for slicing, memory policing, idle detection, accounting):

- :meth:`GpuBackend.processes` gives each process on each GPU with its GPU
  memory (GiB) and its utilisation (0-100) since the previous call;
- :meth:`GpuBackend.gpu_usage` gives each GPU as a whole: its utilisation
  (0-100) and the memory used on it (GiB);
- :attr:`GpuBackend.measures` says which of those figures are measured
  (NVML: both; fake GPUs: both, simulated from their processes' CPU use and
  declared memory, see :mod:`gpud.gpu.fakesim`; a figure not measured
  reads 0).

Both calls are cheap enough to make every few seconds from the node
daemon's event loop thread or any other one; a sampler that wants a job's
figures keeps the GPUs of the job's placement and sums or takes the peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

HEALTH_KINDS = ("lost", "ecc_uncorrectable")


class NoGpuError(RuntimeError):
    """The backend found no usable GPU (no driver, no device)."""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU as the node reports it to the controller."""

    index: int
    uuid: str
    model: str
    memory_gib: float
    healthy: bool = True

    def to_json(self) -> dict:
        """The GPU as the node protocol's register/heartbeat ``gpus`` entry."""
        return {"index": self.index, "uuid": self.uuid, "model": self.model,
                "memory_gib": self.memory_gib, "healthy": self.healthy}


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process using a GPU: its memory on that GPU and its share of the GPU's time (0-100)."""

    pid: int
    gpu_index: int
    memory_gib: float
    utilization: float


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """One GPU's use now: utilisation (0-100) and memory used (GiB)."""

    gpu_index: int
    utilization: float
    memory_used_gib: float

    def to_json(self) -> dict:
        """The usage as a JSON object."""
        return {"gpu": self.gpu_index, "utilization": round(self.utilization, 1),
                "memory_used_gib": round(self.memory_used_gib, 3)}


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """A GPU that went bad: ``kind`` is "lost" or "ecc_uncorrectable"."""

    gpu_index: int
    uuid: str
    kind: str
    detail: str = ""


UTILIZATION, MEMORY = "utilization", "memory"  # what a backend can measure of each process on a GPU


class GpuBackend(Protocol):
    """What the node daemon asks of a GPU backend; every call is cheap enough for a heartbeat.

    ``measures`` names what :meth:`processes` truly measures (:data:`UTILIZATION`,
    :data:`MEMORY`): fair time-slicing needs the first to see a job go idle,
    memory policing the second.
    """

    measures: tuple[str, ...]

    def gpus(self) -> tuple[GpuInfo, ...]:
        """Every GPU of the host in index order, each with its current health."""

    def processes(self) -> tuple[GpuProcess, ...]:
        """Every process using a GPU now, with its memory and utilisation."""

    def gpu_usage(self) -> tuple[GpuUsage, ...]:
        """Every healthy GPU's utilisation and memory used, now."""

    def gpu_cpus(self) -> dict[int, tuple[int, ...]]:
        """The CPUs near each GPU (its NUMA node's), by GPU index; {} where the topology is not known."""

    def health_events(self) -> tuple[HealthEvent, ...]:
        """GPUs that became unhealthy since the previous call (each fault reported once)."""

    def close(self) -> None:
        """Release the backend's resources; no call is made after this."""
