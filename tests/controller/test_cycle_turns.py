"""A controller running a scheduling cycle in its cycle thread gives the core the loop's turn
(gpud.controller.cycle_turns), and a cycle run on the loop's thread gives none."""

from __future__ import annotations

import threading

from in_process import close, open_controller
from gpud.controller import cycle_turns


async def test_a_cycle_in_its_thread_gives_turns_and_one_on_the_loop_gives_none(tmp_path, monkeypatch):
    turned: list[str] = []  # the thread each turn was given in
    monkeypatch.setattr(cycle_turns, "give_turn", lambda: turned.append(threading.current_thread().name))
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
