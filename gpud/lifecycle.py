"""The job lifecycle and its tasks' runs: state names and the tables of allowed transitions."""

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


# A task run is one incarnation of a job's task as the controller sees it (gpud.jobs.TaskRun): placed on a
# node and to be started there, running (its node reports it), or exited (its node reported the exit). A run
# that is stopped or whose job is requeued is not moved: it is replaced by a fresh run in RUN_NONE.
RUN_NONE = "none"
RUN_STARTING = "starting"
RUN_RUNNING = "running"
RUN_EXITED = "exited"
RUN_STATES = (RUN_NONE, RUN_STARTING, RUN_RUNNING, RUN_EXITED)

# (from, to) -> what moved the run along that edge.
RUN_TRANSITIONS: dict[tuple[str, str], str] = {
    (RUN_NONE, RUN_STARTING): "placed",
    (RUN_STARTING, RUN_RUNNING): "started",
    (RUN_STARTING, RUN_EXITED): "exited before it was seen running",
    (RUN_RUNNING, RUN_EXITED): "exited",
}


def check_run_transition(current: str, new: str) -> str:
    """The name of the task-run edge ``current`` -> ``new``; raises TransitionError when there is none."""
    try:
        return RUN_TRANSITIONS[(current, new)]
    except KeyError:
        raise TransitionError(f"a task run cannot go from {current} to {new}") from None
