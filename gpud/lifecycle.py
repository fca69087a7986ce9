"""The job lifecycle: Slurm's state names and the one table of allowed transitions."""

from __future__ import annotations

PENDING = "PENDING"
RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
TIMEOUT = "TIMEOUT"
PREEMPTED = "PREEMPTED"
NODE_FAIL = "NODE_FAIL"

STATES = (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, PREEMPTED, NODE_FAIL)
ACTIVE = frozenset({PENDING, RUNNING})
FINISHED = frozenset(STATES) - ACTIVE

# (from, to) -> the event that moves a job along that edge. A requeue after
# preemption or a node failure goes back to PENDING (the job's restart count
# grows); without requeue the job ends PREEMPTED or NODE_FAIL.
TRANSITIONS: dict[tuple[str, str], str] = {
    (PENDING, RUNNING): "started",
    (PENDING, CANCELLED): "cancelled",
    (RUNNING, COMPLETED): "completed",
    (RUNNING, FAILED): "failed",
    (RUNNING, TIMEOUT): "timed out",
    (RUNNING, CANCELLED): "cancelled",
    (RUNNING, PREEMPTED): "preempted",
    (RUNNING, NODE_FAIL): "node failed",
    (RUNNING, PENDING): "requeued",
}


class TransitionError(ValueError):
    """A state change the lifecycle does not allow (a bug in the caller, never user input)."""


def check_transition(current: str, new: str) -> str:
    """The event name of the edge ``current`` -> ``new``; raises TransitionError when there is none."""
    try:
        return TRANSITIONS[(current, new)]
    except KeyError:
        raise TransitionError(f"a job cannot go from {current} to {new}") from None


def is_finished(state: str) -> bool:
    """True for the states a job never leaves."""
    return state in FINISHED
