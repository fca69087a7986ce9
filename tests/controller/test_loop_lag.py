"""/healthz and /metrics say how late the controller's event loop ran lately: a loop held up shows it, and the
figure forgets what is older than its window."""

from __future__ import annotations

import asyncio
import time

from in_process import close, open_controller
from gpud.controller.loop_lag import LoopLag

HELD_S = 0.4


def test_the_worst_lateness_of_the_window_is_kept_and_then_forgotten():
    lag = LoopLag(tick_s=0.1, window_s=10.0)
    assert lag.worst_s(0.0) == 0.0
    lag.note(1.0, 0.5)
    lag.note(2.0, 0.1)
    lag.note(3.0, 0.2)
    assert lag.worst_s(5.0) == 0.5
    assert lag.worst_s(11.5) == 0.2  # the 0.5 s of 1.0 has left the window; 0.2 came after 0.1 and is worse
    assert lag.worst_s(13.5) == 0.0


async def test_healthz_shows_a_loop_that_was_held_up(tmp_path):
    api = await open_controller(tmp_path)
    try:
        time.sleep(HELD_S)  # the loop's thread held: no tick, no request, no heartbeat runs meanwhile

        deadline = asyncio.get_running_loop().time() + 30.0
        while True:  # the tick due while the loop was held notes it once it runs
            status, body = await api.api("GET", "/healthz", user=None)
            assert status == 200 and body["ok"] is True
            if body["loop_lag_ms"] >= HELD_S * 1000 * 0.75:
                break
            assert asyncio.get_running_loop().time() < deadline, f"the held loop never showed: {body}"
            await asyncio.sleep(0.05)
        status, text = await api.api("GET", "/metrics", user=None)
        lag = next(float(line.split()[1]) for line in text.splitlines() if line.startswith("gpud_loop_lag_seconds "))
        assert lag >= HELD_S * 0.75
    finally:
        await close(api)
