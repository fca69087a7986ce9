"""An in-process controller and its dashboard for tests, and a browser session signed in to it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestClient, TestServer

from daemons import POLICY
from gpud.controller.node_link import connect_in_process
from gpud.gpu.fake import FakeBackend
from gpud.node.agent import NodeAgent
from gpud.node.config import NodeConfig
from node_helpers import kill_everything
from waiting import until
from gpud.controller.app import make_app
from gpud.controller.config import ControllerConfig
from gpud.controller.keys import CONTROLLER
from gpud.ui.app import make_ui_app



CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(page: str) -> str:
    """The CSRF token of the first form on a page."""
    found = CSRF.search(page)
    assert found, page[:2000]
    return found.group(1)


@dataclass
class Dashboard:
    """A controller (API client ``api``) and its dashboard (``ui``), with tokens for admin, alice and bob."""

    api: TestClient
    ui: TestClient
    root: Path
    tokens: dict[str, str]
    sessions: list = field(default_factory=list)
    agents: list = field(default_factory=list)

    async def add_node(self, name: str, gpus: int) -> None:
        """A node daemon with fake GPUs, joined to the controller in this process; waits until it is up."""
        ctrl = self.api.app[CONTROLLER]
        node_dir = self.root / name
        agent = NodeAgent(NodeConfig(state_dir=str(node_dir), run_dir=str(node_dir / "run"), name=name,
                                     gpu_backend="fake", fake_gpus=gpus, cpus=8, memory_gib=32),
                          FakeBackend(name, gpus, str(node_dir)), connect=connect_in_process(ctrl))
        self.agents.append((agent, node_dir))
        await agent.start()
        await until(lambda: name in ctrl.cluster.nodes and ctrl.cluster.nodes[name].state == "up",
                    f"node {name} to be up")

    async def call(self, method: str, path: str, user: str = "admin", body: Any = None) -> tuple[int, Any]:
        """Call the controller's API as ``user``."""
        answer = await self.api.request(method, path, json=body,
                                        headers={"Authorization": f"Bearer {self.tokens[user]}"})
        return answer.status, await answer.json()

    async def submit(self, user: str = "alice", **job: Any) -> str:
        """Submit a job as ``user`` (project alpha, the test's workdir); returns its id."""
        job = {"project": "alpha", "workdir": str(self.root), "command": ["sleep", "600"], **job}
        status, body = await self.call("POST", "/api/v1/jobs", user, job)
        assert status == 201, body
        return body["ids"][0]

    async def browser(self, user: str | None = None) -> aiohttp.ClientSession:
        """A fresh cookie jar on the dashboard, signed in as ``user`` unless None; close it after use."""
        session = aiohttp.ClientSession(base_url=str(self.ui.make_url("/")), cookie_jar=aiohttp.CookieJar(unsafe=True))
        self.sessions.append(session)
        if user is not None:
            answer = await sign_in(session, self.tokens[user])
            assert answer.status == 303, await answer.text()
        return session


async def sign_in(client: Any, token: str) -> Any:
    """Load the sign-in form and post the token; returns the answer (not followed)."""
    page = await (await client.get("/ui/login")).text()
    return await client.post("/ui/login", data={"token": token, "csrf": csrf_of(page), "next": "/ui/queue"},
                             allow_redirects=False)


def config_for(root: Path, **settings: Any) -> ControllerConfig:
    """A controller's settings on a fresh state directory under ``root`` (the tests' policy), API on any port."""
    (root / "policy.toml").write_text(POLICY)
    return ControllerConfig(**{"host": "127.0.0.1", "port": 0, "state_dir": str(root / "state"),
                               "policy": str(root / "policy.toml"), "init": True, "ui": False, "interval_s": 0.2,
                               "admin_allow_root": True,
                               **settings})


async def open_dashboard(root: Path, **settings: Any) -> Dashboard:
    """A controller on a fresh state directory, with the dashboard served in process, and three tokens."""
    config = config_for(root, **settings)
    app = make_app(config)
    api = TestClient(TestServer(app))
    await api.start_server()
    ctrl = app[CONTROLLER]
    admin = (root / "state" / "admin.token").read_text().strip()
    ui = TestClient(TestServer(make_ui_app(ctrl)))
    await ui.start_server()
    board = Dashboard(api, ui, root, {"admin": admin})
    for user in ("alice", "bob"):
        status, body = await board.call("POST", "/api/v1/tokens", "admin", {"user": user})
        assert status == 201, body
        board.tokens[user] = body["token"]
    return board


async def close_dashboard(board: Dashboard) -> None:
    """Stop the dashboard, then the controller."""
    for session in board.sessions:
        await session.close()
    for agent, node_dir in board.agents:
        await agent.stop()
        kill_everything(str(node_dir))
    await board.ui.close()
    await board.api.close()
