"""Which tasks share which GPU, and one slicer thread per shared GPU: started, re-membered, closed."""

from __future__ import annotations

import logging
import os
from typing import Any, Iterable, Mapping, Sequence

from gpud.node import failsafe
from gpud.node.freezer import freezer_for
from gpud.node.slicer import Holder, shares_for
from gpud.node.slicerun import GpuSlicer, Member, UsageMonitor
from gpud.node.spec import SpecError, TaskSpec
from gpud.node.taskstate import EXITED, ORDER_FILE, Layout, TaskState, read_json

log = logging.getLogger(__name__)


def load_spec(layout: Layout, state: TaskState) -> TaskSpec | None:
    """The spec a task was started with, from its directory (None when unreadable)."""
    order = read_json(os.path.join(layout.task_dir(state.key), ORDER_FILE))
    try:
        return TaskSpec.decode(order.get("spec"), error=SpecError) if isinstance(order, dict) else None
    except SpecError:
        return None


def thaw_tasks(layout: Layout, states: Iterable[TaskState]) -> int:
    """Thaw every running task among ``states`` (a daemon does this to the tasks it adopts); returns how many."""
    count = 0
    for state in states:
        if state.state != EXITED and state.pid:
            freezer_for(layout.task_dir(state.key), state.pid).thaw()
            count += 1
    return count


class SliceManager:
    """Keeps one GpuSlicer per GPU that time-sliced tasks share; ``pm`` answers the plan hook."""

    def __init__(self, layout: Layout, monitor: UsageMonitor | None = None, pm: Any = None,
                 known_specs: Mapping[Any, TaskSpec] | None = None) -> None:
        self.layout = layout
        self.known_specs = known_specs if known_specs is not None else {}
        self.monitor = monitor
        self.pm = pm
        self.slicers: dict[int, GpuSlicer] = {}
        self._specs: dict[Any, TaskSpec | None] = {}
        self._hook_failed = False

    def spec_of(self, state: TaskState) -> TaskSpec | None:
        """The task's spec: as started by this daemon (``known_specs``), else read once from its directory."""
        if state.key not in self._specs:
            spec = self.known_specs.get(state.key)
            self._specs[state.key] = spec if spec is not None else load_spec(self.layout, state)
        return self._specs[state.key]

    def update(self, states: Sequence[TaskState]) -> None:
        """Slice exactly the running, time-sliced tasks among ``states``, each on its GPU."""
        groups: dict[int, list[tuple[TaskState, TaskSpec]]] = {}
        live = set()
        for state in states:
            live.add(state.key)
            if state.state == EXITED or not state.pid:
                continue
            spec = self.spec_of(state)
            if spec is None or not spec.sliced or len(spec.gpu_indices) != 1:
                continue
            groups.setdefault(spec.gpu_indices[0], []).append((state, spec))
        for key in [k for k in self._specs if k not in live]:
            del self._specs[key]
        for gpu in [g for g in self.slicers if g not in groups]:
            self.slicers.pop(gpu).close()
        for gpu, members in groups.items():
            self._slice(gpu, members)

    def _slice(self, gpu: int, members: list[tuple[TaskState, TaskSpec]]) -> None:
        newest = max(members, key=lambda m: (m[0].started or 0.0, m[0].key))[1].time_slicing
        assert newest is not None  # update() hands over time-sliced tasks only
        mode, lease_s, precision = newest.mode, newest.lease_ms / 1000.0, newest.precision
        slicer = self.slicers.get(gpu)
        if slicer is not None and not slicer.is_alive():
            log.warning("the slicer of GPU %d had stopped; starting it again", gpu)
            slicer = None
        if slicer is not None and (slicer.mode, slicer.lease_s, slicer.precision) != (mode, lease_s, precision):
            slicer.close()
            slicer = None
        if slicer is None:
            slicer = GpuSlicer(gpu, mode, lease_s, precision, monitor=self.monitor, shares=self._shares,
                               heartbeat=failsafe.heartbeat_path(self.layout.run_root))
            self.slicers[gpu] = slicer
            slicer.start()
            log.info("time-slicing GPU %d (%s, lease %g ms, precision %g)", gpu, mode, lease_s * 1000, precision)
        slicer.set_members([self._member(state, spec) for state, spec in members])

    def _member(self, state: TaskState, spec: TaskSpec) -> Member:
        task_dir = self.layout.task_dir(state.key)
        slicing = spec.time_slicing
        assert slicing is not None and state.pid is not None  # a running, time-sliced task
        return Member(state.key.dirname, task_dir, state.pid, freezer_for(task_dir, state.pid),
                      slicing.request, slicing.limit, spec.project)

    def _shares(self, gpu: int, mode: str, holders: Sequence[Holder], probe: float) -> Mapping[str, float]:
        if self.pm is not None:
            try:
                answer = self.pm.hook.gpud_time_slice_plan(gpu_index=gpu, mode=mode, holders=list(holders),
                                                           probe=probe)
            except Exception:  # noqa: BLE001 - a broken plugin must not leave the GPU unsliced
                if not self._hook_failed:
                    log.exception("the gpud_time_slice_plan hook failed; using the built-in %s plan", mode)
                self._hook_failed = True
                answer = None
            if answer is not None:
                return answer
        return shares_for(mode, holders, probe)

    def release(self, key: Any) -> None:
        """Stop slicing task ``key`` and thaw it before returning (it is about to be signalled)."""
        for slicer in self.slicers.values():
            slicer.release(key.dirname)

    def close(self) -> None:
        """Stop every slicer; every task is thawed."""
        for slicer in self.slicers.values():
            slicer.close()
        self.slicers.clear()
