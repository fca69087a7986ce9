"""A task's identity and launch spec, parsed from the controller's ``start`` order, and the environment it gets."""

from __future__ import annotations

import math
import os
import re
import signal
from dataclasses import dataclass, field
from typing import Any, Mapping

DEFAULT_OUTPUT = "gpud-%j.out"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_JOB_ID = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$")


class SpecError(ValueError):
    """A start order that cannot be run; the message says which field is wrong."""


@dataclass(frozen=True, slots=True, order=True)
class TaskKey:
    """Which task: the job id, the task's index in the job and the attempt (the job's restart count)."""

    job: str
    task: int
    attempt: int

    @property
    def dirname(self) -> str:
        """The name of this task's directory under the node's ``tasks`` directory."""
        return f"{self.job}.{self.task}.{self.attempt}"

    @classmethod
    def from_dirname(cls, name: str) -> TaskKey | None:
        """The key a task directory name stands for, or None when the name is not one."""
        job, _, rest = name.rpartition(".")
        job, _, task = job.rpartition(".")
        if not (_JOB_ID.match(job) and task.isdigit() and rest.isdigit()):
            return None
        return cls(job, int(task), int(rest))

    @classmethod
    def from_order(cls, order: Mapping[str, Any]) -> TaskKey:
        """The key of a start/stop/ack order; a job id that is not a safe file name is refused."""
        job, task, attempt = order.get("job"), order.get("task"), order.get("attempt", 0)
        if not isinstance(job, str) or not _JOB_ID.match(job):
            raise SpecError(f"job must be an id of letters, digits, '_', '-' and '.' (got {job!r})")
        for name, value in (("task", task), ("attempt", attempt)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError(f"{name} must be a non-negative integer (got {value!r})")
        return cls(job, task, attempt)

    def to_json(self) -> dict:
        """The key as the fields of a protocol message."""
        return {"job": self.job, "task": self.task, "attempt": self.attempt}


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """What to run for one task and how, as the controller's ``start`` order says."""

    user: str
    workdir: str
    command: tuple[str, ...] | None = None
    script: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    gpu_uuids: tuple[str, ...] = ()
    gpu_indices: tuple[int, ...] = ()
    gpu_share: float = 1.0
    cpus: float = 1.0
    memory_gib: float = 1.0
    time_limit_s: float | None = None
    stop_signal: str = "TERM"
    grace_s: float = 30.0
    output: str = DEFAULT_OUTPUT
    error: str | None = None
    num_tasks: int = 1
    restart_count: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    def to_json(self) -> dict:
        """The spec as JSON, readable back with :func:`parse_spec`."""
        data = {name: getattr(self, name) for name in self.__slots__}
        data["command"] = list(self.command) if self.command is not None else None
        data["env"] = dict(self.env)
        data["gpu_uuids"], data["gpu_indices"] = list(self.gpu_uuids), list(self.gpu_indices)
        return data


def _number(raw: Mapping, name: str, default: Any, *, positive: bool = False) -> Any:
    value = raw.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise SpecError(f"{name} must be a non-negative number (got {value!r})")
    if positive and value == 0:
        raise SpecError(f"{name} must be greater than 0")
    return value


def _int(raw: Mapping, name: str, default: Any) -> Any:
    value = raw.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(f"{name} must be a non-negative integer (got {value!r})")
    return value


def _strings(raw: Mapping, name: str) -> tuple[str, ...] | None:
    value = raw.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{name} must be a list of strings")
    return tuple(value)


def parse_spec(raw: Any) -> TaskSpec:
    """Check a start order's ``spec`` and return it as a TaskSpec; a bad field is a SpecError naming it."""
    if not isinstance(raw, Mapping):
        raise SpecError("spec must be an object")
    user, workdir = raw.get("user"), raw.get("workdir")
    if not isinstance(user, str) or not user:
        raise SpecError("user must be a user name")
    if not isinstance(workdir, str) or not os.path.isabs(workdir):
        raise SpecError(f"workdir must be an absolute path (got {workdir!r})")
    command, script = _strings(raw, "command"), raw.get("script")
    if (command is None) == (script is None):
        raise SpecError("exactly one of command and script must be given")
    if command is not None and (not command or not command[0]):
        raise SpecError("command must not be empty")
    if script is not None and not isinstance(script, str):
        raise SpecError("script must be a string")
    env = raw.get("env") or {}
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and k and "=" not in k and "\0" not in k
                                               and isinstance(v, str) and "\0" not in v for k, v in env.items()):
        raise SpecError("env must map variable names to strings")
    uuids = _strings(raw, "gpu_uuids") or ()
    indices = raw.get("gpu_indices") or []
    if not isinstance(indices, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in indices):
        raise SpecError("gpu_indices must be a list of integers")
    stop_signal = raw.get("stop_signal") or "TERM"
    signal_number(stop_signal)
    for name in ("output", "error", "master_addr"):
        if raw.get(name) is not None and not isinstance(raw[name], str):
            raise SpecError(f"{name} must be a string")
    time_limit = _number(raw, "time_limit_s", None, positive=True)
    return TaskSpec(
        user=user, workdir=workdir, command=command, script=script, env=dict(env),
        gpu_uuids=uuids, gpu_indices=tuple(indices), gpu_share=float(_number(raw, "gpu_share", 1.0)),
        cpus=float(_number(raw, "cpus", 1.0)), memory_gib=float(_number(raw, "memory_gib", 1.0)),
        time_limit_s=None if time_limit is None else float(time_limit), stop_signal=stop_signal,
        grace_s=float(_number(raw, "grace_s", 30.0)), output=raw.get("output") or DEFAULT_OUTPUT,
        error=raw.get("error") or None, num_tasks=_int(raw, "num_tasks", 1) or 1,
        restart_count=_int(raw, "restart_count", 0), master_addr=raw.get("master_addr"),
        master_port=_int(raw, "master_port", None), rank=_int(raw, "rank", 0),
        local_rank=_int(raw, "local_rank", 0), world_size=_int(raw, "world_size", 1) or 1)


def signal_number(name: str | int) -> int:
    """The number of a signal named like "TERM", "SIGTERM", "15" (or given as a number); SpecError if unknown."""
    if isinstance(name, int) and not isinstance(name, bool):
        text = str(name)
    elif isinstance(name, str):
        text = name.strip().upper()
    else:
        raise SpecError(f"stop_signal must be a signal name (got {name!r})")
    if text.isdigit():
        try:
            return int(signal.Signals(int(text)))
        except ValueError:
            raise SpecError(f"unknown signal {name!r}") from None
    try:
        return int(signal.Signals[text if text.startswith("SIG") else "SIG" + text])
    except KeyError:
        raise SpecError(f"unknown signal {name!r}") from None


def expand_path(pattern: str, workdir: str, key: TaskKey) -> str:
    """An output/error file pattern as an absolute path: ``%j`` job id, ``%t`` task index, ``%%`` a percent sign."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "%" and i + 1 < len(pattern) and pattern[i + 1] in "jt%":
            out.append({"j": key.job, "t": str(key.task), "%": "%"}[pattern[i + 1]])
            i += 2
            continue
        out.append(ch)
        i += 1
    return os.path.normpath(os.path.join(workdir, "".join(out)))


def task_env(spec: TaskSpec, key: TaskKey, checkpoint_dir: str, home: str | None = None,
             user: str | None = None) -> dict[str, str]:
    """The environment of a task: the job's own variables, then what gpud sets (which wins)."""
    env = {"PATH": DEFAULT_PATH}
    if home:
        env["HOME"] = home
    if user:
        env["USER"] = env["LOGNAME"] = user
    env.update(spec.env)
    env.update({
        "CUDA_VISIBLE_DEVICES": ",".join(spec.gpu_uuids),
        "GPUD_JOB_ID": key.job,
        "GPUD_TASK_INDEX": str(key.task),
        "GPUD_NUM_TASKS": str(spec.num_tasks),
        "GPUD_RESTART_COUNT": str(spec.restart_count),
        "GPUD_CHECKPOINT_DIR": checkpoint_dir,
    })
    if spec.num_tasks > 1:
        env.update({
            "MASTER_ADDR": spec.master_addr or "127.0.0.1",
            "MASTER_PORT": str(spec.master_port or 29500),
            "WORLD_SIZE": str(spec.world_size),
            "RANK": str(spec.rank),
            "LOCAL_RANK": str(spec.local_rank),
        })
    return env
