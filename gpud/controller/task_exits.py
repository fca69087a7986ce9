"""What a task's exit means for its job, decided from the exit cause its node reported, never from words.

The node decides why a task ended (gpud.wire.task.ExitCause) and says it
in words beside it; here the cause picks the job's fate and the words are
only shown.
"""

from __future__ import annotations

import enum
from typing import Any

from gpud.jobs import TaskRun
from gpud.wire.task import ExitCause


class Outcome(enum.Enum):
    """What one task's exit does to its job."""

    NODE_FAULT = "node fault"    # the node failed, not the job: requeue it (or end it NODE_FAIL)
    TIMEOUT = "timeout"          # the job reached its time limit
    FAILED = "failed"            # the job failed
    DONE = "done"                # the task succeeded


def reported_cause(report: dict[str, Any]) -> ExitCause:
    """The exit cause in a checked task report (gpud.controller.node_schema); EXITED from a node that sends none."""
    cause = report.get("cause")
    return ExitCause(cause) if cause is not None else ExitCause.EXITED


def outcome(run: TaskRun) -> Outcome:
    """What the exit of ``run`` (exited, its cause recorded) does to its job."""
    cause = run.cause or ExitCause.EXITED
    if cause.node_fault:
        return Outcome.NODE_FAULT
    if cause is ExitCause.TIMEOUT:
        return Outcome.TIMEOUT
    if cause is ExitCause.FAILED_TO_START or run.exit_code != 0 or run.term_signal:
        return Outcome.FAILED
    return Outcome.DONE


def exit_text(run: TaskRun) -> str:
    """How the task ended, in words following "task N" in the job's reason and events."""
    cause = run.cause or ExitCause.EXITED
    if cause in (ExitCause.OUT_OF_MEMORY, ExitCause.FAILED_TO_START) or cause.node_fault:
        return run.reason
    if cause is ExitCause.GPU_MEMORY:
        return f"was stopped by the node: {run.reason}"
    if run.term_signal:
        return f"was killed by signal {run.term_signal}"
    return f"exited with code {run.exit_code}"
