"""Who leads, with PostgreSQL: a standby waits for the lease, a leader renews it and steps down when it is lost.

A standby tries to take the lease every ``renew_s`` and meanwhile names
the leader to clients (the API answers 503 with its URL), and every few
seconds decodes the active jobs that changed, so that taking over
decodes only what changed since (decoding is most of a takeover's cost). Once it holds
the lease it reads the cluster back from the database, starts scheduling
and serving, and renews the lease every ``renew_s``.

A leader that cannot renew within ``lease_timeout_s`` (the database is out
of reach, or this process was paused), that finds another's term in the
lease, or whose write the store fenced, steps down: it writes nothing
more and starts again as a standby (the same command, in the same
process, so systemd and the pid stay). Its writes were refused in the
database already; stepping down stops it from talking to nodes too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from typing import Callable

from gpud.store.lease import Lease
from gpud.store.postgres import problem, shown
from gpud.waits import wait_event

log = logging.getLogger("gpud.controller")
WARM_EVERY_S = 5.0  # how often a standby decodes the jobs that changed, so a takeover finds them decoded


class Leadership:
    """The lease loop of one controller (PostgreSQL only)."""

    def __init__(self, ctrl, start: Callable[[], None],
                 step_down: Callable[[str], None] | None = None) -> None:
        self.ctrl = ctrl
        config = ctrl.config
        self.lease = Lease(config.store, ctrl.holder, config.leader_url, config.lease_timeout_s)
        self.start = start
        self.step_down = step_down or restart_as_standby
        self.fenced = asyncio.Event()
        self.fenced_why = ""
        self.last_renewed = 0.0  # monotonic instant the last renewal (or the take) was sent

    def on_fenced(self, exc: BaseException) -> None:
        """The store refused a write under this controller's term: step down at once."""
        self.fenced_why = str(exc)
        self.fenced.set()

    async def run(self) -> None:
        """Wait for the lease, lead, and renew it until it is lost (then step down) or this task is cancelled."""
        term = await self._wait_for_lease()
        ctrl = self.ctrl
        taken = time.monotonic()
        ctrl.term = ctrl.store.term = term
        ctrl.persist.on_fenced = self.on_fenced
        log.info("this controller leads the cluster now (term %d); reading its state from %s", term,
                 ctrl.store.path)
        renewing = asyncio.create_task(self._renew(term), name="gpud-lease")
        try:
            await ctrl.open()
            ctrl.takeover["open_s"] = time.monotonic() - taken
            ctrl.role, ctrl.leader_url = "leader", ctrl.config.leader_url
            self.start()
            cycles = ctrl.cycles
            while ctrl.cycles == cycles:
                await asyncio.sleep(0.01)
            ctrl.takeover["first_cycle_s"] = time.monotonic() - taken
            log.info("term %d: state read in %.3f s, first scheduling cycle done %.3f s after taking the lease",
                     term, ctrl.takeover["open_s"], ctrl.takeover["first_cycle_s"])
            await renewing
        finally:
            if not renewing.done():
                renewing.cancel()
                await asyncio.gather(renewing, return_exceptions=True)

    async def resign(self) -> None:
        """Hand the lease over now (a clean stop), so a standby takes over without waiting for it to run out."""
        if self.ctrl.term is not None and self.ctrl.role == "leader":
            try:
                await asyncio.wait_for(self.lease.resign(self.ctrl.term), 5.0)
            except Exception as exc:  # noqa: BLE001 - the lease runs out by itself
                log.warning("could not hand the lease over (%s); a standby takes over when it runs out", exc)
        await self.lease.close()

    async def _wait_for_lease(self) -> int:
        ctrl = self.ctrl
        said = None
        warmed = 0.0
        while True:
            if time.monotonic() - warmed >= WARM_EVERY_S:
                warmed = time.monotonic()
                await self._warm_up()
            sent = time.monotonic()
            try:
                term = await asyncio.wait_for(self.lease.take(), ctrl.config.lease_timeout_s)
                if term is not None:
                    self.last_renewed = sent
                    return term
                state = await asyncio.wait_for(self.lease.state(), ctrl.config.lease_timeout_s)
                ctrl.leader_url = state.url if not state.expired else None
                if said != state.url:
                    log.info("standby: the controller at %s leads (term %d)", state.url, state.term)
                    said = state.url
            except (OSError, asyncio.TimeoutError, RuntimeError) as exc:
                ctrl.leader_url = None
                log.warning("standby: cannot reach the database %s: %s", shown(self.lease.url), problem(exc, self.lease.url))
            except Exception as exc:  # noqa: BLE001 - psycopg.Error: the database is restarting, say, try again
                ctrl.leader_url = None
                log.warning("standby: the database %s refused the lease: %s", shown(self.lease.url),
                            problem(exc, self.lease.url))
            await asyncio.sleep(ctrl.config.renew_s)

    async def _warm_up(self) -> None:
        ctrl = self.ctrl
        began = time.monotonic()
        try:
            decoded = await asyncio.get_running_loop().run_in_executor(ctrl.store_executor, ctrl.warm_up)
        except Exception as exc:  # noqa: BLE001 - a cold standby still takes over; it only takes longer
            log.warning("standby: could not read the jobs ahead of a takeover: %s", problem(exc, self.lease.url))
            return
        if decoded:
            log.debug("standby: %d jobs decoded ahead of a takeover in %.3f s (%d kept)", decoded,
                      time.monotonic() - began, len(ctrl.warm))

    async def _renew(self, term: int) -> None:
        config = self.ctrl.config
        while True:
            if await wait_event(self.fenced, config.renew_s):
                return self._lost(f"the store refused a write: {self.fenced_why}")
            now = time.monotonic()
            if now - self.last_renewed > config.lease_timeout_s:  # paused, or renewals failed: it may be taken
                return self._lost(f"the lease was not renewed for {now - self.last_renewed:.1f} s "
                                  f"(more than lease_timeout_s = {config.lease_timeout_s:g})")
            try:
                left = config.lease_timeout_s - (now - self.last_renewed)
                if await asyncio.wait_for(self.lease.renew(term), max(0.05, left)):
                    self.last_renewed = now
                else:
                    return self._lost(f"another controller took the lease (term {term} is over)")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - tried again until the lease would have run out
                log.warning("could not renew the lease in %s: %s", shown(self.lease.url), problem(exc, self.lease.url))

    def _lost(self, why: str) -> None:
        ctrl = self.ctrl
        ctrl.role = "standby"
        log.error("stepping down as leader (term %s): %s; starting again as a standby", ctrl.term, why)
        self.step_down(why)


def restart_as_standby(why: str) -> None:
    """Start this controller again, as the same command in the same process: it comes back as a standby.

    Nothing is flushed or closed first: whatever this process holds in
    memory is no longer the cluster's truth, and the database refuses its
    term anyway.
    """
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
