"""The slicer's heartbeat, by which a task's supervisor knows it may be frozen by someone still alive.

The slicer refreshes a file in the node's state directory at least every
:data:`BEAT_S`; a supervisor whose task is time-sliced thaws the task
whenever that file is older than :data:`SILENCE_S`, so a dead or hung
daemon never leaves a job frozen.
"""

from __future__ import annotations

import os
import time

HEARTBEAT_FILE = "slicer.alive"
BEAT_S = 0.5
SILENCE_S = 3.0
STOPPING_FILE = "stopping"  # in a task directory: the task is being stopped, never freeze it again


def heartbeat_path(state_dir: str) -> str:
    """The heartbeat file of the node whose state directory is ``state_dir``."""
    return os.path.join(state_dir, HEARTBEAT_FILE)


def beat(path: str) -> None:
    """Say the slicer is alive now."""
    try:
        os.utime(path)
    except FileNotFoundError:
        with open(path, "w"):
            pass
    except OSError:
        pass


def silent(path: str, silence_s: float = SILENCE_S, now: float | None = None) -> bool:
    """True when no slicer has beaten for ``silence_s`` seconds (or never has)."""
    try:
        last = os.stat(path).st_mtime
    except OSError:
        return True
    return (time.time() if now is None else now) - last > silence_s


def mark_stopping(task_dir: str) -> None:
    """Record that the task is being stopped, so the slicer leaves it thawed from now on."""
    try:
        with open(os.path.join(task_dir, STOPPING_FILE), "w"):
            pass
    except OSError:
        pass
