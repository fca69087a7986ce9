"""A controller running a scheduling cycle in its cycle thread gives the core the loop's turn
(gpud.controller.cycle_turns), and a cycle run on the loop's thread gives none."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from in_process import close, open_controller
from gpud.controller import cycle_turns


async def test_a_cycle_in_its_thread_gives_turns_and_one_on_the_loop_gives_none(tmp_path, monkeypatch):
    turned: list[str] = []  # the thread each turn was given in
    monkeypatch.setattr(cycle_turns.LoopFirst, "give", lambda _: turned.append(threading.current_thread().name))
    monkeypatch.setattr(cycle_turns, "TURN_EVERY", 1)  # a turn at every step: a small cluster has few
    api = await open_controller(tmp_path)
    try:
        api.add_node("n1", gpus=4)
        first = [await api.submit(gpus=1) for _ in range(3)]
        await api.cycle()  # the scheduler is built anew: the cycle runs in its thread
        assert turned, "the cycle in its thread was given no turn"
        assert all(name.startswith("gpud-cycle") for name in turned), turned
        assert sorted(start["job"] for start in api.starts("n1")) == sorted(first)

        turned.clear()
        second = await api.submit(gpus=1)
        api.ctrl.last_cycle_s = 0.0  # a quick cycle last time and one job to take in: this one runs on the loop
        await api.cycle()
        assert [start["job"] for start in api.starts("n1")] == [second]
        assert turned == []
    finally:
        await close(api)


def test_while_the_loop_keeps_up_the_cycle_thread_never_stands_aside():
    # A note is late after a minute here, not after LATE_S: a test process paused by a busy machine for longer
    # than LATE_S would otherwise see the loop (which notes nothing here) as late.
    loop_first = cycle_turns.LoopFirst(late_s=60.0)
    loop_first.began = loop_first.noted = time.monotonic()
    for _ in range(1000):
        loop_first.give()
    assert loop_first.aside == 0.0  # 1,000 calls that found the loop's note fresh: none slept


class _Clock:
    """time.monotonic and time.sleep of a clock that moves only when slept on: a loaded machine pausing the test
    between two readings, which would stretch one sleep past a share, does not move it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_while_the_loop_runs_late_the_cycle_thread_stands_aside_for_its_share_at_most(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(cycle_turns, "time", clock)
    loop_first = cycle_turns.LoopFirst(loop_share=0.75)
    loop_first.began = clock.now - 0.01  # the cycle has run 10 ms
    loop_first.noted = clock.now - 1.0  # and the loop has not noted a turn for a second
    loop_first.give()
    elapsed = clock.now - loop_first.began
    # It slept until it had stood aside for three quarters of the cycle's time (10 ms run, then 30 ms aside),
    # and then went on though the loop had still not noted a turn.
    assert 0.03 <= loop_first.aside <= 0.75 * elapsed + cycle_turns.ASIDE_STEP_S, (loop_first.aside, elapsed)
    assert elapsed - loop_first.aside == pytest.approx(0.01)


async def test_the_cycle_thread_stands_aside_while_the_loop_runs_a_long_turn_and_not_after():
    loop_first = cycle_turns.LoopFirst()
    loop_first.start()
    try:
        finished = threading.Event()

        def cycle() -> float:
            # A cycle's thread giving turns until told to stop: how long it stood aside while the loop was held.
            while not finished.is_set():
                loop_first.give()
            return loop_first.aside

        running = asyncio.get_running_loop().run_in_executor(None, cycle)
        await asyncio.sleep(0.02)
        held_until = time.monotonic() + 0.1
        while time.monotonic() < held_until:  # a long turn of the loop: no note for 100 ms
            pass
        aside = loop_first.aside
        await asyncio.sleep(0.05)
        finished.set()
        total = await running
    finally:
        loop_first.stop()
    assert aside >= 0.02, aside  # it slept, the lock free, while the loop ran late
    assert loop_first._tick is None
    assert total < aside + 0.05, (aside, total)  # once the loop noted again, the cycle ran on
