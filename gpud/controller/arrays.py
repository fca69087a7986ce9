"""An array job as one object: its elements (live or stored), their counts by state, and its overall state."""

from __future__ import annotations

import asyncio
from collections import Counter

from gpud import jsontext
from gpud.controller.cluster import Cluster
from gpud.controller.job_reason import recorded
from gpud.jobs import Job, gpus_of
from gpud.lifecycle import ACTIVE, COMPLETED, PENDING, RUNNING, STATES

# Counts by state are listed in this order: what runs, what waits, then how the others ended.
COUNT_SLICE = 2000
_COUNT_ORDER = (RUNNING, PENDING, *(state for state in STATES if state not in (RUNNING, PENDING)))
# The state an array shows when no element is active: the most telling way one of them ended.
_ENDED_ORDER = ("FAILED", "NODE_FAIL", "TIMEOUT", "CANCELLED", "PREEMPTED", COMPLETED)


async def array_elements(ctrl, array_id: str) -> list[Job]:
    """Every element of array ``array_id`` in index order: live ones as the controller holds them, the rest stored.

    Empty when ``array_id`` names no array (a plain job's id, an element's
    id, or nothing).
    """
    if "_" in array_id or array_id in ctrl.cluster.jobs:
        return []
    live = {job.id: job for job in ctrl.cluster.job_service.select(array_id) if job.array_id == array_id}
    records: list[str] = []
    if ctrl.store_executor is not None:
        loop = asyncio.get_running_loop()
        records = await loop.run_in_executor(ctrl.store_executor, ctrl.store.array_jobs, array_id)
    elements = dict(live)
    for record in records:
        job = Job.from_record(jsontext.loads(record))
        if job.array_id == array_id and job.id not in elements:
            elements[job.id] = job
    return sorted(elements.values(), key=lambda j: (j.array_index if j.array_index is not None else -1, j.id))


def state_counts(elements: list[Job]) -> dict[str, int]:
    """How many elements are in each state: running, pending, then the ended states."""
    counts = Counter(job.state for job in elements)
    return {state: counts[state] for state in _COUNT_ORDER if counts[state]}


def overall_state(counts: dict[str, int]) -> str:
    """RUNNING while any element runs, else PENDING while any waits, else the most telling way one ended."""
    for state in (RUNNING, PENDING, *_ENDED_ORDER):
        if counts.get(state):
            return state
    return PENDING


def summary(array_id: str, elements: list[Job], cluster: Cluster) -> dict:
    """The array's ``array`` object: its id, size, at-once limit, counts by state and overall state."""
    counts = state_counts(elements)
    return {"id": array_id, "elements": len(elements), "limit": elements[0].array_limit if elements else None,
            "states": counts, "state": overall_state(counts),
            "active": sum(n for state, n in counts.items() if state in ACTIVE)}


def first_waiting(elements: list[Job]) -> Job:
    """The element a why-question about the array answers for: the first pending one, else the first."""
    return next((job for job in elements if job.state == PENDING), elements[0])


def element_row(job: Job, reason: str, now: float) -> dict:
    """One element as the array's ``elements`` list shows it."""
    return {"id": job.id, "index": job.array_index, "state": job.state, "reason": reason,
            "started": job.started, "ended": job.ended, "elapsed_s": round(job.elapsed(now), 3), "exit_code": job.exit_code,
            "term_signal": job.term_signal, "restart_count": job.restart_count,
            "nodes": job.nodes() or list(dict.fromkeys(h for h in job.hosts if h))}


def array_view(base: dict, elements: list[Job], cluster: Cluster, now: float) -> dict:
    """The API's view of a whole array: ``base`` (its first element's job view) as the array, with its elements.

    ``id`` is the array's id, ``state`` its overall state, ``reason`` the
    first pending element's; ``array`` holds the counts by state and
    ``elements`` one row per element.
    """
    array = summary(elements[0].array_id or base["id"], elements, cluster)
    waiting = first_waiting(elements)
    started = [job.started for job in elements if job.started]
    ended = [job.ended for job in elements if job.ended]
    reason = cluster.waits.reason(waiting) if waiting.state == PENDING else recorded("")
    return {**base, "id": array["id"], "state": array["state"],
            "reason": reason.text, "reason_code": reason.code, "reason_short": reason.short,
            "array_index": None, "array": array, "placements": [],
            "nodes": list(dict.fromkeys(n for job in elements if job.state == RUNNING for n in job.nodes())),
            "started": min(started) if started else None,
            "ended": max(ended) if ended and not array["active"] else None,
            "exit_code": None, "term_signal": None,
            "restart_count": sum(job.restart_count for job in elements),
            "gpu_hours": round(sum(_gpu_seconds(job, now) for job in elements) / 3600.0, 6),
            "elements": [element_row(job, cluster.waits.reason_of(job), now) for job in elements]}


def _gpu_seconds(job: Job, now: float) -> float:
    return job.gpu_seconds + sum(max(0.0, now - run.since) * gpus_of(run.placement)
                                 for run in job.runs if run.placement is not None and run.since)


async def listed_arrays(ctrl, jobs: list[dict]) -> dict[str, dict]:
    """For each array with an element in a job listing: its size and counts by state (ended elements included)."""
    live: dict[str, Counter] = {}
    for job in jobs:
        if job.get("array_id") is not None:
            live.setdefault(job["array_id"], Counter())
    for array_id, counts in live.items():
        jobs = ctrl.cluster.jobs
        ids = list(ctrl.cluster.job_service.arrays.get(array_id, ()))
        for start in range(0, len(ids), COUNT_SLICE):  # a 100,000-element array is counted a slice at a time
            counts.update([jobs[i].state for i in ids[start:start + COUNT_SLICE] if i in jobs])
            await asyncio.sleep(0)
    stored: dict[str, dict[str, int]] = {}
    if live and ctrl.store_executor is not None:
        loop = asyncio.get_running_loop()
        stored = await loop.run_in_executor(
            ctrl.store_executor, lambda: {a: ctrl.store.array_states(a) for a in live})
    answer = {}
    for array_id, counts in live.items():
        for state, n in stored.get(array_id, {}).items():
            if state not in ACTIVE:
                counts[state] += n
        ordered = {state: counts[state] for state in _COUNT_ORDER if counts[state]}
        answer[array_id] = {"elements": sum(ordered.values()), "states": ordered, "state": overall_state(ordered)}
    return answer
