"""A task's identity and launch spec, parsed from the controller's ``start`` order, and the environment it gets."""

from __future__ import annotations

import math
import os
import re
import signal
from dataclasses import dataclass, field
from typing import Any, Mapping, TypeGuard

from gpud.task_defaults import DEFAULT_TASK_PIDS_MAX

DEFAULT_OUTPUT = "gpud-%j.out"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_JOB_ID = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$")
_JOB_UID = re.compile(r"^[0-9a-f]{16,64}$")


class SpecError(ValueError):
    """A start order that cannot be run; the message says which field is wrong."""


@dataclass(frozen=True, slots=True, order=True)
class TaskKey:
    """Which task: the job id, the task's index in the job, the attempt (the job's restart count) and the job uid.

    The uid (empty from a controller that sends none) tells apart two jobs
    given the same id, e.g. by a controller restored from a backup: their
    tasks have different directories and reports.
    """

    job: str
    task: int
    attempt: int
    uid: str = ""

    @property
    def dirname(self) -> str:
        """The name of this task's directory under the node's ``tasks`` directory."""
        base = f"{self.job}.{self.task}.{self.attempt}"
        return f"{base}@{self.uid}" if self.uid else base

    @classmethod
    def from_dirname(cls, name: str) -> TaskKey | None:
        """The key a task directory name stands for, or None when the name is not one."""
        name, at, uid = name.partition("@")
        if at and not is_job_uid(uid):
            return None
        job, _, rest = name.rpartition(".")
        job, _, task = job.rpartition(".")
        if not (_JOB_ID.match(job) and task.isdigit() and rest.isdigit()):
            return None
        return cls(job, int(task), int(rest), uid)

    @classmethod
    def from_order(cls, order: Mapping[str, Any]) -> TaskKey:
        """The key of a start/stop/ack order; a job id that is not a safe file name is refused.

        The uid is the order's ``job_uid``, else its spec's (a start order); "" when neither has one.
        """
        job, task, attempt = order.get("job"), order.get("task"), order.get("attempt", 0)
        if not isinstance(job, str) or not _JOB_ID.match(job):
            raise SpecError(f"job must be an id of letters, digits, '_', '-' and '.' (got {job!r})")
        for name, value in (("task", task), ("attempt", attempt)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError(f"{name} must be a non-negative integer (got {value!r})")
        assert isinstance(task, int) and isinstance(attempt, int)  # checked just above
        spec = order.get("spec")
        uid = order.get("job_uid") or (spec.get("job_uid") if isinstance(spec, dict) else None) or ""
        if uid != "" and not is_job_uid(uid):
            raise SpecError(f"job_uid must be 16 to 64 lowercase hex digits (got {uid!r})")
        return cls(job, task, attempt, uid)

    def to_json(self) -> dict:
        """The key as the fields of a protocol message (``job_uid`` only when it has one)."""
        fields: dict = {"job": self.job, "task": self.task, "attempt": self.attempt}
        if self.uid:
            fields["job_uid"] = self.uid
        return fields

    def same_task(self, other: TaskKey) -> bool:
        """True when ``other`` names the same job id, task and attempt, whatever the uids."""
        return (self.job, self.task, self.attempt) == (other.job, other.task, other.attempt)


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """What to run for one task and how, as the controller's ``start`` order says."""

    user: str
    workdir: str
    allow_root: bool = False
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
    job_uid: str = ""  # names the job's checkpoint directory; "" from a controller that sends none
    master_addr: str | None = None
    master_port: int | None = None
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    project: str = ""
    time_slicing: Mapping[str, Any] | None = None
    memory_slice: Mapping[str, Any] | None = None
    near_cpus: tuple[int, ...] = ()  # the CPUs near the task's GPUs, where the node knows them; pinned there first
    # The most processes (threads included) the task may have at once: the order's, else the policy's default.
    pids_max: int = DEFAULT_TASK_PIDS_MAX
    warn_signal: str | None = None  # --signal SIG@LEAD: SIG ``warn_lead_s`` before the time limit
    warn_lead_s: float = 0.0
    warn_batch_only: bool = False  # the task's first process alone hears it
    last_checkpoint: float | None = None  # the job's last complete checkpoint (Unix time), for a restart
    checkpoint_token: str = ""  # the job's checkpoint credential (gpuctl checkpointed)
    controller_url: str = ""  # where gpuctl in the task reaches the controller (the node's own setting)
    controller_ca: str = ""  # the CA file gpuctl in the task checks the controller's certificate with (GPUD_CA)

    @property
    def sliced(self) -> bool:
        """True when the task shares its GPU under strict or fair time-slicing."""
        return bool(self.time_slicing and self.time_slicing["mode"] in ("strict", "fair"))

    def to_json(self) -> dict:
        """The spec as JSON, readable back with :func:`parse_spec`."""
        data = {name: getattr(self, name) for name in self.__slots__}
        data["command"] = list(self.command) if self.command is not None else None
        data["env"] = dict(self.env)
        data["gpu_uuids"], data["gpu_indices"] = list(self.gpu_uuids), list(self.gpu_indices)
        data["near_cpus"] = list(self.near_cpus)
        for name in ("time_slicing", "memory_slice"):
            data[name] = dict(data[name]) if data[name] is not None else None
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


SLICING_MODES = ("off", "strict", "fair")


def _time_slicing(raw: Mapping) -> dict | None:
    value = raw.get("time_slicing")
    if value is None:
        return None
    if not isinstance(value, Mapping) or value.get("mode") not in SLICING_MODES:
        raise SpecError(f"time_slicing must be an object whose mode is one of {', '.join(SLICING_MODES)}")
    out = {"mode": value["mode"], "lease_ms": float(_number(value, "lease_ms", 250.0, positive=True)),
           "precision": float(_number(value, "precision", 0.05, positive=True)),
           "request": float(_number(value, "request", 0.0)), "limit": float(_number(value, "limit", 1.0))}
    if not (out["request"] <= out["limit"] <= 1.0 and out["precision"] <= 1.0):
        raise SpecError("time_slicing needs request <= limit <= 1 and precision <= 1")
    return out


def _memory_slice(raw: Mapping) -> dict | None:
    value = raw.get("memory_slice")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SpecError("memory_slice must be an object")
    enforce = value.get("enforce", True)
    if not isinstance(enforce, bool):
        raise SpecError("memory_slice.enforce must be true or false")
    limit = _number(value, "limit_mib", None, positive=True)
    env = value.get("env") or {}
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and k and "=" not in k and isinstance(v, str)
                                               for k, v in env.items()):
        raise SpecError("memory_slice.env must map variable names to strings")
    return {"limit_mib": None if limit is None else float(limit), "env": dict(env),
            "fraction": float(_number(value, "fraction", 1.0)), "tolerance": float(_number(value, "tolerance", 0.05)),
            "grace_s": float(_number(value, "grace_s", 10.0)), "enforce": enforce}


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
    uid = raw.get("job_uid") or ""
    if not is_job_uid(uid) and uid != "":
        raise SpecError(f"job_uid must be 16 to 64 lowercase hex digits (got {uid!r})")
    return TaskSpec(
        user=user, workdir=workdir, allow_root=raw.get("allow_root") is True, command=command, script=script,
        env=dict(env),
        gpu_uuids=uuids, gpu_indices=tuple(indices), gpu_share=float(_number(raw, "gpu_share", 1.0)),
        cpus=float(_number(raw, "cpus", 1.0)), memory_gib=float(_number(raw, "memory_gib", 1.0)),
        time_limit_s=None if time_limit is None else float(time_limit), stop_signal=stop_signal,
        grace_s=float(_number(raw, "grace_s", 30.0)), output=raw.get("output") or DEFAULT_OUTPUT,
        error=raw.get("error") or None, num_tasks=_int(raw, "num_tasks", 1) or 1,
        restart_count=_int(raw, "restart_count", 0), job_uid=uid, master_addr=raw.get("master_addr"),
        master_port=_int(raw, "master_port", None), rank=_int(raw, "rank", 0),
        local_rank=_int(raw, "local_rank", 0), world_size=_int(raw, "world_size", 1) or 1,
        project=raw["project"] if isinstance(raw.get("project"), str) else "",
        time_slicing=_time_slicing(raw), memory_slice=_memory_slice(raw), near_cpus=_cpu_list(raw),
        pids_max=_pids_max(raw), **_checkpointing(raw))


def _checkpointing(raw: Mapping) -> dict[str, Any]:
    """The spec's fields for checkpoints: the early signal, the last checkpoint, the credential."""
    warn = raw.get("warn_signal")
    if warn is not None:
        signal_number(warn)
    last = raw.get("last_checkpoint")
    if last is not None and (isinstance(last, bool) or not isinstance(last, (int, float)) or not math.isfinite(last)):
        raise SpecError("last_checkpoint must be a Unix time")
    token, url, ca = raw.get("checkpoint_token") or "", raw.get("controller_url") or "", raw.get("controller_ca") or ""
    if not isinstance(token, str) or not isinstance(url, str) or not isinstance(ca, str):
        raise SpecError("checkpoint_token, controller_url and controller_ca must be strings")
    return {"warn_signal": warn, "warn_lead_s": float(_number(raw, "warn_lead_s", 0.0)),
            "warn_batch_only": raw.get("warn_batch_only") is True,
            "last_checkpoint": None if last is None else float(last), "checkpoint_token": token,
            "controller_url": url, "controller_ca": ca}


def _pids_max(raw: Mapping) -> int:
    value = _int(raw, "pids_max", DEFAULT_TASK_PIDS_MAX)
    if value < 1:
        raise SpecError(f"pids_max must be at least 1 (got {value})")
    return value


def _cpu_list(raw: Mapping) -> tuple[int, ...]:
    value = raw.get("near_cpus") or []
    if not isinstance(value, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                                              for c in value):
        raise SpecError("near_cpus must be a list of CPU numbers")
    return tuple(sorted(set(value)))


def is_job_uid(value: object) -> TypeGuard[str]:
    """True for a job uid as the controller makes them (hex digits, so it is a safe file name)."""
    return isinstance(value, str) and _JOB_UID.match(value) is not None


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
    if spec.last_checkpoint is not None:
        env["GPUD_LAST_CHECKPOINT"] = f"{spec.last_checkpoint:.3f}"
    if spec.checkpoint_token:
        env["GPUD_CHECKPOINT_TOKEN"] = spec.checkpoint_token
        if spec.controller_url:
            env["GPUD_URL"] = spec.controller_url
        if spec.controller_ca:
            env["GPUD_CA"] = spec.controller_ca
    env.update(sharing_env(spec, env.get("PYTHONPATH")))
    if spec.num_tasks > 1:
        env.update({
            "MASTER_ADDR": spec.master_addr or "127.0.0.1",
            "MASTER_PORT": str(spec.master_port or 29500),
            "WORLD_SIZE": str(spec.world_size),
            "RANK": str(spec.rank),
            "LOCAL_RANK": str(spec.local_rank),
        })
    return env


def sharing_env(spec: TaskSpec, pythonpath: str | None = None) -> dict[str, str]:
    """The variables of a task on a shared GPU: its memory slice, framework caps, its compute share.

    JAX reads its memory fraction from the environment; PyTorch has no such
    variable, so a small startup hook (gpud/node/startup/sitecustomize.py,
    put first on PYTHONPATH) sets the per-process fraction when torch is
    imported.
    """
    env: dict[str, str] = {}
    memory = spec.memory_slice
    if memory and memory.get("limit_mib"):
        fraction = f"{memory['fraction']:.4f}"
        env.update({"GPUD_GPU_MEMORY_LIMIT_MIB": str(int(memory["limit_mib"])), "GPUD_GPU_MEMORY_FRACTION": fraction,
                    "XLA_PYTHON_CLIENT_MEM_FRACTION": fraction, "XLA_CLIENT_MEM_FRACTION": fraction,
                    "PYTHONPATH": os.pathsep.join(p for p in (STARTUP_HOOK_DIR, pythonpath) if p)})
        env.update(memory.get("env") or {})
    slicing = spec.time_slicing
    if slicing:
        env.update({"GPUD_TIME_SLICING": slicing["mode"], "GPUD_COMPUTE_REQUEST": f"{slicing['request']:g}",
                    "GPUD_COMPUTE_LIMIT": f"{slicing['limit']:g}"})
    return env


STARTUP_HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup")
