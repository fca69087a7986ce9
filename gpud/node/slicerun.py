"""Running time-slice plans on one shared GPU: a thread that thaws each lease's holder and freezes the others."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from gpud.node import failsafe
from gpud.node.freezer import Freezer
from gpud.node.slicer import Holder, Plan, build_plan, clean_shares, next_carry, shares_for, with_carry
from gpud.node.taskstate import STOP_FILE

log = logging.getLogger(__name__)
IDLE_UTIL = 1.0  # percent: below this in every sample of a plan, a holder counts as idle
SharesFn = Callable[[int, str, Sequence[Holder], float], Mapping[str, float]]
Meter = Callable[["Member"], float]


@dataclass(frozen=True, slots=True)
class Member:
    """A task on the GPU: its key, directory, process group, freezer, compute request and limit."""

    key: str
    task_dir: str
    pgid: int
    freezer: Freezer
    request: float
    limit: float
    project: str = ""

    def stopping(self) -> bool:
        """True once the task is being stopped: it must stay thawed."""
        return (os.path.exists(os.path.join(self.task_dir, STOP_FILE))
                or os.path.exists(os.path.join(self.task_dir, failsafe.STOPPING_FILE)))


class UsageMonitor:
    """Per-process GPU use from the backend, polled at most every ``min_interval_s``; safe across threads.

    Remembers, per process, the last time it was seen busy on each GPU and
    its latest memory there.
    """

    def __init__(self, backend, min_interval_s: float = 0.1) -> None:
        self.backend = backend
        self.min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._polled = 0.0
        self.last_busy: dict[tuple[int, int], float] = {}
        self.memory_gib: dict[tuple[int, int], float] = {}
        self.utilization: dict[tuple[int, int], float] = {}

    def poll(self, force: bool = False) -> None:
        """Ask the backend now unless it was asked less than ``min_interval_s`` ago."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._polled < self.min_interval_s:
                return
            self._polled = now
            try:
                processes = self.backend.processes()
            except Exception:  # noqa: BLE001 - a failing backend must not stop slicing
                log.exception("reading GPU processes failed")
                return
            memory, utilization = {}, {}
            for p in processes:
                memory[(p.pid, p.gpu_index)] = p.memory_gib
                utilization[(p.pid, p.gpu_index)] = p.utilization
                if p.utilization >= IDLE_UTIL:
                    self.last_busy[(p.pid, p.gpu_index)] = now
            self.memory_gib = memory
            self.utilization = utilization

    def busy_since(self, pgid: int, gpu: int, since: float) -> bool:
        """True when a process of session ``pgid`` was seen busy on ``gpu`` after monotonic time ``since``."""
        with self._lock:
            items = list(self.last_busy.items())
        return any(t > since and g == gpu and _session(pid) == pgid for (pid, g), t in items)

    def memory_of(self, pgid: int, gpu: int) -> float:
        """The GPU memory (GiB) the processes of session ``pgid`` hold on ``gpu`` at the last poll."""
        with self._lock:
            items = list(self.memory_gib.items())
        return sum(m for (pid, g), m in items if g == gpu and _session(pid) == pgid)


    def utilization_of(self, pgid: int, gpu: int) -> float:
        """The utilisation (percent, at most 100) the processes of session ``pgid`` had on ``gpu`` at the last
        poll."""
        with self._lock:
            items = list(self.utilization.items())
        return min(100.0, sum(u for (pid, g), u in items if g == gpu and _session(pid) == pgid))


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


@dataclass(slots=True)
class PlanRecord:
    """What one plan meant to give (shares of the plan) and what each holder held (seconds)."""

    shares: dict[str, float]
    targets: dict[str, float]
    delivered: dict[str, float]
    plan_s: float
    switches: list[float] = field(default_factory=list)

    def error_pp(self) -> float:
        """How far the plan missed: the largest gap between a holder's target and what it held, in points of the plan."""
        if self.plan_s <= 0:
            return 0.0
        return max((abs(self.delivered.get(key, 0.0) / self.plan_s - share) * 100.0
                    for key, share in self.targets.items()), default=0.0)


class GpuSlicer(threading.Thread):
    """Runs plan after plan on GPU ``gpu_index`` until :meth:`close`; every task is thawed when it ends."""

    def __init__(self, gpu_index: int, mode: str, lease_s: float, precision: float, *,
                 monitor: UsageMonitor | None = None, shares: SharesFn | None = None,
                 heartbeat: str | None = None, history: int = 100,
                 on_plan: Callable[[Plan], None] | None = None, meter: Meter | None = None) -> None:
        super().__init__(name=f"gpud-slicer-{gpu_index}", daemon=True)
        self.gpu_index = gpu_index
        self.mode = mode
        self.lease_s = lease_s
        self.precision = precision
        self.monitor = monitor
        self.shares = shares or (lambda gpu, mode, holders, probe: shares_for(mode, holders, probe))
        self.heartbeat = heartbeat
        self.on_plan = on_plan
        # Without a meter a holder got the wall time it held the GPU (it is exclusive); a meter counts use.
        self.meter = meter
        self.history: list[PlanRecord] = []
        self._history_max = history
        self._lock = threading.Lock()
        self._members: dict[str, Member] = {}
        self._changed = threading.Event()
        self._closing = threading.Event()
        self._carry: dict[str, float] = {}
        self._idle: dict[str, bool] = {}

    # -- membership (any thread) -------------------------------------------------------

    def set_members(self, members: Sequence[Member]) -> None:
        """Slice among exactly ``members`` from the next lease on; tasks that left are thawed."""
        wanted = {m.key: m for m in members}
        with self._lock:
            for key, gone in list(self._members.items()):
                if key not in wanted:
                    gone.freezer.thaw()
            changed = set(wanted) != set(self._members)
            self._members = wanted
        if changed:
            self._changed.set()

    def release(self, key: str) -> None:
        """Stop slicing task ``key`` and thaw it, before this call returns."""
        with self._lock:
            member = self._members.pop(key, None)
            if member is not None:
                member.freezer.thaw()
        if member is not None:
            self._changed.set()

    def members(self) -> list[Member]:
        """The tasks sliced now."""
        with self._lock:
            return list(self._members.values())

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop slicing and thaw every task."""
        self._closing.set()
        self._changed.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
        self._thaw_all()

    # -- the loop ---------------------------------------------------------------------

    def run(self) -> None:
        """Plan after plan until closed; thaws everything on the way out, whatever happens."""
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -10)
        except (OSError, AttributeError):
            pass  # switching on time matters, but an unprivileged daemon still slices
        try:
            while not self._closing.is_set():
                holders = self._holders()
                if not holders:
                    self._changed.wait(0.2)
                    self._changed.clear()
                    continue
                shares = clean_shares(self.shares(self.gpu_index, self.mode, holders, self.precision), holders)
                plan = build_plan(with_carry(shares, holders, self.precision), self.lease_s, self.precision)
                if self.on_plan is not None:
                    self.on_plan(plan)
                started = time.monotonic()
                record = self._run(plan, shares)
                if record is None:
                    self._carry.clear()
                    continue
                self._finish(plan, holders, record, started)
        except Exception:  # noqa: BLE001 - logged; the finally block thaws every task
            log.exception("the slicer of GPU %d failed; its tasks run unsliced", self.gpu_index)
        finally:
            self._thaw_all()

    def _holders(self) -> list[Holder]:
        with self._lock:
            members = list(self._members.values())
        return [Holder(m.key, m.request, m.limit, m.project, self._idle.get(m.key, False),
                       self._carry.get(m.key, 0.0)) for m in members]

    def _switch(self, holder: str | None) -> list[str]:
        """Freeze every member but ``holder``, then thaw ``holder``; drops members being stopped."""
        with self._lock:
            for key, member in list(self._members.items()):
                if member.stopping():
                    del self._members[key]
                    member.freezer.thaw()
                elif key != holder:
                    member.freezer.freeze()
                    # Looked at again: a supervisor marks its task stopping before it thaws it and sends the stop
                    # signal, so a freeze that came after that thaw is seen here and undone at once.
                    if member.stopping():
                        del self._members[key]
                        member.freezer.thaw()
            if holder in self._members:
                self._members[holder].freezer.thaw()
            return list(self._members)

    def _run(self, plan: Plan, shares: dict[str, float]) -> PlanRecord | None:
        """Carry out one plan; None when the members changed (the plan was cut short)."""
        self._changed.clear()
        record = PlanRecord(shares, dict(plan.targets), {k: 0.0 for k in plan.targets}, plan.plan_s)
        start = time.monotonic()
        end = start
        off = None
        before = self._read_meter()
        for lease in plan.leases:
            end += lease.seconds
            present = self._switch(lease.holder)
            on = time.monotonic()
            if off is not None:
                record.switches.append(on - off)
            if lease.holder is not None and lease.holder not in present:
                return None
            if not self._sleep_until(end):
                return None
            off = time.monotonic()
            if lease.holder is not None and self.meter is None:
                record.delivered[lease.holder] += off - on
        if self.meter is not None:
            after = self._read_meter()
            record.delivered = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in record.delivered}
        return record

    def _read_meter(self) -> dict[str, float]:
        if self.meter is None:
            return {}
        return {m.key: self.meter(m) for m in self.members()}

    def _sleep_until(self, deadline: float) -> bool:
        """Sleep to ``deadline``, beating the heartbeat; False when closing or the members changed."""
        while True:
            if self.heartbeat:
                failsafe.beat(self.heartbeat)
            if self.monitor is not None:
                self.monitor.poll()
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            if self._changed.wait(min(left, failsafe.BEAT_S)):
                return False

    def _finish(self, plan: Plan, holders: Sequence[Holder], record: PlanRecord, started: float) -> None:
        self.history.append(record)
        del self.history[:-self._history_max]
        if self.monitor is not None:
            self.monitor.poll(force=True)
            with self._lock:
                members = dict(self._members)
            self._idle = {key: not self.monitor.busy_since(m.pgid, self.gpu_index, started)
                          for key, m in members.items() if key in plan.targets}
        refreshed = [Holder(h.key, h.request, h.limit, h.project, self._idle.get(h.key, False), h.carry)
                     for h in holders]
        self._carry = next_carry(plan, record.delivered, refreshed, self.precision)

    def _thaw_all(self) -> None:
        with self._lock:
            for member in self._members.values():
                member.freezer.thaw()
