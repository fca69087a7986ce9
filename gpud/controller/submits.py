"""Submitting jobs: every check a submit must pass, then all its jobs made durable and accepted, or none.

The checks, in order: who the jobs would run as (gpud.controller.identity),
each job request (gpud.submission: read_job, admit), the user's submit rate, the
policy's pending-job limits, and that every dependency names a known job.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any, Awaitable, Callable

from gpud.controller import identity
from gpud.controller.auth import Principal
from gpud.controller.idempotency import Claim
from gpud.controller.job_service import JobService
from gpud.controller.limits import pending_refusal
from gpud.controller.persist import Persister
from gpud.controller.rate import SubmitRate
from gpud.controller.slices import Slices
from gpud.jobs import Job
from gpud.policy import Policy
from gpud.submission import Capacity, Submission, SubmitError, admit, read_job

# Past this many jobs, a submit's jobs are kept out of the collector's full passes (see commit_new).
FREEZE_AFTER = 1000
ACCEPT_PART = 100  # submitted jobs joining the cluster between two turns of the loop (see commit_new)


class SubmitRefused(Exception):
    """A submit refused whole: ``status`` is the HTTP status; ``field``, ``index`` (of the job in a batch) and
    ``retry_after_s`` (when trying again later may succeed) say more where known."""

    def __init__(self, status: int, message: str, *, field: str | None = None, index: int | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.index = index
        self.retry_after_s = retry_after_s


class Submits:
    """Checks, stages and commits submitted jobs; see the module docstring."""

    def __init__(self, job_service: JobService, largest_node: Callable[[], Capacity], policy: Callable[[], Policy],
                 rate: SubmitRate, persist: Persister,
                 finished_states: Callable[[list[str]], Awaitable[dict[str, str]]], *, local_node: bool) -> None:
        self.job_service = job_service
        self.largest_node = largest_node
        self.policy = policy
        self.rate = rate
        self.persist = persist
        self.finished_states = finished_states  # how the store says the jobs it knows ended, by id
        self.local_node = local_node

    async def submit(self, principal: Principal, payloads: list[Any], claim: Claim | None = None,
                     single: bool = False) -> dict[str, Any]:
        """Check every job, then accept them all (durably) or none; returns the answer naming their ids.

        Raises SubmitRefused when any check fails (nothing is then staged).
        ``single``: one job was sent on its own, and the answer says its
        array's id and the notes about it.
        """
        submissions = await self._checked(principal, payloads)
        finished = await self._dependencies_ended(submissions)
        jobs = await self._staged(submissions, finished)
        ids = [job.id for job in jobs]
        answer: dict[str, Any] = {"ids": ids}
        if single and ids and "_" in ids[0]:
            answer["array_id"] = ids[0].partition("_")[0]
        notes = [note for s in submissions for note in s.notes]
        if notes and single:
            answer["notes"] = notes
        if claim is not None:
            claim.record(self.persist, 201, answer)
        await self.commit_new(jobs)
        return answer

    async def _checked(self, principal: Principal, payloads: list[Any]) -> list[Submission]:
        """The jobs as checked submissions, once the caller, each job, the rate and the pending limits allow them."""
        refused = identity.refusal(principal, local_node=self.local_node)
        if refused:
            raise SubmitRefused(403, refused)
        policy = self.policy()
        cap = self.largest_node()
        submissions = []
        slices = Slices()
        for index, payload in enumerate(payloads):
            await slices.pause()  # a batch of 2,000 jobs is checked with the loop turning between slices
            try:
                submissions.append(admit(read_job(payload), user=principal.user, admin=principal.admin,
                                         policy=policy, capacity=cap))
                submissions[-1].job.allow_root = principal.allow_root
            except SubmitError as exc:
                raise SubmitRefused(exc.status, str(exc), field=exc.field,
                                    index=index if len(payloads) > 1 else None) from None
        wait = self.rate.take(principal.user, sum(len(s.array_indices or (0,)) for s in submissions))
        if wait:
            limit = f"{self.rate.rate:g} jobs a second, {self.rate.burst:g} at once"
            later = wait < float("inf")
            raise SubmitRefused(429, f"too many jobs: {principal.user} may submit {limit}" +
                                (f"; try again in {wait:.1f} s" if later else ""),
                                retry_after_s=wait if later else None)
        over = pending_refusal(policy, self.job_service.jobs.values(), submissions, principal.user)
        if over:
            raise SubmitRefused(429, f"too many pending jobs: {over}")
        return submissions

    async def _dependencies_ended(self, submissions: list[Submission]) -> dict[str, str]:
        """How the dependencies that are no active job ended, by id, from the store; refused when one is unknown."""
        targets = sorted({d.job for s in submissions for d in s.job.depends})
        unknown = self.job_service.unknown_dependencies(targets)
        if not unknown:
            return {}
        finished = await self.finished_states(unknown)
        missing = [t for t in unknown if t not in finished]
        if missing:
            raise SubmitRefused(422, f"depends on unknown job {missing[0]}", field="depends")
        return finished

    async def _staged(self, submissions: list[Submission], finished: dict[str, str]) -> list[Job]:
        """The submissions staged as jobs (ids given, arrays expanded), a part at a time with the loop free
        between parts; none stays staged if this is interrupted."""
        jobs: list[Job] = []
        slices = Slices()
        try:
            for part in self.job_service.stage_in_parts(submissions, finished):
                jobs.extend(part)
                if len(jobs) >= FREEZE_AFTER:
                    gc.freeze()  # see commit_new; without it each part's collection walks every part before it
                # A batch of 2,000 jobs, or a 100,000-element array, is made a part at a time: the loop turns
                # whenever this turn's share of long work is spent.
                await slices.pause()
        except BaseException:
            self.job_service.drop(jobs)
            raise
        return jobs

    async def commit_new(self, jobs: list[Job]) -> None:
        """Write staged jobs; they join the cluster once durable, and are forgotten if the write fails.

        The outcome is settled when the write ends, even if the request that
        waits for it is gone, so a job is never durable yet unknown, nor known
        yet lost.
        """
        # The outcome of exactly the batch that carries these jobs (and the idempotent answer marked with them),
        # taken now: awaiting a later flush could report another batch's success or failure.
        flush = self.persist.new_jobs(jobs)

        async def settle() -> None:
            try:
                await flush
            except BaseException:
                self.job_service.drop(jobs)
                raise
            # A few hundred at a time, the loop turning between: the request is answered once all are in.
            slices = Slices()
            for start in range(0, len(jobs), ACCEPT_PART):
                self.job_service.accept(jobs[start:start + ACCEPT_PART])
                await slices.pause()
            if len(jobs) >= FREEZE_AFTER:
                # Long-lived from now on: keep them out of the collector's full passes, which would
                # otherwise walk every job and stall the event loop for as long.
                gc.freeze()

        # Its own task: the jobs are settled even when the request that waits for them is gone.
        settling = asyncio.ensure_future(settle())
        _SETTLING.add(settling)
        settling.add_done_callback(_settled)
        await asyncio.shield(settling)


_SETTLING: set[asyncio.Future] = set()  # submits being settled (a task the loop holds only weakly)


def _settled(task: asyncio.Future) -> None:
    _SETTLING.discard(task)
    if not task.cancelled():
        task.exception()  # a failed write is the request's answer (503); nobody else is to hear of it
