"""Checkpoints a job marks with a file: the node notices ``.gpud-checkpointed`` in a running job's
checkpoint directory, and reports each new one to the controller (for programs that cannot run
``gpuctl checkpointed``)."""

from __future__ import annotations

import os
from typing import Iterable

from gpud.node.taskstate import RUNNING, Layout, TaskState

MARKER_FILE = ".gpud-checkpointed"


class CheckpointWatch:
    """The marker file's last modification time reported, by job uid."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.reported: dict[str, float] = {}

    def new_marks(self, states: Iterable[TaskState]) -> list[dict]:
        """A ``checkpointed`` message for each running job whose marker file changed since it was last
        reported (its time is the file's modification time); jobs no longer running are forgotten."""
        running: dict[str, str] = {}
        for state in states:
            if state.state == RUNNING and state.key.uid:
                running.setdefault(state.key.uid, state.key.job)
        for uid in [uid for uid in self.reported if uid not in running]:
            del self.reported[uid]
        messages = []
        for uid, job in running.items():
            try:
                # lstat: the directory is the job user's; a link there must not make the node read elsewhere.
                marked = os.lstat(os.path.join(self.layout.checkpoint_dir(uid), MARKER_FILE)).st_mtime
            except OSError:
                continue
            if marked > self.reported.get(uid, 0.0):
                self.reported[uid] = marked
                messages.append({"type": "checkpointed", "job": job, "job_uid": uid, "at": marked})
        return messages
