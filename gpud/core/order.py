"""The queue walk as a callback, for actions not yet driving a ``QueueWalk`` themselves."""

from __future__ import annotations

from typing import Callable, Iterable

from gpud.core.backlog import Backlog
from gpud.core.queue_walk import Admit, Entry, QueueWalk, Skip
from gpud.core.queues import QueueState
from gpud.core.state import ClusterState
from gpud.model import JobSpec

__all__ = ["Admit", "Entry", "Skip", "serve_in_order"]


def serve_in_order(state: ClusterState, backlog: Backlog, visit: Callable[[JobSpec], Skip | None],
                   admit: Admit | None = None,
                   queues: Iterable[QueueState] | None = None,
                   drop: Callable[[QueueState], bool] | None = None) -> None:
    """Visit pending jobs as a ``QueueWalk`` takes them; a Skip that ``visit`` returns is passed to
    the walk (``QueueWalk.pass_over``). The other arguments are the walk's."""
    walk = QueueWalk(state, backlog, queues, admit, drop)
    for job in walk:
        skip = visit(job)
        if skip is not None:
            walk.pass_over(skip)
