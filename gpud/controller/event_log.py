"""The cluster's events: stored for ``gpuctl show``, logged, and told to the plugins' job-event hook."""

from __future__ import annotations

import logging
from typing import Callable

from gpud.controller.job_events import JobEvents
from gpud.controller.persist import Persister
from gpud.jobs import Job
from gpud.store import Event

log = logging.getLogger("gpud.controller")


class EventLog:
    """Records what happened to a job or a node, where each reader of events looks for it."""

    def __init__(self, persist: Persister, clock: Callable[[], float], job_events: JobEvents,
                 jobs: dict[str, Job]) -> None:
        self.persist = persist
        self.clock = clock
        self.job_events = job_events
        self.jobs = jobs  # the active jobs: only their events reach the hook

    def record(self, kind: str, message: str, *, job: str | None = None, node: str | None = None,
               store: bool = True) -> None:
        """Store (unless ``store`` is False) and log an event; an active job's event also goes to the hook."""
        if store:
            self.persist.event(Event(self.clock(), kind, message, job, node))
        log.info("event=%s job=%s node=%s %s", kind.replace(" ", "_"), job or "-", node or "-", message)
        if job is not None and job in self.jobs:
            self.job_events.emit(kind, self.jobs[job], message)

    def hook_only(self, kind: str, job: Job, message: str) -> None:
        """Tell the hook of an event about ``job`` that is neither stored nor logged (one of many alike)."""
        self.job_events.emit(kind, job, message)
