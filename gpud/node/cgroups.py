"""A cgroup per task: its memory, CPU, cpuset and pids limits, only its own GPU devices, and every process it made.

The supervisor makes a task's cgroups before it starts the task and starts
the task inside them, so nothing the task ever forks can be outside them:
a thread of its own steps into the v1 groups, forks the task and steps
out (``gpud.node.cgspawn``); on a v2 host the supervisor steps into the
group for the fork, then back out. Stopping the task signals
and then kills every process in them, whatever left the process group
(setsid, double forks, ``env -i``, nohup, respawners); they are removed
once empty, after their peak memory and CPU time are read.

Where each part comes from:

- cgroup v1 hierarchies (``/sys/fs/cgroup/<controller>``), one directory
  per task in each of memory, cpu, cpuacct, cpuset, pids, devices and
  freezer that the host mounts writable; on a hybrid host these alone (its
  v2 mount, ``/sys/fs/cgroup/unified``, has no controllers: a group there
  would limit nothing, and joining it would cost each task start a move of
  the whole supervisor);
- on a pure v2 host (``/sys/fs/cgroup`` itself), one directory with the
  memory, cpu, cpuset and pids controllers enabled from the group's parent.
- GPU isolation is the v1 devices controller: every device denied but the
  usual pseudo-devices and the task's own ``/dev/nvidia<minor>`` (plus
  nvidiactl and the nvidia-uvm and -modeset devices). Without it (a pure v2
  host), an eBPF device program on the task's v2 group allows of the NVIDIA
  devices only the task's own and the control devices, as systemd's
  DeviceAllow= and Slurm's cgroup/v2 plugin do (``devfilter``); where the
  kernel loads no such program, GPU isolation is reported as not enforced.

``GPUD_CGROUPS=off`` in the daemon's environment runs tasks without cgroups.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import signal
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from gpud.node import devfilter
from gpud.node.cgspawn import Refused, Spawner

ROOT = "/sys/fs/cgroup"
GROUP = "gpud"
CGROUPS_ENV = "GPUD_CGROUPS"
V1_CONTROLLERS = ("memory", "cpu", "cpuacct", "cpuset", "pids", "devices", "freezer")
V2_CONTROLLERS = ("memory", "cpu", "cpuset", "pids")
CPU_PERIOD_US = 100_000
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR, NVIDIA_MODESET_MINOR = 255, 254
# Devices every task may use: null, zero, full, random, urandom, tty, console, ptmx, the ptys and /dev/pts.
BASIC_DEVICES = ("c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm", "c 5:0 rwm", "c 5:1 rwm",
                 "c 5:2 rwm", "c 136:* rwm", "c 4:* rwm")
LIMITS = ("memory", "cpu", "cpuset", "pids", "devices")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Hierarchies:
    """Where this host lets us make task cgroups: v1 controller to group directory, and a v2 group directory."""

    v1: dict[str, str] = field(default_factory=dict)
    v2: str | None = None
    v2_controllers: frozenset[str] = frozenset()
    device_programs: bool = False  # GPU isolation by an eBPF program on the v2 group (no v1 devices controller)

    def enforced(self) -> tuple[str, ...]:
        """Which limits hold (of memory, cpu, cpuset, pids, devices); empty: none, tasks run as without cgroups."""
        return tuple(name for name in LIMITS if name in self.v1 or name in self.v2_controllers
                     or (name == "devices" and self.device_programs))

    def tracked(self) -> bool:
        """True when every process of a task can be found (and killed) through its cgroups."""
        return bool(self.v1) or self.v2 is not None


def _writable_dir(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK)


def detect(root: str = ROOT) -> Hierarchies:
    """The hierarchies a task cgroup can use on this host; none when GPUD_CGROUPS=off or we may not write."""
    if os.environ.get(CGROUPS_ENV) == "off" or os.geteuid() != 0:
        return Hierarchies()
    if os.path.exists(os.path.join(root, "cgroup.controllers")):  # a pure v2 host
        base = os.path.join(root, GROUP)
        try:
            os.makedirs(base, exist_ok=True)
            available = set(_read(os.path.join(root, "cgroup.controllers")).split())
            wanted = [c for c in V2_CONTROLLERS if c in available]
            _write(os.path.join(root, "cgroup.subtree_control"), " ".join(f"+{c}" for c in wanted))
            _write(os.path.join(base, "cgroup.subtree_control"), " ".join(f"+{c}" for c in wanted))
            enabled = set(_read(os.path.join(base, "cgroup.subtree_control")).split())
        except OSError:
            return Hierarchies()
        return Hierarchies(v2=base, v2_controllers=frozenset(enabled), device_programs=devfilter.usable())
    v1 = {}
    for controller in V1_CONTROLLERS:
        path = os.path.join(root, controller)
        if _writable_dir(path) and os.path.exists(os.path.join(path, "cgroup.procs")):
            base = os.path.join(path, GROUP)
            try:
                os.makedirs(base, exist_ok=True)
                if controller == "cpuset":
                    _inherit_cpuset(base)
            except OSError:
                continue
            v1[controller] = base
    if "devices" in v1:
        try:  # the node's group allows the usual devices and every GPU; each task's group narrows that
            if "a *:* rwm" in _read(os.path.join(v1["devices"], "devices.list")).splitlines():
                _write(os.path.join(v1["devices"], "devices.deny"), "a")  # refused while it has children
            _write(os.path.join(v1["devices"], "devices.allow"), *BASIC_DEVICES, f"c {NVIDIA_MAJOR}:* rwm",
                   *(f"c {major}:* rwm" for major in _uvm_majors()))
        except OSError:
            del v1["devices"]
    if v1:  # the v1 groups track, freeze, kill and time every process; a v2 mount beside them has no controllers
        return Hierarchies(v1=v1)
    unified = os.path.join(root, "unified")
    v2 = None
    if _writable_dir(unified) and os.path.exists(os.path.join(unified, "cgroup.procs")):
        try:
            os.makedirs(os.path.join(unified, GROUP), exist_ok=True)
            v2 = os.path.join(unified, GROUP)
        except OSError:
            pass
    return Hierarchies(v2=v2, device_programs=v2 is not None and devfilter.usable())


_detected: Hierarchies | None = None


def host() -> Hierarchies:
    """This host's hierarchies, found once per process."""
    global _detected
    if _detected is None:
        _detected = detect()
    return _detected


def limits_report(hierarchies: Hierarchies | None = None) -> dict:
    """What this node's task cgroups enforce, for its register message: ``{"enforced": [...], "how": ...}``."""
    found = host() if hierarchies is None else hierarchies
    kinds = [kind for kind, present in (("cgroup v1", bool(found.v1)),
                                        ("cgroup v2", bool(found.v2_controllers))) if present]
    if found.v2 and not found.v2_controllers:
        kinds.append("cgroup v2 (cgroup.kill)")
    if found.device_programs:
        kinds.append("eBPF device program")
    return {"enforced": list(found.enforced()), "how": ", ".join(kinds) or "none"}


def _read(path: str) -> str:
    """The text of the cgroup file at ``path``, stripped (read in one call: these files are small)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, 1 << 16)
        while len(data) % (1 << 16) == 0 and data:  # a long list (cgroup.procs of a big task)
            more = os.read(fd, 1 << 16)
            if not more:
                break
            data += more
    finally:
        os.close(fd)
    return data.decode("ascii").strip()


def _write(path: str, *values: str) -> None:
    """Write each value to the cgroup file at ``path`` in a write of its own (one rule, one limit)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        for value in values:
            os.write(fd, value.encode())
    finally:
        os.close(fd)


def _inherit_cpuset(path: str) -> None:
    """A new v1 cpuset has no CPUs or memory nodes: give it its parent's, so processes may join it."""
    parent = os.path.dirname(path)
    for name in ("cpuset.cpus", "cpuset.mems"):
        if not _read(os.path.join(path, name)):
            _write(os.path.join(path, name), _read(os.path.join(parent, name)))


_parent_cpusets: dict[str, tuple[str, str]] = {}
_no_swap_accounting: set[str] = set()  # memory hierarchies' node groups whose tasks' groups have no memsw files


def _set_cpuset(path: str, cpus: str | None) -> None:
    """Give the new v1 cpuset at ``path`` its parent's memory nodes and ``cpus`` (None: its parent's CPUs).

    The parent's values are read once and kept: a task start then writes
    two files and reads none. Should the host have changed them since (a
    CPU taken offline), the write is refused, and they are read again.
    """
    parent = os.path.dirname(path)
    for attempt in (0, 1):
        known = _parent_cpusets.get(parent)
        if known is None or attempt:
            known = _parent_cpusets[parent] = (_read(os.path.join(parent, "cpuset.cpus")),
                                               _read(os.path.join(parent, "cpuset.mems")))
        try:
            _write(os.path.join(path, "cpuset.mems"), known[1])
            _write(os.path.join(path, "cpuset.cpus"), cpus or known[0])
            return
        except OSError:
            if attempt:
                raise


@dataclass(frozen=True, slots=True)
class Limits:
    """What a task may use: bytes of memory, CPUs (a quota), which CPUs, and its GPUs' device minors."""

    memory_bytes: int | None = None
    cpus: float | None = None
    cpuset: str | None = None
    gpu_minors: tuple[int, ...] | None = None  # None: no device isolation (a CPU-only task gets ())
    pids_max: int | None = None  # None: processes counted, not capped


def cgroup_name(tasks_dir: str, dirname: str) -> str:
    """A task's cgroup name, unique on the host: the task's directory name and its node's tasks directory."""
    return f"{_tag(tasks_dir)}-{dirname}"


@functools.lru_cache(maxsize=64)
def _tag(tasks_dir: str) -> str:
    return hashlib.sha1(os.path.realpath(tasks_dir).encode()).hexdigest()[:10]


def _mkdir(path: str) -> None:
    """Make the cgroup directory ``path`` (one call; its parent, the node's group, too when it went away)."""
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(path, exist_ok=True)


def cpu_quota_us(cpus: float) -> int:
    """The CPU time (us) a task of ``cpus`` CPUs may run per period of CPU_PERIOD_US (1 ms at least)."""
    return max(1000, int(cpus * CPU_PERIOD_US))


class TaskCgroup:
    """One task's cgroups (a directory named ``name`` in each hierarchy); every call tolerates a vanished group."""

    def __init__(self, name: str, hierarchies: Hierarchies, skip: tuple[str, ...] = (),
                 starter: int | None = None) -> None:
        self.name = name
        self.hierarchies = hierarchies
        # The process that starts tasks in these groups (this one, unless told): listed in them while one of its
        # threads forks a task there (gpud.node.cgspawn), and never one of the task's processes.
        self.starter = os.getpid() if starter is None else starter
        self.v1 = {c: os.path.join(base, name) for c, base in hierarchies.v1.items() if c not in skip}
        self.v2 = os.path.join(hierarchies.v2, name) if hierarchies.v2 else None

    def paths(self) -> list[str]:
        """Every directory of the task's cgroups."""
        return [*self.v1.values(), *([self.v2] if self.v2 else [])]

    def create(self, limits: Limits, *, v1_ready: bool = False) -> None:
        """Make the directories and set the limits; OSError when the host refuses.

        ``v1_ready``: the v1 groups are there with these limits already (a
        spare set renamed to this task's name): only the v2 group is made.
        """
        for path in ([self.v2] if self.v2 else []) if v1_ready else self.paths():
            _mkdir(path)
        if not v1_ready:
            self._limit_v1(limits)
        if self.v2 and self.hierarchies.device_programs and limits.gpu_minors is not None:
            devfilter.restrict(self.v2, gpu_devices_allowed(limits.gpu_minors))
        if self.v2 and self.hierarchies.v2_controllers:
            self._limit_v2(limits)

    def _limit_v1(self, limits: Limits) -> None:
        if "cpuset" in self.v1:
            _set_cpuset(self.v1["cpuset"], limits.cpuset)
        memory = self.v1.get("memory")
        if memory and limits.memory_bytes:
            _write(os.path.join(memory, "memory.limit_in_bytes"), str(limits.memory_bytes))
            if self.hierarchies.v1["memory"] not in _no_swap_accounting:
                try:  # no swapping past the limit either, where swap is accounted
                    _write(os.path.join(memory, "memory.memsw.limit_in_bytes"), str(limits.memory_bytes))
                except FileNotFoundError:  # the kernel accounts no swap (decided at boot): never look again
                    _no_swap_accounting.add(self.hierarchies.v1["memory"])
                except OSError:
                    pass
        self.limit_cpu_time(limits)
        if "pids" in self.v1 and limits.pids_max:
            _write(os.path.join(self.v1["pids"], "pids.max"), str(limits.pids_max))
        devices = self.v1.get("devices")
        if devices and limits.gpu_minors is not None:
            # A new group starts with its parent's list (the usual devices, every GPU): take the GPUs away,
            # then give back the task's own, with the control devices they need.
            _write(os.path.join(devices, "devices.deny"), f"c {NVIDIA_MAJOR}:* rwm",
                   *(() if limits.gpu_minors else (f"c {major}:* rwm" for major in _uvm_majors())))
            if limits.gpu_minors:
                _write(os.path.join(devices, "devices.allow"),
                       *(f"c {NVIDIA_MAJOR}:{m} rwm" for m in limits.gpu_minors),
                       f"c {NVIDIA_MAJOR}:{NVIDIACTL_MINOR} rwm", f"c {NVIDIA_MAJOR}:{NVIDIA_MODESET_MINOR} rwm")

    def limit_cpu_time(self, limits: Limits) -> None:
        """Give the v1 cpu group the quota of ``limits.cpus`` per period, with the whole of it left for this period.

        Writing the quota refills what the group may still run in the
        current period: a reused group starts its task as a new one would,
        not throttled for the CPU its earlier tasks used.
        """
        cpu = self.v1.get("cpu")
        if cpu and limits.cpus:  # a new group's period is the kernel's default, CPU_PERIOD_US: the quota alone
            _write(os.path.join(cpu, "cpu.cfs_quota_us"), str(cpu_quota_us(limits.cpus)))

    def _limit_v2(self, limits: Limits) -> None:
        assert self.v2 is not None  # called for a cgroup v2 only
        controllers = self.hierarchies.v2_controllers
        if "memory" in controllers and limits.memory_bytes:
            _write(os.path.join(self.v2, "memory.max"), str(limits.memory_bytes))
            try:
                _write(os.path.join(self.v2, "memory.swap.max"), "0")
            except OSError:
                pass
        if "cpu" in controllers and limits.cpus:
            _write(os.path.join(self.v2, "cpu.max"), f"{cpu_quota_us(limits.cpus)} {CPU_PERIOD_US}")
        if "cpuset" in controllers and limits.cpuset:
            _write(os.path.join(self.v2, "cpuset.cpus"), limits.cpuset)
        if "pids" in controllers and limits.pids_max:
            _write(os.path.join(self.v2, "pids.max"), str(limits.pids_max))

    def enter(self, pid: int) -> None:
        """Move process ``pid`` into the task's v2 group (a v2 group holds whole processes; the v1 groups
        are entered by one thread, see ``gpud.node.cgspawn``)."""
        if self.v2:
            _write(os.path.join(self.v2, "cgroup.procs"), str(pid))

    def leave(self, pid: int, home: dict[str, str]) -> None:
        """Move process ``pid`` back from the task's v2 group: ``home`` maps each hierarchy's mount to its
        cgroup there."""
        if self.v2:
            mount = os.path.dirname(os.path.dirname(self.v2))
            _write(os.path.join(home.get(mount, mount), "cgroup.procs"), str(pid))

    def pids(self) -> list[int]:
        """Every process in the task's cgroups, but the one that starts tasks in them (``starter``).

        One hierarchy tells: the task was forked inside all of them, and a
        process cannot leave a cgroup of its own accord without root. The
        starter is listed only while one of its threads forks the task from
        inside the groups.
        """
        found: set[int] = set()
        one = self.v2 or self.v1.get("pids") or self.v1.get("freezer")
        for path in [one] if one else self.paths():
            try:
                found.update(int(line) for line in _read(os.path.join(path, "cgroup.procs")).split())
            except (OSError, ValueError):
                pass
        found.discard(self.starter)
        return sorted(found)

    def signal(self, sig: int, *, besides_group: int | None = None) -> int:
        """Send ``sig`` to every process in the task's cgroups, but those in process group ``besides_group``
        (already signalled through it, they must not hear it twice); returns how many were signalled."""
        count = 0
        for pid in self.pids():
            try:
                if besides_group is not None and os.getpgid(pid) == besides_group:
                    continue
                os.kill(pid, sig)
                count += 1
            except OSError:
                pass
        return count

    def kill(self) -> int:
        """SIGKILL every process in the cgroups; returns how many were still there to kill.

        cgroup.kill (v2) kills them all at once; else the v1 freezer holds
        them still, so none can fork a process we would not see.
        """
        pids = self.pids()
        if not pids:
            return 0
        if self.v2 and os.path.exists(os.path.join(self.v2, "cgroup.kill")):
            try:
                _write(os.path.join(self.v2, "cgroup.kill"), "1")
            except OSError:
                pass
        freezer = self.v1.get("freezer")
        if freezer:
            _try_write(os.path.join(freezer, "freezer.state"), "FROZEN")
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if freezer:
            _try_write(os.path.join(freezer, "freezer.state"), "THAWED")
        return len(pids)

    def stats(self) -> dict:
        """Peak memory (bytes), CPU time (seconds) and OOM kills so far, those the host measures."""
        out: dict = {}
        memory = self.v1.get("memory")
        if memory:
            out["max_rss_bytes"] = _int(os.path.join(memory, "memory.max_usage_in_bytes"))
            out["oom_kills"] = _keyed(os.path.join(memory, "memory.oom_control"), "oom_kill")
        elif self.v2 and "memory" in self.hierarchies.v2_controllers:
            out["max_rss_bytes"] = _int(os.path.join(self.v2, "memory.peak"))
            out["oom_kills"] = _keyed(os.path.join(self.v2, "memory.events"), "oom_kill")
        cpuacct = self.v1.get("cpuacct")
        if cpuacct:
            usage = _int(os.path.join(cpuacct, "cpuacct.usage"))
            out["cpu_s"] = None if usage is None else usage / 1e9
        elif self.v2:
            usage = _keyed(os.path.join(self.v2, "cpu.stat"), "usage_usec")
            out["cpu_s"] = None if usage is None else usage / 1e6
        return {k: v for k, v in out.items() if v is not None}

    def remove(self) -> bool:
        """Remove the (empty) cgroups; True when none is left."""
        gone = True
        for path in self.paths():
            for attempt in range(20):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        gone = False
                        break
                    time.sleep(0.005)  # the last processes are still leaving
            else:
                gone = False
        return gone


def gpu_devices_allowed(gpu_minors: tuple[int, ...]) -> dict[int, tuple[int, ...]]:
    """For a device program: of the NVIDIA majors, what a task with GPUs ``gpu_minors`` may open.

    Its own GPUs with nvidiactl and nvidia-modeset (and nvidia-uvm whole);
    a task without GPUs none of them.
    """
    if gpu_minors:
        return {NVIDIA_MAJOR: (*gpu_minors, NVIDIACTL_MINOR, NVIDIA_MODESET_MINOR)}
    return {NVIDIA_MAJOR: (), **{major: () for major in _uvm_majors()}}


def recorded(task_dir: str, file_name: str = "cgroups", supervisor: int | None = None) -> TaskCgroup | None:
    """The cgroups a supervisor recorded for the task in ``task_dir`` (to kill what a lost supervisor left).

    ``supervisor``: the pid of the task's supervisor, known to be alive
    (so no process of the task has its pid): never counted among the
    task's processes, though listed while it starts the task.
    """
    try:
        with open(os.path.join(task_dir, file_name), encoding="utf-8") as f:
            paths = [line.strip() for line in f if line.strip()]
    except OSError:
        return None
    if not paths:
        return None
    name = os.path.basename(paths[0])
    v1: dict[str, str] = {}
    v2 = None
    for path in paths:
        base = os.path.dirname(path)
        if os.path.exists(os.path.join(base, "cgroup.controllers")):  # only v2 groups have it
            v2 = base
        else:
            v1[os.path.basename(os.path.dirname(base))] = base
    return TaskCgroup(name, Hierarchies(v1=v1, v2=v2), starter=supervisor)


def own_cgroups(hierarchies: Hierarchies, proc_file: str = "/proc/self/cgroup") -> dict[str, str]:
    """Where this process is now in each of ``hierarchies``: the mount directory to its cgroup's directory."""
    mounts = {os.path.dirname(base): c for c, base in hierarchies.v1.items()}
    if hierarchies.v2:
        mounts[os.path.dirname(hierarchies.v2)] = ""
    home: dict[str, str] = {}
    try:
        with open(proc_file, encoding="ascii") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return home
    for mount, controller in mounts.items():
        for _, controllers, path in lines:
            if controllers.split(",").count(controller) if controller else controllers == "":
                home[mount] = os.path.join(mount, path.lstrip("/"))
                break
    return home


def _try_write(path: str, value: str) -> None:
    try:
        _write(path, value)
    except OSError:
        pass


def _int(path: str) -> int | None:
    try:
        return int(_read(path))
    except (OSError, ValueError):
        return None


def _keyed(path: str, key: str) -> int | None:
    try:
        for line in _read(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def _uvm_majors() -> list[int]:
    """The character-device majors of nvidia-uvm (and its tools device), from /proc/devices."""
    majors = []
    try:
        with open("/proc/devices", encoding="ascii") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[1].startswith("nvidia-uvm") and parts[0].isdigit():
                    majors.append(int(parts[0]))
    except OSError:
        pass
    return majors


def format_bytes(value: int) -> str:
    """A memory limit as a user writes it: 200M, 4G."""
    gib, mib = 1 << 30, 1 << 20
    if value % gib == 0:
        return f"{value // gib}G"
    if value % mib == 0:
        return f"{value // mib}M"
    return f"{value}B"


def parse_cpus(text: str) -> list[int]:
    """A cpuset list ("0-3,6") as CPU numbers."""
    cpus: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


class Confiner:
    """The supervisor's side of task cgroups: each task's limits, the CPUs it is pinned to, where the supervisor lives.

    CPUs are handed out ``ceil(cpus)`` per task from the CPUs the node's
    group may use: those near the task's GPUs first (where the topology is
    known), least-used first among them, then the least-used others.
    """

    def __init__(self, hierarchies: Hierarchies | None = None) -> None:
        self.hierarchies = host() if hierarchies is None else hierarchies
        self.home = own_cgroups(self.hierarchies) if self.hierarchies.tracked() else {}
        cpuset = self.hierarchies.v1.get("cpuset")
        try:
            cpus = parse_cpus(_read(os.path.join(cpuset, "cpuset.cpus"))) if cpuset else []
        except (OSError, ValueError):
            cpus = []
        self.cpu_use = {cpu: 0 for cpu in cpus}
        self._worker: ThreadPoolExecutor | None = None
        self._spawner: Spawner | None = None

    def spawn(self, group: TaskCgroup, start: Callable[[], T]) -> T:
        """Call ``start`` (it forks the task) so that the task starts in ``group``: from a thread inside its v1
        groups when it has some (``gpud.node.cgspawn``), with this process inside its v2 group when it has one.

        :class:`Refused`, ``start`` not called, when a group refuses.
        """
        if group.v2:
            try:
                group.enter(os.getpid())
            except OSError as exc:
                raise Refused(exc) from None
        try:
            if not group.v1:
                return start()
            if self._spawner is None:
                self._spawner = Spawner(self.home)
            return self._spawner.spawn(list(group.v1.values()), start)
        finally:
            if group.v2:
                try:
                    group.leave(os.getpid(), self.home)
                except OSError as exc:
                    print(f"gpud supervisor: cannot leave the cgroup {group.v2}: {exc}", file=sys.stderr, flush=True)

    def later(self, work: Callable[[], object]) -> None:
        """Run ``work`` (a cgroup reset or removal) on a worker thread, in order, off the supervisor's loop, once
        the spawner thread is out of every task's groups: an empty group must look empty."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="gpud-cgroups")
        self._worker.submit(_logged, work if self._spawner is None else functools.partial(_when_home, self._spawner, work))

    def close(self) -> None:
        """Wait for the work handed to :meth:`later`; end the spawner thread."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        if self._spawner is not None:
            self._spawner.close()
            self._spawner = None

    def pick_cpus(self, cpus: float, near: tuple[int, ...] = ()) -> list[int]:
        """The CPUs for a task of ``cpus`` CPUs: of ``near`` (its GPUs' CPUs) first, least used first; [] when
        CPUs are not pinned here."""
        if not self.cpu_use or cpus <= 0:
            return []
        count = min(len(self.cpu_use), max(1, -int(-cpus // 1)))
        close = set(near)
        chosen = sorted(self.cpu_use, key=lambda cpu: (cpu not in close, self.cpu_use[cpu], cpu))[:count]
        for cpu in chosen:
            self.cpu_use[cpu] += 1
        return sorted(chosen)

    def release_cpus(self, chosen: list[int]) -> None:
        """A task pinned to ``chosen`` is over."""
        for cpu in chosen:
            if self.cpu_use.get(cpu, 0) > 0:
                self.cpu_use[cpu] -= 1


def _when_home(spawner: Spawner, work: Callable[[], object]) -> None:
    spawner.wait_home()
    work()


def _logged(work: Callable[[], object]) -> None:
    try:
        work()
    except Exception:  # noqa: BLE001 - the worker must go on; the supervisor's log says what failed
        traceback.print_exc()
        sys.stderr.flush()
