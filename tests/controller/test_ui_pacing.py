"""How often the dashboard pushes changes: its CPU budget, its floor and its ceiling, over simulated time."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpud.ui.live import OwnTime
from gpud.ui.pacing import MAX_GAP_S, MIN_GAP_S, SHARE, PushBudget
from waiting import loop_turn


def run(budget: PushBudget, seconds: int, rest_per_s: float, cost: float, changes: set[int] | None = None,
        start: int = 0) -> list[int]:
    """Look once a second for ``seconds`` (a change at every look, or at the looks in ``changes``), the
    controller spending ``rest_per_s`` CPU seconds a second on its own and each push ``cost``; returns when
    it pushed. Like the watcher, a change not pushed stays pending until it is."""
    pushes, pending = [], False
    for now in range(start, start + seconds):
        budget.earn(rest_per_s * now + budget.spent)  # the process's CPU: its own work and the pushes'
        pending = pending or changes is None or now in changes
        if pending and budget.may_push(now):
            budget.paid(now, cost)
            pushes.append(now)
            pending = False
    return pushes


def test_under_steady_changes_pushes_take_at_most_their_share_of_the_controllers_cpu():
    budget = PushBudget()
    # a nearly idle controller, pushes of 2 ms: the budget pays for one every 6 s, between the floor and
    # the ceiling, so it sets the pace
    rest = 0.002 / (SHARE * 6)
    pushes = run(budget, 3600, rest_per_s=rest, cost=0.002)
    spent = len(pushes) * 0.002
    assert spent <= SHARE * rest * 3600 + budget.saved * 0.002
    assert spent >= 0.9 * SHARE * rest * 3600   # and it is used: pushes come as often as it allows
    gaps = [b - a for a, b in zip(pushes, pushes[1:])]
    assert MIN_GAP_S <= min(gaps) and max(gaps) <= MAX_GAP_S


def test_a_busy_controller_gets_a_push_at_every_floor_gap():
    pushes = run(PushBudget(), 600, rest_per_s=0.5, cost=0.002)
    assert all(b - a == MIN_GAP_S for a, b in zip(pushes, pushes[1:]))


def test_pushes_too_dear_for_the_budget_still_come_at_the_ceiling():
    pushes = run(PushBudget(), 600, rest_per_s=0.001, cost=0.05)
    assert all(b - a == MAX_GAP_S for a, b in zip(pushes, pushes[1:]))


def test_a_change_after_a_quiet_spell_goes_out_at_the_next_look():
    budget = PushBudget()
    run(budget, 600, rest_per_s=0.009, cost=0.002)             # steady changes: pushes spaced by the budget
    quiet = run(budget, 120, rest_per_s=0.009, cost=0.002, changes=set(), start=600)
    assert quiet == []
    # then a few changes in a row, each as soon as the floor allows: the quiet spell saved them up
    burst = run(budget, 10, rest_per_s=0.009, cost=0.002, changes={720, 722, 724}, start=720)
    assert burst == [720, 722, 724]


def test_a_long_quiet_spell_saves_only_a_few_pushes():
    budget = PushBudget()
    run(budget, 60, rest_per_s=0.009, cost=0.002)
    run(budget, 3600, rest_per_s=0.009, cost=0.002, changes=set(), start=60)
    pushes = run(budget, 120, rest_per_s=0.009, cost=0.002, start=3660)
    earned = SHARE * 0.009 * 120 / 0.002
    assert len(pushes) <= budget.saved + earned + 1


def burn(seconds: float) -> None:
    began = time.thread_time()
    while time.thread_time() - began < seconds:
        pass


async def test_a_push_is_charged_its_own_cpu_not_that_of_tasks_that_run_while_it_waits():
    async def push() -> None:
        burn(0.02)
        await asyncio.sleep(0.2)   # meanwhile another task burns 0.1 s
        burn(0.02)

    async def other() -> None:
        await asyncio.sleep(0.05)
        burn(0.1)

    timed = OwnTime(push())
    await asyncio.gather(timed, other())
    assert 0.04 <= timed.cpu < 0.08


async def test_a_failing_or_cancelled_push_ends_as_a_plain_await_would():
    async def fails() -> None:
        await loop_turn()
        raise LookupError("gone")

    with pytest.raises(LookupError):
        await OwnTime(fails())
    finished = []

    async def slow() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            finished.append(True)

    task = asyncio.ensure_future(OwnTime(slow()))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished == [True]
