"""The task messages between controller, node and supervisor: start, stop, and the node's task report.

The controller writes ``start`` and ``stop`` orders with these types, the
node and its supervisors read them with ``decode``; a supervisor records a
task's end as a :class:`RunState` and an :class:`ExitCause`, which the task
report carries to the controller beside the human ``reason``. Decisions
read the cause; the reason is only ever shown.
"""

from __future__ import annotations

import enum
import re
import signal
from dataclasses import dataclass
from typing import Any, TypeGuard

from gpud.task_defaults import DEFAULT_TASK_PIDS_MAX
from gpud.wire.fields import WireError, decode, encode, wire

DEFAULT_OUTPUT = "gpud-%j.out"
MAX_INDEX = (1 << 31) - 1    # tasks, attempts, pids, exit codes and signals are 32-bit on every platform
MAX_REPORT_TEXT = 4096
MAX_QUANTITY = 1e18          # bytes, seconds, percentages: anything larger is not a measurement
_JOB_UID = re.compile(r"^[0-9a-f]{16,64}$")


class RunState(enum.StrEnum):
    """Where a task is, as its node reports it (a task still starting reports as running)."""

    RUNNING = "running"
    EXITED = "exited"


class ExitCause(enum.StrEnum):
    """Why a task ended, decided where it happened (the supervisor, the node) and carried as data."""

    EXITED = "exited"                  # its processes ended on their own: see the exit code or signal
    TIMEOUT = "timeout"                # it reached its time limit
    STOPPED = "stopped"                # the controller stopped it (cancel, preemption, requeue)
    OUT_OF_MEMORY = "out_of_memory"    # the kernel killed it at its cgroup's memory limit
    GPU_MEMORY = "gpu_memory"          # the node's watchdog stopped it for holding more GPU memory than its slice
    FAILED_TO_START = "failed_to_start"  # its order could not be run (unknown user, bad workdir, ...)
    STATUS_LOST = "status_lost"        # it ended but its exit status could not be read
    SUPERVISOR_LOST = "supervisor_lost"  # its supervisor died while it ran: the node failed, not the job
    NO_SUPERVISOR = "no_supervisor"    # its supervisor never started: the node failed, not the job
    FENCED = "fenced"                  # the node's lease ran out and the node stopped it

    @property
    def node_fault(self) -> bool:
        """True when the node, not the job, failed: the job is requeued (or ends NODE_FAIL), never FAILED."""
        return self in (ExitCause.SUPERVISOR_LOST, ExitCause.NO_SUPERVISOR, ExitCause.FENCED)


SLICING_MODES = ("off", "strict", "fair")


@dataclass(frozen=True, slots=True)
class TimeSlicingSpec:
    """How a task shares its GPU's time: the policy's mode, lease and precision, the task's request and limit."""

    mode: str = wire("text", required=True, choices=SLICING_MODES)
    lease_ms: float = wire("number", 250.0, above=0.0)
    precision: float = wire("number", 0.05, above=0.0, maximum=1.0)
    request: float = wire("number", 0.0, minimum=0.0)
    limit: float = wire("number", 1.0, minimum=0.0, maximum=1.0)

    def check(self) -> None:
        """Refuse a request above the limit."""
        if self.request > self.limit:
            raise WireError(f"request {self.request:g} is above limit {self.limit:g}", "request")


@dataclass(frozen=True, slots=True)
class MemorySliceSpec:
    """The GPU memory a task sharing its GPU may hold, and how the node watches it."""

    limit_mib: float | None = wire("number", above=0.0)
    env: dict[str, str] = wire("map", factory=dict)  # variables the node's plugins give to enforce it
    fraction: float = wire("number", 1.0, minimum=0.0)
    tolerance: float = wire("number", 0.05, minimum=0.0)
    grace_s: float = wire("number", 10.0, minimum=0.0)
    enforce: bool = wire("flag", True)

    def check(self) -> None:
        """Refuse variable names no environment can hold."""
        _check_env(self.env, "env")


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """What to run for one task and how, as the controller's ``start`` order says."""

    user: str = wire("text", required=True, nonempty=True, expect="a user name")
    workdir: str = wire("text", required=True, absolute=True)
    allow_root: bool = wire("flag", False)
    command: tuple[str, ...] | None = wire("texts")
    script: str | None = wire("text", limit=1 << 30)
    env: dict[str, str] = wire("map", factory=dict, limit=1 << 30)
    job_name: str = wire("text", "")
    project: str = wire("text", "")
    job_uid: str = wire("text", "")  # names the job's checkpoint directory; "" from a controller that sends none
    gpu_uuids: tuple[str, ...] = wire("texts", ())
    gpu_indices: tuple[int, ...] = wire("integers", (), minimum=0)
    gpu_share: float = wire("number", 1.0, minimum=0.0)
    cpus: float = wire("number", 1.0, minimum=0.0)
    memory_gib: float = wire("number", 1.0, minimum=0.0)
    time_limit_s: float | None = wire("number", above=0.0)
    stop_signal: str = wire("text", "TERM")
    grace_s: float = wire("number", 30.0, minimum=0.0)
    output: str = wire("text", DEFAULT_OUTPUT)
    error: str | None = wire("text")
    num_tasks: int = wire("integer", 1, minimum=1)
    restart_count: int = wire("integer", 0, minimum=0)
    master_addr: str | None = wire("text")
    master_port: int | None = wire("integer", minimum=0, maximum=65535)
    rank: int = wire("integer", 0, minimum=0)
    local_rank: int = wire("integer", 0, minimum=0)
    world_size: int = wire("integer", 1, minimum=1)
    interactive: bool = wire("flag", False)  # a terminal attaches to it (gpuctl run)
    time_slicing: TimeSlicingSpec | None = wire("message", of=TimeSlicingSpec)
    memory_slice: MemorySliceSpec | None = wire("message", of=MemorySliceSpec)
    # The CPUs near the task's GPUs, where the node knows them; pinned there first.
    near_cpus: tuple[int, ...] = wire("integers", (), minimum=0)
    # The most processes (threads included) the task may have at once: the order's, else the policy's default.
    pids_max: int = wire("integer", DEFAULT_TASK_PIDS_MAX, minimum=1)
    warn_signal: str | None = wire("text")  # --signal SIG@LEAD: SIG ``warn_lead_s`` before the time limit
    warn_lead_s: float = wire("number", 0.0, minimum=0.0)
    warn_batch_only: bool = wire("flag", False)  # the task's first process alone hears it
    last_checkpoint: float | None = wire("number")  # the job's last complete checkpoint (Unix time), for a restart
    checkpoint_token: str = wire("text", "")  # the job's checkpoint credential (gpuctl checkpointed)
    controller_url: str = wire("text", "")  # where gpuctl in the task reaches the controller (the node's setting)
    controller_ca: str = wire("text", "")  # the CA file gpuctl in the task checks the controller with (GPUD_CA)

    @property
    def sliced(self) -> bool:
        """True when the task shares its GPU under strict or fair time-slicing."""
        return self.time_slicing is not None and self.time_slicing.mode in ("strict", "fair")

    def check(self) -> None:
        """Refuse a spec no task can run: no command or both (an interactive task may have neither: it runs
        the login shell), a bad variable, an unknown signal, a bad uid."""
        login_shell = self.interactive and self.command is None and self.script is None  # the node's holder runs
        if (self.command is None) == (self.script is None) and not login_shell:
            raise WireError("exactly one of command and script must be given", "command")
        if self.command is not None and (not self.command or not self.command[0]):
            raise WireError("command must not be empty", "command")
        _check_env(self.env, "env")
        signal_number(self.stop_signal, "stop_signal")
        if self.warn_signal is not None:
            signal_number(self.warn_signal, "warn_signal")
        if self.job_uid and not is_job_uid(self.job_uid):
            raise WireError(f"job_uid must be 16 to 64 lowercase hex digits (got {self.job_uid!r})", "job_uid")

    @classmethod
    def decode(cls, data: Any, error: type[WireError] = WireError) -> TaskSpec:
        """The spec in ``data`` (a start order's ``spec``); ``error`` naming the field at fault otherwise."""
        spec: TaskSpec = decode(cls, data, path="", error=error)
        return spec

    def to_json(self) -> dict[str, Any]:
        """The spec as JSON, read back by :meth:`decode` to an equal spec."""
        return encode(self)


@dataclass(frozen=True, slots=True)
class TaskStop:
    """A ``stop`` order: the task's stop signal (or ``signal``) to its processes, SIGKILL after ``grace_s``.

    ``cause`` is what the task's exit will say; ``reason`` is shown to people.
    """

    job: str = wire("text", required=True, nonempty=True)
    task: int = wire("integer", required=True, minimum=0, maximum=MAX_INDEX)
    attempt: int = wire("integer", 0, minimum=0, maximum=MAX_INDEX)
    job_uid: str = wire("text", "")
    reason: str = wire("text", "stopped")
    cause: ExitCause = wire("choice", ExitCause.STOPPED, of=ExitCause)
    grace_s: float | None = wire("number", minimum=0.0)
    signal: str | None = wire("text")
    leader_only: bool = wire("flag", False)
    hasten: bool = wire("flag", False)

    def check(self) -> None:
        """Nothing to check across fields."""

    @classmethod
    def decode(cls, data: Any, error: type[WireError] = WireError) -> TaskStop:
        """The stop order in ``data``; ``error`` naming the field at fault otherwise."""
        stop: TaskStop = decode(cls, data, error=error)
        return stop

    def to_json(self) -> dict[str, Any]:
        """The order as a protocol message (``type`` "stop"), unset fields left out."""
        return {"type": "stop", **encode(self)}


@dataclass(frozen=True, slots=True)
class TaskStart:
    """A ``start`` order: run task ``task`` of job ``job`` (attempt ``attempt``) as ``spec`` says."""

    job: str = wire("text", required=True, nonempty=True)
    task: int = wire("integer", required=True, minimum=0, maximum=MAX_INDEX)
    attempt: int = wire("integer", 0, minimum=0, maximum=MAX_INDEX)
    spec: TaskSpec = wire("message", required=True, of=TaskSpec)

    def check(self) -> None:
        """Nothing to check across fields."""

    @classmethod
    def decode(cls, data: Any, error: type[WireError] = WireError) -> TaskStart:
        """The start order in ``data``; ``error`` naming the field at fault otherwise."""
        start: TaskStart = decode(cls, data, error=error)
        return start

    def to_json(self) -> dict[str, Any]:
        """The order as a protocol message (``type`` "start")."""
        return {"type": "start", **encode(self)}


@dataclass(frozen=True, slots=True)
class TaskReport:
    """A task's state as its node reports it: running, or exited with its code, signal and cause."""

    job: str = wire("text", required=True, nonempty=True, limit=MAX_REPORT_TEXT)
    task: int = wire("integer", required=True, minimum=0, maximum=MAX_INDEX)
    attempt: int = wire("integer", required=True, minimum=0, maximum=MAX_INDEX)
    state: RunState = wire("choice", required=True, of=RunState)
    job_uid: str = wire("text", "", limit=MAX_REPORT_TEXT)
    pid: int | None = wire("integer", minimum=0, maximum=MAX_INDEX)
    pid_start: int | None = wire("integer", minimum=0, maximum=MAX_QUANTITY)
    exit_code: int | None = wire("integer", minimum=-MAX_INDEX - 1, maximum=MAX_INDEX)
    term_signal: int | None = wire("integer", minimum=0, maximum=MAX_INDEX)
    cause: ExitCause | None = wire("choice", of=ExitCause)  # an exited task's; none from a node before causes
    reason: str = wire("text", "", limit=MAX_REPORT_TEXT)  # the cause in words, for people
    started: float | None = wire("number", minimum=0.0, maximum=MAX_QUANTITY)
    ended: float | None = wire("number", minimum=0.0, maximum=MAX_QUANTITY)
    max_rss_bytes: int | None = wire("integer", minimum=0, maximum=MAX_QUANTITY)
    cpu_s: float | None = wire("number", minimum=0.0, maximum=MAX_QUANTITY)
    gpu_util: float | None = wire("number", minimum=0.0, maximum=MAX_QUANTITY)
    gpu_memory_gib: float | None = wire("number", minimum=0.0, maximum=MAX_QUANTITY)

    def check(self) -> None:
        """Nothing to check across fields."""

    @property
    def exit_cause(self) -> ExitCause:
        """Why an exited task ended: the reported cause (a task whose node sent none simply exited)."""
        return self.cause if self.cause is not None else ExitCause.EXITED

    @classmethod
    def decode(cls, data: Any, where: str = "task report") -> TaskReport:
        """The report in ``data``; a WireError (a ValueError) naming ``where`` and the field otherwise."""
        report: TaskReport = decode(cls, data, where=where)
        return report

    def to_json(self) -> dict[str, Any]:
        """The report as the node sends it, unset fields left out."""
        return encode(self)


def _check_env(env: dict[str, str], field: str) -> None:
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise WireError(f"{field} must map variable names to strings ({name!r} is not one)", field)


def is_job_uid(value: object) -> TypeGuard[str]:
    """True for a job uid as the controller makes them (hex digits, so it is a safe file name)."""
    return isinstance(value, str) and _JOB_UID.match(value) is not None


def signal_number(name: str | int, field: str = "stop_signal") -> int:
    """The number of a signal named like "TERM", "SIGTERM", "15" (or given as a number); a WireError naming
    ``field`` when there is no such signal."""
    if isinstance(name, int) and not isinstance(name, bool):
        text = str(name)
    elif isinstance(name, str):
        text = name.strip().upper()
    else:
        raise WireError(f"{field} must be a signal name (got {name!r})", field)
    try:
        if text.isdigit():
            return int(signal.Signals(int(text)))
        return int(signal.Signals[text if text.startswith("SIG") else "SIG" + text])
    except (KeyError, ValueError):
        raise WireError(f"unknown signal {name!r}", field) from None
