"""NodeAgent: the node daemon's logic, usable as a daemon of its own or inside another process (``gpud up``)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import time
from dataclasses import replace
from typing import Any

import psutil

import gpud
from gpud.gpu import GpuBackend
from gpud.gpu.base import MEMORY, UTILIZATION
from gpud.node import cgroups, fence, lease, membership
from gpud.node.ckptwatch import CheckpointWatch
from gpud.node.config import NodeConfig
from gpud.node.launch import child_env
from gpud.node.link import Connector, ControllerLink
from gpud.node.memwatch import MIB_PER_GIB, MemoryWatch, Slice
from gpud.node.pty_session import Interactive
from gpud.node.slicemgr import SliceManager, thaw_tasks
from gpud.node.slicerun import UsageMonitor
from gpud.node.spec import SpecError, TaskKey, TaskSpec
from gpud.node.taskstate import RUNNING, STARTING, Layout, TaskState
from gpud.node.tasks import TaskTable
from gpud.waits import wait_event
from gpud.wire.task import ExitCause, TaskStop

log = logging.getLogger(__name__)
MAX_SOCKET_PATH = 107


class _Poke(asyncio.DatagramProtocol):
    """Wakes the agent when a supervisor says its task changed state."""

    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent

    def datagram_received(self, data: bytes, addr: Any) -> None:
        for name in data.decode("utf-8", "replace").split("\n"):  # the tasks' directory names
            self.agent.poke(TaskKey.from_dirname(name))


class NodeAgent:
    """One node: its GPUs (from ``backend``), its tasks (in ``config.state_dir``) and its link to the controller.

    ``await start()`` adopts the tasks a previous daemon left running and
    connects (over a WebSocket to ``config.connect_url``, or through
    ``connect`` when the controller is in this process); ``await stop()``
    disconnects and leaves the tasks running, as a daemon restart must.
    """

    def __init__(self, config: NodeConfig, backend: GpuBackend, connect: Connector | None = None) -> None:
        self.config = config
        self.backend = backend
        self.layout = Layout(config.state_dir, config.run_dir)
        self.tasks = TaskTable(self.layout)
        self.checkpoint_marks = CheckpointWatch(self.layout)
        self.link = ControllerLink(config.connect_urls, config.cluster_key, self,
                                   reconnect_max_s=config.reconnect_max_s, connect=connect, ca=config.ca_file)
        self._poked = asyncio.Event()
        self._poked_keys: set[TaskKey] | None = set()  # the tasks a poke named; None: look at every task
        self._background: list[asyncio.Task] = []
        self._transport: asyncio.DatagramTransport | None = None
        self._register_snapshot: list[TaskState] = []
        self._gpus = backend.gpus()
        self.usage = UsageMonitor(backend)
        self.slices = SliceManager(self.layout, self.usage, _plugin_manager(), known_specs=self.tasks.specs)
        self.memory = MemoryWatch()
        self.interactive = Interactive(self.tasks, self.layout.run_root, self.link.send, backend)
        self.lease_file = lease.lease_path(self.layout.run_root)
        self.lease: lease.Lease | None = lease.read_lease(self.lease_file)
        self._fence: subprocess.Popen | None = None

    # -- lifecycle -------------------------------------------------------

    async def start(self) -> None:
        """Listen for supervisors, adopt the tasks recorded in the run directory, and connect.

        Listening comes first: a task a supervisor records after the
        adoption looked is then heard of, and adopted, through its poke.
        """
        self.layout.create()
        await self._listen()
        adopted = self.tasks.adopt()
        if adopted:
            log.info("adopted %d task(s) from %s", len(adopted), self.layout.tasks_dir)
            # A previous daemon may have died with some of them frozen; slicing resumes at the next sync.
            thaw_tasks(self.layout, adopted)
        try:
            self.tasks.launcher.start_supervisor()
        except OSError as exc:  # tried again when the first task comes; that task then fails with the reason
            log.warning("cannot start the task supervisor yet: %s", exc)
        self._ensure_fence()
        self._background = [asyncio.create_task(self.link.run(), name="gpud-node-link"),
                            asyncio.create_task(self._watch(), name="gpud-node-watch")]
        self.interactive.start()

    async def stop(self) -> None:
        """Disconnect and stop watching; the tasks keep running under their supervisors."""
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self._background = []
        await self.interactive.close()
        self.slices.close()
        self.tasks.launcher.close()
        if self._transport is not None:
            self._transport.close()
            self._transport = None
            try:
                os.unlink(self.layout.socket_path)
            except OSError:
                pass

    async def _listen(self) -> None:
        path = self.layout.socket_path
        if len(path.encode()) > MAX_SOCKET_PATH:
            log.warning("state directory path too long for %s; task changes are seen by polling", path)
            return
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        os.chmod(path, 0o600)
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(lambda: _Poke(self), sock=sock)

    def poke(self, key: TaskKey | None = None) -> None:
        """Look at the tasks now rather than at the next poll: at task ``key`` only, or at every task."""
        if key is None:
            self._poked_keys = None
        elif self._poked_keys is not None:
            self._poked_keys.add(key)
        self._poked.set()

    async def _watch(self) -> None:
        last_full = time.monotonic()
        while True:
            await wait_event(self._poked, max(0.0, last_full + self.config.poll_s - time.monotonic()))
            if time.monotonic() - last_full >= self.config.poll_s:
                self._poked_keys = None  # every poll looks at every task, however busy the pokes keep it
            self._poked.clear()
            keys, self._poked_keys = self._poked_keys, set()
            if keys is None:
                last_full = time.monotonic()
            try:
                await self.sync(None if keys is None else sorted(keys))
            except Exception:  # noqa: BLE001 - the watcher must keep running
                log.exception("checking the tasks failed")

    async def sync(self, keys: list[TaskKey] | None = None) -> None:
        """Re-read the tasks (all, or ``keys``); report what changed to the controller.

        A sync of every task (each poll, or when asked) also looks at the GPUs' health.
        """
        for event in self.backend.health_events() if keys is None else ():
            log.warning("GPU %d (%s) is out of service: %s (%s)", event.gpu_index, event.uuid, event.kind,
                        event.detail)
            self.link.heartbeat_soon()
        for state in self.tasks.refresh(keys):
            if state.state == STARTING:
                continue  # reported as started once the supervisor has the task's pid
            if await self.link.send({"type": "task", **state.report()}):
                self.tasks.mark_reported([state])
        states = self.tasks.states()
        if keys is None:
            for message in self.checkpoint_marks.new_marks(states):
                await self.link.send(message)
        self.interactive.tasks_changed(states)
        self.slices.update(states)
        self._watch_memory(states)

    def _near_cpus(self, spec: TaskSpec) -> TaskSpec:
        """The spec, with the CPUs near its GPUs (``near_cpus``) where the backend knows the topology."""
        if not spec.gpu_indices:
            return spec
        try:
            topology = self.backend.gpu_cpus()
        except Exception:  # noqa: BLE001 - without the topology the task is pinned to the least-used CPUs
            log.exception("reading the GPUs' CPU affinity failed")
            return spec
        near = tuple(sorted({cpu for index in spec.gpu_indices for cpu in topology.get(index, ())}))
        return replace(spec, near_cpus=near) if near else spec

    def _with_slice_env(self, spec: TaskSpec) -> TaskSpec:
        """The spec, with the variables plugins give to enforce its memory slice (gpud_memory_slice_env)."""
        pm = self.slices.pm
        memory = spec.memory_slice
        if pm is None or memory is None or not memory.limit_mib or not spec.gpu_uuids:
            return spec
        try:
            answers = pm.hook.gpud_memory_slice_env(gpu_uuid=spec.gpu_uuids[0], limit_mib=memory.limit_mib,
                                                    fraction=memory.fraction)
        except Exception:  # noqa: BLE001 - the slice is still watched; the task must start
            log.exception("the gpud_memory_slice_env hook failed")
            return spec
        env: dict = {}
        for answer in reversed(answers):  # pluggy answers the last registered first; it must win
            env.update(answer or {})
        return replace(spec, memory_slice=replace(memory, env=env)) if env else spec

    def _as_run_here(self, key: TaskKey, spec: TaskSpec) -> TaskSpec:
        """The spec as this node runs it: the holder for an interactive task, where gpuctl in the task reaches
        the controller (for ``gpuctl checkpointed``), the CPUs near its GPUs, its memory slice's variables."""
        spec = self.interactive.holder_spec(key, spec)
        if spec.checkpoint_token:
            spec = replace(spec, controller_url=self.config.controller_url, controller_ca=self.config.ca_file or "")
        return self._near_cpus(self._with_slice_env(spec))

    def _watch_memory(self, states: list[TaskState]) -> None:
        """Warn, then stop, tasks holding more GPU memory than their slice allows."""
        slices, used, pids = {}, {}, {}
        for state in states:
            spec = self.slices.spec_of(state) if state.state != "exited" and state.pid else None
            if spec is None or spec.memory_slice is None or spec.memory_slice.limit_mib is None \
                    or len(spec.gpu_indices) != 1:
                self.memory.forget(state.key)
                continue
            m = spec.memory_slice
            assert m.limit_mib is not None  # checked just above
            slices[state.key] = Slice(m.limit_mib, m.tolerance, m.grace_s, m.enforce)
            assert state.pid is not None  # a spec is looked up only for a task with a pid
            pids[state.key] = (state.pid, spec.gpu_indices[0])
        if not slices:
            return
        self.usage.poll()
        for key, (pid, gpu) in pids.items():
            used[key] = self.usage.memory_of(pid, gpu) * MIB_PER_GIB
        for verdict in self.memory.check(used, slices, time.monotonic()):
            log.warning("task %s: %s%s", verdict.key.dirname, verdict.message,
                        "; stopping it" if verdict.action == "stop" else "")
            if verdict.action == "stop":
                self.slices.release(verdict.key)
                self.tasks.stop(verdict.key, verdict.message, cause=ExitCause.GPU_MEMORY)
                self.poke()

    # -- messages --------------------------------------------------------

    def resources(self) -> dict:
        """The node's CPUs and memory: as the config declares them, else as psutil finds them."""
        cpus = self.config.cpus if self.config.cpus is not None else psutil.cpu_count() or 1
        memory = (self.config.memory_gib if self.config.memory_gib is not None
                  else round(psutil.virtual_memory().total / 1024 ** 3, 2))
        return {"cpus": cpus, "memory_gib": memory}

    def gpus(self) -> list[dict]:
        """The node's GPUs with their current health."""
        self._gpus = self.backend.gpus()
        return [gpu.to_json() for gpu in self._gpus]

    def register_message(self) -> dict:
        """The ``register`` message: identity, resources, GPUs and every known task."""
        self.tasks.refresh()
        self._register_snapshot = self.tasks.states()
        return {"type": "register", "node": self.config.name, "pool": self.config.pool,
                "labels": dict(self.config.labels), **self.resources(), "gpus": self.gpus(),
                "tasks": [state.report() for state in self._register_snapshot], "version": gpud.__version__,
                "cluster_id": membership.remembered(self.config.state_dir), "checkpoints": self.tasks.checkpoints(),
                "limits": {**cgroups.limits_report(), "gpu_measures": list(getattr(self.backend, "measures", ()))}}

    def check_controller(self, answer: dict) -> str | None:
        """Why the controller that answered ``registered`` is not this node's, or None when it is."""
        return membership.refusal(self.config.state_dir, answer)

    def heartbeat_message(self) -> dict:
        """The ``heartbeat`` message: GPUs and every known task.

        A failure to re-read the tasks is logged and the heartbeat goes with
        what was known: a node that stops heartbeating is declared down and
        its jobs are requeued, which one bad task must never cause.
        """
        try:
            self.tasks.refresh()
        except Exception:  # noqa: BLE001 - the heartbeat must go out
            log.exception("checking the tasks failed; the heartbeat carries what was known")
        states = self.tasks.states()
        self.tasks.mark_reported(states)
        return {"type": "heartbeat", "gpus": self.gpus(), "tasks": self._with_gpu_samples(states)}

    def _with_gpu_samples(self, states: list[TaskState]) -> list[dict]:
        """The task reports, each running GPU task's with what the backend measures of its GPUs now:
        ``gpu_util`` (mean percent over its GPUs) and ``gpu_memory_gib`` (the most on one of them)."""
        reports = [state.report() for state in states]
        measures: tuple[str, ...] | None = None
        for state, report in zip(states, reports):
            spec = self.slices.spec_of(state) if state.state == RUNNING and state.pid else None
            if spec is None or not spec.gpu_indices:
                continue
            assert state.pid is not None  # a spec is looked up only for a running task with a pid
            if measures is None:
                self.usage.poll()
                # A backend that measures nothing (fake GPUs with GPUD_FAKE_GPU_SIMULATE=0) reports the use it
                # was told of: sample that.
                measures = tuple(getattr(self.backend, "measures", ())) or (
                    (UTILIZATION, MEMORY) if self.usage.memory_gib else ())
            if UTILIZATION in measures:
                report["gpu_util"] = round(sum(self.usage.utilization_of(state.pid, g) for g in spec.gpu_indices)
                                           / len(spec.gpu_indices), 2)
            if MEMORY in measures:
                report["gpu_memory_gib"] = round(max(self.usage.memory_of(state.pid, g)
                                                     for g in spec.gpu_indices), 4)
        return reports

    def lease_renewed(self, expires: float | None, lease_s: float, grace_s: float) -> None:
        """Record the lease the controller granted, for the supervisors to enforce (None: no lease)."""
        if expires is None:
            self.lease = None
            lease.drop_lease(self.lease_file)
            return
        if self.lease is not None and self.lease.expired():
            log.info("the controller answers again: lease renewed for %g s", lease_s)
        self.lease = lease.Lease(expires, lease_s, grace_s)
        lease.write_lease(self.lease_file, self.lease)
        self._ensure_fence()

    def _ensure_fence(self) -> None:
        """Have the node's fence running while a lease is held: it stops the tasks when the lease runs out, even
        with this daemon and the supervisor dead (gpud.node.fence)."""
        if self.lease is None or (self._fence is not None and self._fence.poll() is None):
            return
        try:
            self._fence = fence.ensure(self.layout.run_root, child_env()) or self._fence
        except OSError as exc:  # tried again with the next lease renewal
            log.warning("cannot start the lease fence: %s", exc)

    def registered(self, message: dict) -> None:
        """The controller has the task list sent with ``register``; report only later changes."""
        self.tasks.mark_reported(self._register_snapshot)
        self.poke()

    async def handle(self, message: dict) -> dict | None:
        """Carry out one order (start, stop, ack, purge, read_log); returns the answer to send, if any."""
        kind = message.get("type")
        if kind == "read_log":
            return await asyncio.to_thread(self.tasks.read_log, message)
        if isinstance(kind, str) and kind.startswith(("pty_", "fwd_")):
            return await self.interactive.handle(message)
        if kind == "purge":
            if not self.tasks.purge(message):
                log.warning("ignoring a purge order without a job uid")
            return None
        if kind not in ("start", "stop", "ack"):
            log.warning("ignoring an unknown message type %r from the controller", kind)
            return None
        try:
            key = TaskKey.from_order(message)
        except SpecError as exc:
            log.warning("ignoring a %s order: %s", kind, exc)
            return None
        if kind == "start":
            if self.lease is not None and self.lease.expired():
                # Sent before the controller gave this node up, perhaps: it sends the order again if it
                # still wants the task once the lease is renewed.
                log.warning("not starting task %s: this node's lease has run out", key.dirname)
                return None
            self._ensure_fence()
            try:
                spec = TaskSpec.decode(message.get("spec"), error=SpecError)
            except SpecError as exc:
                if self.tasks.refuse(key, str(exc)) is not None:
                    self.poke(key)
                return None
            if self.tasks.start(key, self._as_run_here(key, spec)) is not None:
                self.poke(key)
        elif kind == "stop":
            try:
                stop = TaskStop.decode(message, error=SpecError)
            except SpecError as exc:
                log.warning("ignoring a stop order: %s", exc)
                return None
            key = self.tasks.resolve(key)
            self.slices.release(key)  # thawed before the stop signal, or it could not act on it
            self.tasks.stop(key, stop.reason, stop.grace_s, stop.signal, stop.leader_only, hasten=stop.hasten,
                            cause=stop.cause)
            self.poke(key)
        else:
            self.tasks.ack(self.tasks.resolve(key))
        return None


def _plugin_manager() -> Any:
    """The plugins that answer the time-slice plan hook; None (built-in plans) when they cannot be loaded."""
    try:
        from gpud.plugins import make_plugin_manager
        return make_plugin_manager()
    except Exception:  # noqa: BLE001 - a broken plugin must not keep the node from running its jobs
        log.exception("loading the gpud plugins failed; time-slicing uses the built-in plans")
        return None
