"""Job lifecycle events handed to the plugins' ``gpud_job_event`` hook, on a worker thread so the loop never waits."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpud.jobs import Job
from gpud.lifecycle import is_finished
from gpud.store import Event

log = logging.getLogger("gpud.controller")
# The controller's event kinds that are lifecycle events of the hook; a finished state is "finished".
HOOK_EVENTS = {"submitted": "submitted", "started": "started", "preempted": "preempted"}
SUBMITTED = "submitted"


def submitted_message(job: Job) -> str:
    """What the submitted event of ``job`` says."""
    return f"submitted by {job.user} to project {job.project}"


def with_submitted_event(job: Job, events: list[Event]) -> list[Event]:
    """The job's stored events with its submitted event first (made from the record unless stored, as it was once)."""
    if any(event.kind == SUBMITTED for event in events):
        return events
    return [Event(job.submitted, SUBMITTED, submitted_message(job), job.id), *events]


def hook_event(kind: str, job: Job) -> str | None:
    """The hook's name for a controller event about ``job``, or None when the hook is not told of it.

    A job ending in PREEMPTED (not requeued) is "finished"; the eviction
    itself, which happens first, is "preempted".
    """
    if is_finished(job.state) and kind == job.state.lower():
        return "finished"
    return HOOK_EVENTS.get(kind)


def detail_of(job: Job, message: str) -> dict[str, Any]:
    """The ``detail`` of a hook call: who, where, how it ended, and the event's message."""
    return {"message": message, "state": job.state, "user": job.user, "name": job.name,
            "nodes": sorted({h for h in job.hosts if h}), "exit_code": job.exit_code,
            "term_signal": job.term_signal, "reason": job.reason, "restart_count": job.restart_count}


class JobEvents:
    """Calls ``gpud_job_event`` of every plugin that implements it, in event order, on one worker thread."""

    def __init__(self, pm: Any) -> None:
        self.pm = pm
        self._executor: ThreadPoolExecutor | None = None

    def wanted(self) -> bool:
        """True when some registered plugin implements the hook (else events cost nothing)."""
        return bool(self.pm.hook.gpud_job_event.get_hookimpls())

    def emit(self, kind: str, job: Job, message: str) -> None:
        """Queue the hook call for a controller event about ``job``, if the hook wants this kind."""
        if not self.wanted():
            return
        event = hook_event(kind, job)
        if event is None:
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="gpud-job-events")
        self._executor.submit(self._call, self.pm, event, job.spec(), detail_of(job, message))

    @staticmethod
    def _call(pm: Any, event: str, spec: Any, detail: dict) -> None:
        try:
            pm.hook.gpud_job_event(event=event, job=spec, detail=detail)
        except Exception:  # noqa: BLE001 - a failing plugin must not stop the events after it
            log.exception("a gpud_job_event plugin failed on %s of job %s", event, spec.id)

    def close(self) -> None:
        """Wait for the queued calls to finish."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
