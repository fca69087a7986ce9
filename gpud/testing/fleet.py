"""Many emulated node daemons in one process, speaking the real node protocol to a real controller.

Each emulated node connects through the node daemon's own link
(:class:`gpud.node.link.ControllerLink`: register, heartbeats numbered by
``seq``, leases, reconnects with backoff) and builds its messages from the
node's own types (a start order's :class:`~gpud.node.spec.TaskKey`, a
:class:`~gpud.node.taskstate.TaskState`'s report, a
:class:`~gpud.gpu.base.GpuInfo`), so a change of the protocol breaks the
emulator as it breaks the real node. Every ``error`` the controller answers
(a message it refused) is counted and kept.

An emulated node runs no processes. A started task reports ``running`` at
once and exits after the time its job gives it:

- ``GPUD_EMULATED_RUN_S=<seconds>`` in the job's environment, else
- a command ``sleep <seconds>`` (``gpuctl submit -- sleep 30``), else
- no time at all (it exits at once).

It exits with code 0, or ``GPUD_EMULATED_EXIT_CODE`` from the job's
environment. A ``stop`` order ends it at once, killed by its stop signal;
a lease that runs out ends every running task with the real node's reason
(``node lease expired``).

Run as a program it emulates ``--nodes`` nodes until SIGTERM or SIGINT::

    python -m gpud.testing.fleet --controller http://127.0.0.1:6830 --key-file cluster.key --nodes 1000 \\
        [--first 0] [--prefix node-] [--width 4] [--gpus-per-node 8] [--ramp-s 5] [--status FILE] [--report FILE]

``--status`` is rewritten four times a second with the counts so far
(nodes registered, tasks started and ended); ``--report`` gets the figures
when it stops (heartbeat round trips, errors, reconnects, lease expiries,
its own CPU time).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import resource
import signal
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import aiohttp

import gpud
from gpud import jsontext
from gpud.gpu.base import GpuInfo
from gpud.node.lease import FENCED_REASON
from gpud.wire.task import ExitCause
from gpud.node.link import Connector, ControllerLink, node_url, ws_connector
from gpud.node.spec import SpecError, TaskKey
from gpud.node.taskstate import EXITED, RUNNING, TaskState

log = logging.getLogger("gpud.fleet")
RUN_S_VAR = "GPUD_EMULATED_RUN_S"
EXIT_CODE_VAR = "GPUD_EMULATED_EXIT_CODE"
LEASE_CHECK_S = 0.5
STATUS_EVERY_S = 0.25
KEPT_ERRORS = 100
SIGNALS = {"TERM": 15, "INT": 2, "KILL": 9, "HUP": 1, "USR1": 10, "USR2": 12, "QUIT": 3}


def run_seconds(spec: Any) -> float:
    """How long a task of this start order's ``spec`` runs: its environment's GPUD_EMULATED_RUN_S, else the N of
    a command ``sleep N``, else 0. ValueError when either is given and is not a finite, non-negative number."""
    env = spec.get("env") if isinstance(spec, dict) else None
    if isinstance(env, dict) and env.get(RUN_S_VAR) is not None:
        return _seconds(env[RUN_S_VAR], RUN_S_VAR)
    command = spec.get("command") if isinstance(spec, dict) else None
    if isinstance(command, list) and len(command) == 2 and os.path.basename(str(command[0])) == "sleep":
        return _seconds(command[1], "the sleep command's argument")
    return 0.0


def exit_code(spec: Any) -> int:
    """The exit code a task of this spec ends with: its environment's GPUD_EMULATED_EXIT_CODE, else 0."""
    env = spec.get("env") if isinstance(spec, dict) else None
    value = env.get(EXIT_CODE_VAR) if isinstance(env, dict) else None
    return 0 if value is None else int(value)


def _seconds(value: Any, what: str) -> float:
    seconds = float(value)
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"{what} must be a finite number of seconds, not {value!r}")
    return seconds


@dataclass
class FleetStats:
    """What the emulated nodes saw, all nodes together."""

    registrations: int = 0        # registered answers; more than the nodes: some reconnected
    started: int = 0              # tasks started
    ended: int = 0                # tasks that ran their time out
    stopped: int = 0              # tasks ended by a stop order
    fenced: int = 0               # tasks ended because their node's lease ran out
    lease_expiries: int = 0       # times a node's lease ran out
    duplicate_starts: int = 0     # start orders for a task the node already had (ignored, as the real node does)
    bad_orders: int = 0           # orders the node could not take (logged)
    errors: int = 0               # messages the controller refused
    error_texts: list[str] = field(default_factory=list)
    heartbeat_rtt_ms: list[float] = field(default_factory=list)  # heartbeat sent -> its lease answer
    register_rtt_ms: list[float] = field(default_factory=list)   # register sent -> registered
    first_end: float | None = None  # wall-clock time of the first and the last task end
    last_end: float | None = None

    def note_end(self, at: float) -> None:
        """A task ended at ``at`` (wall clock)."""
        self.first_end = at if self.first_end is None else min(self.first_end, at)
        self.last_end = at if self.last_end is None else max(self.last_end, at)


class EmulatedNode:
    """One node: the real node's link to the controller, GPUs that are only records, tasks that are only timers."""

    def __init__(self, fleet: Fleet, name: str, gpus: list[GpuInfo], connect: Connector) -> None:
        self.fleet = fleet
        self.name = name
        self.gpus = [gpu.to_json() for gpu in gpus]
        self.tasks: dict[TaskKey, TaskState] = {}
        self._ends: dict[TaskKey, asyncio.TimerHandle] = {}
        self.cluster_id: str | None = None
        self.lease_expires: float | None = None
        self._registering = False
        self.link = ControllerLink(fleet.connect_url, fleet.key, self, reconnect_max_s=fleet.reconnect_max_s,
                                   connect=connect)

    # -- what the link asks of its node (gpud.node.link.LinkOwner) --------------------------

    def register_message(self) -> dict:
        """The ``register`` message, as the node daemon sends it (no cgroups, no GPU measures)."""
        self._registering = True
        return {"type": "register", "node": self.name, "pool": self.fleet.pool, "labels": dict(self.fleet.labels),
                "cpus": self.fleet.cpus, "memory_gib": self.fleet.memory_gib, "gpus": self.gpus,
                "tasks": [state.report() for state in self.tasks.values()], "version": gpud.__version__,
                "cluster_id": self.cluster_id, "checkpoints": [],
                "limits": {"enforced": [], "how": "emulated node: runs no processes", "gpu_measures": []}}

    def check_controller(self, answer: dict) -> str | None:
        """Why the controller that answered is not this node's (the first cluster id seen is kept), or None."""
        theirs = answer.get("cluster_id")
        if not isinstance(theirs, str) or not theirs:
            return None
        if self.cluster_id is None:
            self.cluster_id = theirs
        return None if theirs == self.cluster_id else f"this node belongs to cluster {self.cluster_id}, not {theirs}"

    def heartbeat_message(self) -> dict:
        """The ``heartbeat`` message: GPUs and every task the node has."""
        return {"type": "heartbeat", "gpus": self.gpus, "tasks": [state.report() for state in self.tasks.values()]}

    def registered(self, message: dict) -> None:
        """The controller took the registration (and the task list sent with it)."""
        self.fleet.stats.registrations += 1

    def lease_renewed(self, expires: float | None, lease_s: float, grace_s: float) -> None:
        """A lease answer (to the register message or to a heartbeat): note the round trip and the lease."""
        if expires is None:
            self.lease_expires = None
            return
        rtt_ms = (time.monotonic() - (expires - lease_s)) * 1000.0
        stats = self.fleet.stats
        (stats.register_rtt_ms if self._registering else stats.heartbeat_rtt_ms).append(rtt_ms)
        self._registering = False
        self.lease_expires = expires

    async def handle(self, message: dict) -> dict | None:
        """Carry out one order (start, stop, ack, purge, read_log) as the node daemon would; count errors."""
        kind = message.get("type")
        if kind == "error":
            self._refused(str(message.get("error")))
            return None
        if kind == "read_log":
            return {"type": "log", "request": message.get("request"), "data": "", "missing": True}
        if kind == "purge":
            return None
        if kind not in ("start", "stop", "ack"):
            log.warning("node %s: ignoring an order of type %r", self.name, kind)
            self.fleet.stats.bad_orders += 1
            return None
        try:
            key = TaskKey.from_order(message)
            if kind == "start":
                await self._start(key, message.get("spec"))
            elif kind == "stop":
                await self._stop(self._resolve(key), message)
            else:
                self._ack(self._resolve(key))
        except (SpecError, ValueError, TypeError) as exc:
            log.warning("node %s: ignoring a %s order: %s", self.name, kind, exc)
            self.fleet.stats.bad_orders += 1
        return None

    # -- tasks ------------------------------------------------------------------------------

    async def _start(self, key: TaskKey, spec: Any) -> None:
        if key in self.tasks:
            self.fleet.stats.duplicate_starts += 1
            return
        if self.lease_expires is not None and time.monotonic() > self.lease_expires:
            log.warning("node %s: not starting task %s: the lease has run out", self.name, key.dirname)
            return
        seconds, code = run_seconds(spec), exit_code(spec)
        state = TaskState(key, RUNNING, pid=self.fleet.next_pid(), started=time.time())
        self.tasks[key] = state
        self.fleet.stats.started += 1
        self._ends[key] = asyncio.get_running_loop().call_later(seconds, self._end, key, code)
        await self.link.send({"type": "task", **state.report()})

    def _end(self, key: TaskKey, code: int) -> None:
        self._ends.pop(key, None)
        if self._exit(key, exit_code=code) is not None:
            self.fleet.stats.ended += 1

    async def _stop(self, key: TaskKey, order: Mapping[str, Any]) -> None:
        sig = order.get("signal") if isinstance(order.get("signal"), str) else "TERM"
        if self._exit(key, term_signal=SIGNALS.get(str(sig).upper().removeprefix("SIG"), 15),
                      reason="stopped", cause=ExitCause.STOPPED) is not None:
            self.fleet.stats.stopped += 1

    def _exit(self, key: TaskKey, *, exit_code: int | None = None, term_signal: int | None = None,
              reason: str = "", cause: ExitCause = ExitCause.EXITED) -> TaskState | None:
        """End a running task and report it (the report goes out in the background); None when it was not running."""
        state = self.tasks.get(key)
        if state is None or state.state == EXITED:
            return None
        timer = self._ends.pop(key, None)
        if timer is not None:
            timer.cancel()
        ended = time.time()
        self.tasks[key] = exited = state.exited(exit_code=exit_code, term_signal=term_signal, reason=reason,
                                                cause=cause, ended=ended)
        self.fleet.stats.note_end(ended)
        self.fleet.send_soon(self, {"type": "task", **exited.report()})
        return exited

    def _ack(self, key: TaskKey) -> None:
        state = self.tasks.get(key)
        if state is not None and state.state == EXITED:
            del self.tasks[key]

    def _resolve(self, key: TaskKey) -> TaskKey:
        """The task an order without a job uid means: the one with that job id, task and attempt."""
        if key.uid or key in self.tasks:
            return key
        return next((known for known in self.tasks if known.same_task(key)), key)

    def check_lease(self, now: float) -> None:
        """End the running tasks when the lease has run out, as the node's fence does."""
        if self.lease_expires is None or now <= self.lease_expires:
            return
        running = [key for key, state in self.tasks.items() if state.state != EXITED]
        if running:
            log.warning("node %s: the lease ran out %.1f s ago; ending %d task(s)", self.name,
                        now - self.lease_expires, len(running))
            self.fleet.stats.lease_expiries += 1
            for key in running:
                if self._exit(key, term_signal=9, reason=FENCED_REASON, cause=ExitCause.FENCED) is not None:
                    self.fleet.stats.fenced += 1

    def _refused(self, text: str) -> None:
        stats = self.fleet.stats
        stats.errors += 1
        if len(stats.error_texts) < KEPT_ERRORS:
            stats.error_texts.append(f"{self.name}: {text}")
        log.error("node %s: the controller refused a message: %s", self.name, text)


class Fleet:
    """``names`` emulated nodes of ``gpus_per_node`` GPUs each, connected to the controller at ``controller_url``."""

    def __init__(self, controller_url: str, key: str, names: list[str], *, gpus_per_node: int = 8,
                 cpus: float = 64.0, memory_gib: float = 1024.0, gpu_memory_gib: float = 80.0,
                 model: str = "Emulated GPU", pool: str = "default", labels: Mapping[str, str] | None = None,
                 ramp_s: float = 0.0, reconnect_max_s: float = 10.0) -> None:
        self.connect_url = node_url(controller_url)
        self.key = key
        self.names = names
        self.gpus_per_node = gpus_per_node
        self.cpus, self.memory_gib = cpus, memory_gib
        self.gpu_memory_gib, self.model = gpu_memory_gib, model
        self.pool, self.labels = pool, dict(labels or {})
        self.ramp_s = ramp_s
        self.reconnect_max_s = reconnect_max_s
        self.stats = FleetStats()
        self.nodes: list[EmulatedNode] = []
        self._pids = itertools.count(1000)
        self._sending: set[asyncio.Task] = set()

    def next_pid(self) -> int:
        """A process id for a started task (the fleet's own count: no process exists)."""
        return next(self._pids)

    def send_soon(self, node: EmulatedNode, message: dict) -> None:
        """Send ``message`` on ``node``'s link in the background (from a timer, which cannot wait)."""
        task = asyncio.ensure_future(node.link.send(message))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def run(self) -> None:
        """Connect every node (spread over ``ramp_s``) and keep them connected until cancelled."""
        # No limit on connections: each node holds one WebSocket for as long as it runs.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            connect = ws_connector(session, self.connect_url, self.key)
            links: list[asyncio.Task] = []
            try:
                gap = self.ramp_s / max(1, len(self.names))
                for number, name in enumerate(self.names):
                    gpus = [GpuInfo(index, f"GPU-{name}-{index}", self.model, self.gpu_memory_gib)
                            for index in range(self.gpus_per_node)]
                    node = EmulatedNode(self, name, gpus, connect)
                    self.nodes.append(node)
                    links.append(asyncio.create_task(node.link.run(), name=f"gpud-fleet-{name}"))
                    if gap and number + 1 < len(self.names):
                        await asyncio.sleep(gap)
                while True:
                    await asyncio.sleep(LEASE_CHECK_S)
                    now = time.monotonic()
                    for node in self.nodes:
                        node.check_lease(now)
            finally:
                for task in links:
                    task.cancel()
                await asyncio.gather(*links, *self._sending, return_exceptions=True)

    def connected(self) -> int:
        """How many nodes are registered with the controller now."""
        return sum(1 for node in self.nodes if node.link.connected.is_set())

    def status(self) -> dict:
        """The counts so far: nodes connected, tasks started, running and ended, errors."""
        s = self.stats
        running = sum(1 for node in self.nodes for state in node.tasks.values() if state.state != EXITED)
        return {"nodes": len(self.names), "connected": self.connected(), "registrations": s.registrations,
                "started": s.started, "running": running, "ended": s.ended, "stopped": s.stopped,
                "fenced": s.fenced, "errors": s.errors, "first_end": s.first_end, "last_end": s.last_end}

    def report(self) -> dict:
        """Everything :meth:`status` says, the heartbeats' round trips, errors and this process's CPU time."""
        s = self.stats
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {**self.status(), "lease_expiries": s.lease_expiries, "duplicate_starts": s.duplicate_starts,
                "bad_orders": s.bad_orders, "error_texts": s.error_texts,
                "heartbeats": len(s.heartbeat_rtt_ms), "heartbeat_rtt_ms": summary(s.heartbeat_rtt_ms),
                "register_rtt_ms": summary(s.register_rtt_ms), "heartbeat_rtt_ms_all": s.heartbeat_rtt_ms,
                "cpu_s": round(usage.ru_utime + usage.ru_stime, 3)}


def summary(samples: list[float]) -> dict:
    """Median, 99th percentile and largest of ``samples`` (None each when there are none), rounded."""
    if not samples:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(samples)
    return {"p50": round(statistics.median(ordered), 2), "p99": round(percentile(ordered, 0.99), 2),
            "max": round(ordered[-1], 2)}


def percentile(ordered: list[float], fraction: float) -> float:
    """The ``fraction`` quantile of sorted ``ordered`` (nearest rank)."""
    return ordered[max(0, min(len(ordered) - 1, int(round(fraction * len(ordered))) - 1))]


def _write(path: str, data: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(jsontext.dumps(data))
    os.replace(tmp, path)


async def _serve(fleet: Fleet, status_path: str | None) -> None:
    running = asyncio.create_task(fleet.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, running.cancel)
    try:
        while not running.done():
            if status_path:
                _write(status_path, fleet.status())
            await asyncio.wait({running}, timeout=STATUS_EVERY_S)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        if status_path:
            _write(status_path, fleet.status())


def main(argv: list[str] | None = None) -> int:
    """Emulate the nodes until SIGTERM or SIGINT; write the figures to --report."""
    parser = argparse.ArgumentParser(prog="python -m gpud.testing.fleet",
                                     description="Emulate many gpud node daemons (no processes run) against a "
                                                 "real controller.")
    parser.add_argument("--controller", required=True, help="the controller's URL, e.g. http://127.0.0.1:6830")
    parser.add_argument("--key-file", required=True, help="the cluster key file (the controller's cluster.key)")
    parser.add_argument("--nodes", type=int, required=True, help="how many nodes to emulate")
    parser.add_argument("--first", type=int, default=0, help="the number of the first node (default 0)")
    parser.add_argument("--prefix", default="node-", help="node names are PREFIX + number (default node-)")
    parser.add_argument("--width", type=int, default=0,
                        help="numbers are zero-padded to this many digits (default: those of the last number)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs of each node (default 8)")
    parser.add_argument("--cpus", type=float, default=64.0, help="CPUs of each node (default 64)")
    parser.add_argument("--memory-gib", type=float, default=1024.0, help="memory of each node (default 1024)")
    parser.add_argument("--pool", default="default", help="the nodes' pool (default default)")
    parser.add_argument("--ramp-s", type=float, default=0.0,
                        help="spread the nodes' first connections over this many seconds (default 0)")
    parser.add_argument("--status", help="rewrite this file with the counts so far, 4 times a second")
    parser.add_argument("--report", help="write the figures to this file when stopped")
    parser.add_argument("--log-level", default="warning", help="log level (default warning)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with open(args.key_file, encoding="utf-8") as f:
        key = f.read().strip()
    width = args.width or len(str(args.first + args.nodes - 1))
    names = [f"{args.prefix}{number:0{width}d}" for number in range(args.first, args.first + args.nodes)]
    fleet = Fleet(args.controller, key, names, gpus_per_node=args.gpus_per_node, cpus=args.cpus,
                  memory_gib=args.memory_gib, pool=args.pool, ramp_s=args.ramp_s)
    asyncio.run(_serve(fleet, args.status))
    if args.report:
        _write(args.report, fleet.report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
