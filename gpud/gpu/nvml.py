"""The NVML GPU backend: the only module of gpud that imports pynvml."""

from __future__ import annotations

import os
import time

import pynvml

from gpud.gpu.base import MEMORY, UTILIZATION, GpuInfo, GpuProcess, GpuUsage, HealthEvent, NoGpuError

GIB = 1024 ** 3


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlBackend:
    """The host's NVIDIA GPUs as NVML sees them; lost GPUs and uncorrectable ECC errors make a GPU unhealthy."""

    measures: tuple[str, ...] = (UTILIZATION, MEMORY)

    def __init__(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NoGpuError(f"NVML could not start ({exc}): no NVIDIA driver or GPU on this host") from None
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            pynvml.nvmlShutdown()
            raise NoGpuError(f"NVML could not count the GPUs: {exc}") from None
        if count == 0:
            pynvml.nvmlShutdown()
            raise NoGpuError("NVML found no GPU on this host")
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        # UUID, model and memory are read once: a lost GPU can no longer answer them.
        self._static = [self._describe(i, h) for i, h in enumerate(self._handles)]
        self._bad: dict[int, str] = {}
        self._reported: set[tuple[int, str]] = set()
        self._util_since = 0
        self._cpus = self._affinity()

    def _affinity(self) -> dict[int, tuple[int, ...]]:
        """Each GPU's ideal CPUs as NVML reports them (a bit mask in 64-bit words), read once."""
        words = max(1, -(-(os.cpu_count() or 1) // 64))
        found: dict[int, tuple[int, ...]] = {}
        for index, handle in enumerate(self._handles):
            try:
                mask = pynvml.nvmlDeviceGetCpuAffinity(handle, words)
            except pynvml.NVMLError:
                continue
            cpus = tuple(w * 64 + bit for w, word in enumerate(mask) for bit in range(64) if int(word) >> bit & 1)
            if cpus:
                found[index] = cpus
        return found

    @staticmethod
    def _describe(index: int, handle) -> GpuInfo:
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total / GIB
        return GpuInfo(index, _text(pynvml.nvmlDeviceGetUUID(handle)), _text(pynvml.nvmlDeviceGetName(handle)),
                       round(memory, 2))

    def _check(self, index: int) -> None:
        handle = self._handles[index]
        try:
            errors = pynvml.nvmlDeviceGetTotalEccErrors(handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                        pynvml.NVML_VOLATILE_ECC)
            if errors > 0:
                self._bad.setdefault(index, "ecc_uncorrectable")
        except pynvml.NVMLError_GpuIsLost:
            self._bad[index] = "lost"
        except pynvml.NVMLError:
            pass  # GPUs without ECC answer NotSupported; that is not a fault.

    def gpus(self) -> tuple[GpuInfo, ...]:
        """Every GPU with its health, checked now (lost, uncorrectable ECC errors)."""
        for index in range(len(self._handles)):
            self._check(index)
        return tuple(GpuInfo(g.index, g.uuid, g.model, g.memory_gib, g.index not in self._bad)
                     for g in self._static)

    def processes(self) -> tuple[GpuProcess, ...]:
        """Compute processes on each healthy GPU with their memory and SM utilisation since the last call."""
        found = []
        since, self._util_since = self._util_since, int(time.time() * 1e6)
        for index, handle in enumerate(self._handles):
            if index in self._bad:
                continue
            try:
                running = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except pynvml.NVMLError:
                continue
            util = {}
            try:
                for sample in pynvml.nvmlDeviceGetProcessUtilization(handle, since):
                    util[sample.pid] = float(sample.smUtil)
            except pynvml.NVMLError:
                pass  # NotFound when no sample is newer than ``since``.
            for proc in running:
                used = proc.usedGpuMemory or 0
                found.append(GpuProcess(proc.pid, index, used / GIB, util.get(proc.pid, 0.0)))
        return tuple(found)

    def gpu_cpus(self) -> dict[int, tuple[int, ...]]:
        """The CPUs NVML names as each GPU's ideal affinity (its NUMA node's)."""
        return dict(self._cpus)

    def gpu_usage(self) -> tuple[GpuUsage, ...]:
        """Each healthy GPU's utilisation over NVML's last sample period and its memory used now."""
        found = []
        for index, handle in enumerate(self._handles):
            if index in self._bad:
                continue
            try:
                rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
                used = pynvml.nvmlDeviceGetMemoryInfo(handle).used
            except pynvml.NVMLError:
                continue
            found.append(GpuUsage(index, float(rates.gpu), used / GIB))
        return tuple(found)

    def health_events(self) -> tuple[HealthEvent, ...]:
        """GPUs found lost or with uncorrectable ECC errors since the previous call."""
        self.gpus()
        new = sorted(set(self._bad.items()) - self._reported)
        self._reported.update(new)
        return tuple(HealthEvent(i, self._static[i].uuid, kind, "reported by NVML") for i, kind in new)

    def close(self) -> None:
        """Shut NVML down."""
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
