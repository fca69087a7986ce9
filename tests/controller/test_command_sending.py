"""A node's commands go out in the order they were made, and a node that reads nothing holds the others' up for no
longer than its lease (its connection is closed: what it was to be told, it is told again when it registers)."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from gpud.controller.app import make_app
from gpud.controller.config import ControllerConfig
from gpud.controller.keys import CONTROLLER
from waiting import until

LEASE_S = 0.5


class Link:
    """A node's connection as the controller sees it: what it was sent, and whether it reads at all."""

    def __init__(self, reads: bool = True) -> None:
        self.reads = reads
        self.texts: list[str] = []
        self.closed = False

    async def send_str(self, text: str) -> None:
        if not self.reads:
            await asyncio.Event().wait()  # a full socket buffer that never drains
        self.texts.append(text)

    async def close(self) -> None:
        self.closed = True


async def test_a_node_that_reads_nothing_holds_the_others_commands_up_for_no_longer_than_its_lease(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('[[projects]]\nname = "default"\ngpu_quota = 1\n')
    app = make_app(ControllerConfig(state_dir=str(tmp_path / "controller"), policy=str(policy), heartbeat_s=0.1,
                                    node_timeout_s=LEASE_S, init=True, ui=False))
    runner = web.AppRunner(app)
    await runner.setup()
    ctrl = app[CONTROLLER]
    try:
        stuck, healthy = Link(reads=False), Link()
        ctrl.links.update({"stuck": stuck, "healthy": healthy})
        for number in range(3):
            ctrl.cluster.outbox.put("stuck", {"type": "ack", "job": str(number), "task": 0, "attempt": 0})
            ctrl.cluster.outbox.put("healthy", {"type": "ack", "job": str(number), "task": 0, "attempt": 0})
        began = time.monotonic()
        await asyncio.wait_for(ctrl.commit(), 10 * LEASE_S)
        assert LEASE_S <= time.monotonic() - began < 5 * LEASE_S
        assert [text.count('"job":"%d"' % n) for n, text in enumerate(healthy.texts)] == [1, 1, 1]
        await until(lambda: stuck.closed, "the stuck link to be closed")
        assert not healthy.closed
        ctrl.cluster.outbox.put("healthy", {"type": "ack", "job": "3", "task": 0, "attempt": 0})
        await asyncio.wait_for(ctrl.commit(), LEASE_S)  # the next commit is not held up
        assert '"job":"3"' in healthy.texts[-1]
    finally:
        await runner.cleanup()
