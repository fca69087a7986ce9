"""What fake GPUs see of their processes: each process's GPUs, load and memory, measured from /proc.

A process is on a fake GPU when its environment names that GPU's UUID in
``CUDA_VISIBLE_DEVICES`` (as the node sets it for every task), the way a
real process is on the GPUs CUDA lets it see, unless its
``GPUD_CHECKPOINT_DIR`` is another node's (fake UUIDs derive from the node
name, and two test clusters on one host may both have a node "n1"). Its *utilisation* of each of
its GPUs is its CPU use over the last sampling window (100 = one core
busy), so a busy loop is a busy GPU job and a sleeping or frozen one an
idle job. Its *GPU memory* is what it declares, by the stand-ins'
convention: the size of every memory file it holds open whose name starts
with ``fake-gpu-mem`` (``os.memfd_create("fake-gpu-mem")`` then
``os.ftruncate(fd, size)``; :func:`hold_gpu_memory` does it). Such a file
is sparse, so a test can hold "40 GiB" of GPU memory at no cost. The name
``fake-gpu-mem:N`` puts the memory on the process's Nth visible GPU (as
``cuda:N``); without ``:N`` it is on its first. A file held open by two
processes counts once, for the first one found.
"""

from __future__ import annotations

import os
import threading
import time

MEMORY_NAME = "fake-gpu-mem"
_MEMFD_LINK = "/memfd:" + MEMORY_NAME
GIB = 1024 ** 3
YOUNG_S = 5.0  # a process this new may still exec into a GPU job: its environment is read again
RESCAN_AFTER_S = 2.0  # a sampling gap this long: pids may have been reused, everything is read again
MIN_WINDOW_S = 0.05  # utilisation is measured over windows at least this long
_TICKS = os.sysconf("SC_CLK_TCK")


def hold_gpu_memory(size_bytes: int, ordinal: int = 0) -> int:
    """Declare ``size_bytes`` of fake GPU memory on this process's ``ordinal``-th visible GPU; returns the fd.

    Closing the fd (or exiting) frees it; ``os.ftruncate(fd, n)`` resizes it.
    """
    fd = os.memfd_create(MEMORY_NAME if ordinal == 0 else f"{MEMORY_NAME}:{ordinal}")
    os.ftruncate(fd, size_bytes)
    return fd


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


class ProcessScan:
    """Finds the processes on GPUs with ``uuids`` (index order) and measures their load and declared memory."""

    def __init__(self, uuids: list[str], state_dir: str = "") -> None:
        self.index = {uuid: i for i, uuid in enumerate(uuids)}
        # Fake UUIDs derive from the node's name: a task of another fake node of that name on this host (its
        # checkpoint directory in another state directory) is not on these GPUs.
        self.checkpoints = os.path.join(os.path.realpath(state_dir), "checkpoints", "") if state_dir else ""
        self._gpus: dict[int, tuple[int, ...]] = {}  # pid -> the indices of its GPUs (empty: none of ours)
        self._seen_at: dict[int, float] = {}
        self._cpu: dict[int, tuple[float, float]] = {}  # pid -> (when, CPU seconds): the window's start
        self._util: dict[int, float] = {}
        self._sampled = 0.0
        self._lock = threading.Lock()

    def _gpus_of(self, pid: int) -> tuple[int, ...]:
        environ = _read(f"/proc/{pid}/environ")
        if not environ:
            return ()
        found: tuple[int, ...] = ()
        for entry in environ.split(b"\0"):
            if entry.startswith(b"CUDA_VISIBLE_DEVICES="):
                names = entry.split(b"=", 1)[1].decode("ascii", "replace").split(",")
                found = tuple(self.index[name] for name in names if name in self.index)
            elif entry.startswith(b"GPUD_CHECKPOINT_DIR=") and self.checkpoints:
                if not os.path.realpath(entry.split(b"=", 1)[1].decode("utf-8", "replace")).startswith(
                        self.checkpoints):
                    return ()
        return found

    def _cpu_s(self, pid: int) -> float | None:
        data = _read(f"/proc/{pid}/stat")
        if data is None:
            return None
        fields = data[data.rfind(b")") + 2:].split()
        try:
            return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime
        except (IndexError, ValueError):
            return None

    def _utilization(self, pid: int, now: float) -> float | None:
        cpu = self._cpu_s(pid)
        if cpu is None:
            return None
        start = self._cpu.get(pid)
        if start is None:
            self._cpu[pid] = (now, cpu)
            return self._util.setdefault(pid, 0.0)
        if now - start[0] >= MIN_WINDOW_S:
            self._util[pid] = min(100.0, max(0.0, (cpu - start[1]) / (now - start[0]) * 100.0))
            self._cpu[pid] = (now, cpu)
        return self._util.get(pid, 0.0)

    @staticmethod
    def _memory(pid: int, seen: set[tuple[int, int]]) -> dict[int, float]:
        """Declared bytes per ordinal of the process's visible GPUs."""
        found: dict[int, float] = {}
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            return found
        for fd in fds:
            path = os.path.join(fd_dir, fd)
            try:
                target = os.readlink(path)
                if not target.startswith(_MEMFD_LINK):
                    continue
                info = os.stat(path)
            except OSError:
                continue
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            name = target[len("/memfd:"):].split(" ", 1)[0]
            ordinal = name[len(MEMORY_NAME) + 1:] if name.startswith(MEMORY_NAME + ":") else "0"
            if ordinal.isdigit():
                found[int(ordinal)] = found.get(int(ordinal), 0.0) + info.st_size
        return found

    def sample(self) -> list[tuple[int, int, float, float]]:
        """(pid, GPU index, GiB, utilisation %) of every process on one of the GPUs, now; safe across threads."""
        with self._lock:
            return self._sample()

    def _sample(self) -> list[tuple[int, int, float, float]]:
        now = time.monotonic()
        if now - self._sampled > RESCAN_AFTER_S:
            self._gpus = {pid: gpus for pid, gpus in self._gpus.items() if gpus}
            self._seen_at.clear()
        self._sampled = now
        try:
            pids = {int(name) for name in os.listdir("/proc") if name.isdigit()}
        except OSError:
            return []
        for gone in [pid for pid in self._gpus if pid not in pids]:
            self._gpus.pop(gone, None)
            self._seen_at.pop(gone, None)
            self._cpu.pop(gone, None)
            self._util.pop(gone, None)
        for pid in pids:
            if pid not in self._gpus:
                self._seen_at[pid] = now
                self._gpus[pid] = self._gpus_of(pid)
            elif not self._gpus[pid] and now - self._seen_at.get(pid, now) < YOUNG_S:
                self._gpus[pid] = self._gpus_of(pid)
        found = []
        seen: set[tuple[int, int]] = set()
        for pid in sorted(pids):
            gpus = self._gpus.get(pid)
            if not gpus:
                continue
            util = self._utilization(pid, now)
            if util is None:
                continue
            memory = self._memory(pid, seen)
            for ordinal, gpu in enumerate(gpus):
                found.append((pid, gpu, memory.get(ordinal, 0.0) / GIB, util))
        return found
