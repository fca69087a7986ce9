"""A controller in this test's process, behind aiohttp's test client: no daemon, no node process.

The controller's wall clock is a :class:`FakeClock` the test moves, and no
scheduling cycle runs on its own: :meth:`InProcessController.cycle` runs one
now. Nodes join as records (their inventory and labels), as a registering
node daemon makes them; the start and stop commands the controller sends them
are kept, in order, for :meth:`InProcessController.commands` to read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from daemons import POLICY
from gpud.controller.app import make_app
from gpud.controller.config import ControllerConfig
from gpud.controller import node_schema
from gpud.controller.keys import CONTROLLER
from gpud.controller.nodes import Gpu, NodeRecord
from gpud.controller.service import Controller

START = 1_800_000_000.0  # 2027-01-15: the fake clock's first reading


class FakeClock:
    """A wall clock that stands still until the test moves it."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move the clock ``seconds`` on; returns the new time."""
        self.now += seconds
        return self.now


class NodeInbox:
    """Stands for a node's connection: keeps what the controller sends the node."""

    def __init__(self) -> None:
        self.received: list[dict] = []

    async def send_str(self, text: str) -> None:
        """Keep one message the controller sends."""
        self.received.append(json.loads(text))

    async def close(self) -> None:
        """Nothing to close: the controller closes a link when it stops."""


@dataclass
class InProcessController:
    """The controller app (``client``), its service object (``ctrl``), its clock and an admin token."""

    client: TestClient
    clock: FakeClock
    root: Path
    tokens: dict[str, str] = field(default_factory=dict)
    inboxes: dict[str, NodeInbox] = field(default_factory=dict)

    @property
    def ctrl(self) -> Controller:
        """The controller's service object: its cluster, store and outbox."""
        return self.client.app[CONTROLLER]

    @property
    def workdir(self) -> Path:
        """The jobs' working directory."""
        return self.root / "work"

    @property
    def state_dir(self) -> Path:
        """The controller's state directory (admin.token, cluster.key, the SQLite store)."""
        return self.root / "state"

    async def api(self, method: str, path: str, body: Any = None, user: str | None = "admin",
                  raw: bytes | None = None) -> tuple[int, Any]:
        """Call the API as ``user`` (a name given a token by :meth:`token_for`, or None for no token);
        returns the status and the decoded JSON answer (the text when it is not JSON)."""
        headers = {"Content-Type": "application/json"}
        if user is not None:
            headers["Authorization"] = f"Bearer {self.tokens.get(user, user)}"
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        answer = await self.client.request(method, path, data=data, headers=headers)
        text = await answer.text()
        try:
            return answer.status, (json.loads(text) if text else None)
        except ValueError:
            return answer.status, text

    async def token_for(self, user: str, admin: bool = False) -> str:
        """Make a token for ``user`` as the admin; later calls name the user instead of the token."""
        status, body = await self.api("POST", "/api/v1/tokens", {"user": user, "admin": admin})
        assert status == 201, body
        self.tokens[user] = body["token"]
        return body["token"]

    async def submit(self, user: str = "admin", **job: Any) -> str:
        """Submit one job (project alpha, the test's work directory, `true` unless given); returns its id."""
        job = {"project": "alpha", "workdir": str(self.workdir), "command": ["true"], **job}
        status, body = await self.api("POST", "/api/v1/jobs", job, user)
        assert status == 201, (status, body)
        return body["ids"][0]

    async def job(self, job_id: str) -> dict:
        """The job as the API shows it."""
        status, body = await self.api("GET", f"/api/v1/jobs/{job_id}")
        assert status == 200, (status, body)
        return body

    async def cycle(self, times: int = 1) -> None:
        """Run ``times`` scheduling cycles now, each with its plan applied and committed."""
        for _ in range(times):
            await self.ctrl.run_cycle()

    def add_node(self, name: str, gpus: int = 4, labels: dict[str, str] | None = None, cpus: float = 8.0,
                 memory_gib: float = 64.0, pool: str = "default") -> None:
        """A node registers with ``gpus`` GPUs and no tasks, heard from now; what is sent to it is kept."""
        record = NodeRecord(name, pool=pool, labels=dict(labels or {}), cpus=cpus, memory_gib=memory_gib,
                            gpus=[Gpu(i, f"GPU-{name}-{i}") for i in range(gpus)])
        self.inboxes[name] = self.ctrl.links[name] = NodeInbox()
        self.ctrl.cluster.node_messages.register(record, tasks=[])

    async def report(self, node: str, start: dict, state: str, exit_code: int | None = None) -> None:
        """``node`` reports the task of ``start`` (a start command it got) ``running``, or ``exited`` with
        ``exit_code``, as its daemon does; the controller's changes are committed."""
        message = {"type": "task", "job": start["job"], "task": start["task"], "attempt": start["attempt"],
                   "job_uid": start["spec"]["job_uid"], "state": state,
                   **({} if exit_code is None else {"exit_code": exit_code})}
        self.ctrl.cluster.node_messages.task_report(node, node_schema.task_report(message))
        await self.ctrl.commit()

    def starts(self, node: str) -> list[dict]:
        """The start commands among those :meth:`commands` returns."""
        return [command for command in self.commands(node) if command["type"] == "start"]

    def commands(self, node: str) -> list[dict]:
        """The commands sent to ``node`` (start, stop, ...) since the last call, oldest first."""
        inbox = self.inboxes[node]
        sent, inbox.received = inbox.received, []
        return sent


async def open_controller(root: Path, policy: str = POLICY, **settings: Any) -> InProcessController:
    """A controller on a fresh state directory under ``root``, served in process; close with :func:`close`."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "work").mkdir(exist_ok=True)
    (root / "policy.toml").write_text(policy)
    config = ControllerConfig(**{"host": "127.0.0.1", "port": 0, "state_dir": str(root / "state"),
                                 "policy": str(root / "policy.toml"), "init": True, "ui": False,
                                 "admin_allow_root": True, **settings})
    clock = FakeClock()
    client = TestClient(TestServer(make_app(config, clock=clock, scheduling=False)))
    await client.start_server()
    admin = (root / "state" / "admin.token").read_text().strip()
    return InProcessController(client, clock, root, {"admin": admin})


async def close(controller: InProcessController) -> None:
    """Stop the server and the controller (its store closed)."""
    await controller.client.close()
