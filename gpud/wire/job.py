"""The job request: what a client (gpuctl, sbatch, a script) POSTs to the controller to submit a job.

Each field is declared once here; the controller reads requests with
:meth:`JobRequest.decode`, gpuctl writes them with :meth:`JobRequest.to_json`,
and the OpenAPI document shows :func:`job_request_schema`. What needs the
policy or the cluster (a known project, a quota, a node that fits) is
checked on admission (gpud/submission.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpud.wire.fields import WRONG_TYPE, WireError, decode, encode, json_schema, wire

STOP_SIGNALS = ("TERM", "INT", "HUP", "USR1", "USR2", "QUIT", "KILL")
WARN_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "URG", "CONT", "WINCH", "ALRM")
MAX_WARN_LEAD_S = 65535.0
MAX_TASKS = 10_000
MAX_SCRIPT = 4 * 1024 * 1024
MAX_PRIORITY = 10**6


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A job as submitted, each field checked alone (absent fields take the defaults shown)."""

    project: str = wire("text", required=True)
    command: tuple[str, ...] | None = wire("texts")
    script: str | None = wire("text", limit=MAX_SCRIPT)
    name: str | None = wire("text")
    workdir: str = wire("text", required=True, absolute=True)
    env: dict[str, str] = wire("map", factory=dict)
    gpus: float = wire("number", 0.0, minimum=0.0)
    gpu_memory_gib: float | None = wire("number", above=0.0)
    tasks: int = wire("integer", 1, minimum=1, maximum=MAX_TASKS)
    min_tasks: int | None = wire("integer", minimum=1, maximum=MAX_TASKS)
    cpus: float = wire("number", 1.0, minimum=0.0)  # 0: a task that asks for no CPU of its own
    memory_gib: float = wire("number", 1.0, above=0.0)
    priority: str | int | None = wire("name_or_integer", minimum=-MAX_PRIORITY, maximum=MAX_PRIORITY,
                                      expect="a priority class name or an integer")
    constraint: dict[str, str] = wire("map", factory=dict)
    pool: str | None = wire("text")
    time_limit_s: float | None = wire("number", above=0.0)
    array: str | None = wire("text")
    depends: tuple[str, ...] = wire("texts", ())
    hold: bool = wire("flag", False)
    requeue: bool = wire("flag", True)
    stop_signal: str = wire("text", "TERM", choices=STOP_SIGNALS, prefix="SIG")
    output: str | None = wire("text")
    error: str | None = wire("text")
    gpu_compute_request: float | None = wire("number", minimum=0.0)
    gpu_compute_limit: float | None = wire("number", minimum=0.0)
    interactive: bool = wire("flag", False)
    partition: str | None = wire("text", expect="a partition name")
    qos: str | None = wire("text", expect="a QOS name")
    warn_signal: str | None = wire("text", choices=WARN_SIGNALS, prefix="SIG")
    warn_lead_s: float | None = wire("number", minimum=0.0, maximum=MAX_WARN_LEAD_S)
    warn_batch_only: bool = wire("flag", False)

    def check(self) -> None:
        """Refuse fields that do not go together: a command and a script, a gang's minimum, an early signal."""
        if not (self.interactive and self.command is None and self.script is None):
            if (self.command is None) == (self.script is None):
                raise WireError("give exactly one of command (an argv list) and script (a script's text)",
                                "command")
            if self.command is not None and not self.command:
                raise WireError("command must not be empty", "command")
        if self.min_tasks is not None and self.min_tasks > self.tasks:
            raise WireError(f"min_tasks must be an integer between 1 and {self.tasks}, not {self.min_tasks}",
                            "min_tasks")
        if self.gpu_memory_gib is not None and self.gpus:
            raise WireError("give gpus or gpu_memory_gib, not both", "gpu_memory_gib")
        if self.gpus > 1 and not float(self.gpus).is_integer():
            raise WireError(f"gpus must be a whole number or a fraction below 1, not {self.gpus:g}", "gpus")
        if self.warn_signal is None and (self.warn_lead_s is not None or self.warn_batch_only):
            raise WireError("warn_lead_s and warn_batch_only go with warn_signal (--signal SIG@LEAD)", "warn_signal")
        if self.warn_signal is not None and self.warn_lead_s is None:
            raise WireError(f"warn_lead_s must be 0 to {MAX_WARN_LEAD_S:g} seconds", "warn_lead_s")

    @classmethod
    def decode(cls, data: Any, error: type[WireError] = WireError) -> JobRequest:
        """The request in ``data`` (a submit's JSON); ``error`` naming the first field at fault otherwise."""
        if not isinstance(data, dict):
            raise error("a job must be a JSON object", None, WRONG_TYPE)
        request: JobRequest = decode(cls, data, strict=True, error=error)
        return request

    def to_json(self) -> dict[str, Any]:
        """The request as JSON for the submit API (fields left unset are left out)."""
        return encode(self)


def job_request_schema() -> dict[str, Any]:
    """The JSON Schema of a job request (the OpenAPI document's JobIn)."""
    return json_schema(JobRequest, strict=True)


JOB_FIELDS = frozenset(job_request_schema()["properties"])
