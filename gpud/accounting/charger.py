"""The controller's charging loop: every charging interval, what running tasks used goes into the store.

Every placed task is charged up to the instant of the last charge, which is
stored with the amounts, so a restarted controller charges from there: a
crash loses at most the interval being charged. A task that stops between
charges has its last stretch kept in memory until the next charge.

What the running tasks owe is added up a slice of jobs at a time, the
event loop free between slices (16,000 running jobs took 56-61 ms in one
go). A task that stops while a charge is under way is charged from the
charge's instant if the charge already counted it, from the last charge's
instant if not, so each stretch is charged once. The stretches of the
tasks that stopped since the last charge are added a part at a time too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from types import MappingProxyType
from typing import Callable, Mapping

from gpud.accounting.decay import Amount, UsageKey, charged, decayed, gpu_seconds
from gpud.accounting.meter import Owed, owed, run_charges
from gpud.controller.slices import SLICE_S, Slices
from gpud.jobs import Job, TaskRun
from gpud.policy import Policy
from gpud.store.usage import UsageStore

log = logging.getLogger("gpud.controller")
TAILS_PER_SLICE = 2048  # stopped tasks' charges added between two checks of the slice's time


class Charger:
    """Decayed usage kept in memory and in the store; ``charge`` is called every charging interval."""

    def __init__(self, store: UsageStore, executor: Executor, policy: Callable[[], Policy],
                 running: Callable[[], list[Job]], pool_of: Callable[[str], str],
                 clock: Callable[[], float] = time.time, slice_s: float = SLICE_S,
                 tails_per_slice: int = TAILS_PER_SLICE) -> None:
        self.store = store
        self.executor = executor
        self.policy = policy
        self.running = running
        self.pool_of = pool_of
        self.clock = clock
        self.tails_per_slice = tails_per_slice
        self.rows: dict[UsageKey, Amount] = {}
        self.as_of = clock()
        self.tails: list[tuple[UsageKey, Amount]] = []
        self._gpu: Mapping[UsageKey, float] = MappingProxyType({})
        self.charges = 0
        self.last_charge_s = 0.0
        self.slice_s = slice_s
        # While a charge adds up the running tasks: its instant, the runs (by id) it has counted up to there, and
        # what those of them that stopped meanwhile owe up to there (charged only if that charge does not end).
        self._counting: tuple[float, set[int], list[tuple[UsageKey, Amount]]] | None = None

    def load(self) -> None:
        """Read the stored usage back (blocking: call from the store's thread or before serving)."""
        rows, as_of = self.store.load()
        if as_of is not None:
            self.rows, self.as_of = rows, as_of
        else:  # the first start: charges start now, and a crash before the first charge keeps that instant
            self.as_of = self.clock()
            self.store.save({}, self.as_of)
        self._gpu = MappingProxyType(gpu_seconds(self.rows))

    def department_of(self, project: str) -> str:
        """The department of ``project`` under the policy in force ("default" for one it no longer has)."""
        found = self.policy().projects.get(project)
        return found.department if found is not None else "default"

    def run_ended(self, job: Job, run: TaskRun, end: float) -> None:
        """A task stops holding its placement at ``end``: keep what it used since the last charge.

        A node may tell of an exit late, after a charge counted the task as
        running past ``end``: what was charged after ``end`` is given back.
        """
        if run.placement is None:
            return
        pool, department = self.pool_of(run.placement.node), self.department_of(job.project)
        start = self.as_of
        if self._counting is not None and id(run) in self._counting[1]:
            start, _, counted = self._counting  # the charge under way counted it up to its instant
            counted += run_charges(job, run, self.as_of, start, pool, department)
        if end >= start:
            self.tails += run_charges(job, run, start, end, pool, department)
        else:
            self.tails += [(key, (-gpu, -cpu, -memory))
                           for key, (gpu, cpu, memory) in run_charges(job, run, end, start, pool, department)]

    def pending(self, now: float) -> list[tuple[UsageKey, Amount]]:
        """What is owed since the last charge: stopped tasks' last stretches and running tasks up to ``now``."""
        counted = self._counting[2] if self._counting is not None else []
        return self.tails + counted + owed(self.running(), self.as_of, now, self.pool_of, self.department_of)

    async def charge(self) -> None:
        """Decay the amounts to now, add what is owed, and store both in one transaction.

        The running tasks are counted a slice at a time (see the module
        docstring); then memory moves on at once, so a task stopping while the
        write is under way is charged from the new instant; a failed write
        leaves memory right and the next charge writes it all.
        """
        began = time.perf_counter()
        now = max(self.clock(), self.as_of)
        counted = Owed(self.as_of, now, self.pool_of)
        runs: set[int] = set()
        stopped: list[tuple[UsageKey, Amount]] = []
        self._counting = (now, runs, stopped)
        try:
            slices = Slices(self.slice_s)
            for job in self.running():
                counted.add(job)
                runs.update(map(id, job.runs))
                await slices.pause()
            policy = self.policy()
            rows = dict(decayed(self.rows, self.as_of, now, policy.usage_half_life_s, policy.usage_reset))
            # The stopped tasks' stretches, added in the order they came, as they were in one go before, a part
            # at a time: after a drain of 16,000 tasks they are 48,000 charges (70 ms at once). A task stopping
            # meanwhile is charged as one stopping while the running ones were counted.
            added = 0
            while added < len(self.tails):
                rows = charged(rows, self.tails[added:added + self.tails_per_slice])
                added = min(added + self.tails_per_slice, len(self.tails))
                await slices.pause()
        except BaseException:
            self.tails += stopped  # this charge ends here: what it counted of the runs that stopped is still owed
            raise
        finally:
            self._counting = None
        rows = charged(rows, self.tails[added:] + counted.charges(self.department_of))
        self.rows, self.as_of, self.tails = rows, now, []
        self._gpu = MappingProxyType(gpu_seconds(rows))
        await asyncio.get_running_loop().run_in_executor(self.executor, self.store.save, rows, now)
        self.charges += 1
        self.last_charge_s = time.perf_counter() - began

    async def loop(self) -> None:
        """Charge every ``usage_charge_interval`` until cancelled; a failed write is retried at the next one."""
        while True:
            await asyncio.sleep(self.policy().usage_charge_interval_s)
            try:
                await self.charge()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the amounts stay owed and go in the next charge
                log.error("charging usage failed (retried at the next charge): %s", exc)

    def decayed_usage(self) -> Mapping[UsageKey, float]:
        """Decayed GPU-seconds keyed by (level, pool, name), as of the last charge.

        ``level`` is "department", "project" or "user"; a user's name is
        "<project>/<user>". The mapping is built once per charge, so reading
        it each scheduling cycle costs nothing.
        """
        return self._gpu

    def amounts(self, now: float | None = None) -> dict[UsageKey, Amount]:
        """Every key's decayed (GPU-s, CPU-s, memory GiB-s) as of ``now`` (default: now), owed amounts
        included."""
        now = max(self.clock() if now is None else now, self.as_of)
        policy = self.policy()
        return charged(decayed(self.rows, self.as_of, now, policy.usage_half_life_s, policy.usage_reset),
                       self.pending(now))

