"""A task's identity, its launch spec (the wire's TaskSpec, from the controller's ``start`` order), and the
environment it gets."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

from gpud.wire.fields import WireError
from gpud.wire.task import DEFAULT_OUTPUT, TaskSpec, is_job_uid, signal_number

__all__ = ["DEFAULT_OUTPUT", "SpecError", "TaskKey", "TaskSpec", "expand_path", "is_job_uid", "sharing_env",
           "signal_number", "task_env"]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_JOB_ID = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$")


class SpecError(WireError):
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
    if memory and memory.limit_mib:
        fraction = f"{memory.fraction:.4f}"
        env.update({"GPUD_GPU_MEMORY_LIMIT_MIB": str(int(memory.limit_mib)), "GPUD_GPU_MEMORY_FRACTION": fraction,
                    "XLA_PYTHON_CLIENT_MEM_FRACTION": fraction, "XLA_CLIENT_MEM_FRACTION": fraction,
                    "PYTHONPATH": os.pathsep.join(p for p in (STARTUP_HOOK_DIR, pythonpath) if p)})
        env.update(memory.env)
    slicing = spec.time_slicing
    if slicing:
        env.update({"GPUD_TIME_SLICING": slicing.mode, "GPUD_COMPUTE_REQUEST": f"{slicing.request:g}",
                    "GPUD_COMPUTE_LIMIT": f"{slicing.limit:g}"})
    return env


STARTUP_HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup")
