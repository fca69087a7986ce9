"""Two controllers on one PostgreSQL database and node daemons given both URLs, all real processes on 127.0.0.1.

Used by the failover tests and by bench/failover.py. Every process is
started here and stopped by pid; tasks the nodes left running are killed
through their state directories.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemons import POLICY, START_TIMEOUT_S, Process, free_port, wait_for  # noqa: E402
from node_helpers import kill_everything  # noqa: E402


class HaCluster:
    """Controllers ``c0``, ``c1`` (c0 made the cluster with --init), nodes, and a client given every URL."""

    def __init__(self, root: Path, store: str, *, lease_timeout_s: float = 3.0, renew_s: float = 0.5,
                 node_timeout_s: float = 60.0, heartbeat_s: float = 0.5, controllers: int = 2) -> None:
        self.root = root
        self.store = store
        self.ports = [free_port() for _ in range(controllers)]
        self.urls = [f"http://127.0.0.1:{port}" for port in self.ports]
        (root / "policy.toml").write_text(POLICY)
        self.configs = []
        for i, port in enumerate(self.ports):
            config = root / f"c{i}.toml"
            config.write_text(f'listen = "127.0.0.1:{port}"\nstate_dir = "{root / f"c{i}"}"\n'
                              f'policy = "{root / "policy.toml"}"\nstore = "{store}"\n'
                              f"[scheduler]\ninterval_s = 1\nnode_timeout_s = {node_timeout_s}\n"
                              f"heartbeat_s = {heartbeat_s}\n[leader]\nlease_timeout_s = {lease_timeout_s}\n"
                              f"renew_s = {renew_s}\n[ui]\nenabled = false\n")
            self.configs.append(config)
        self.controllers: list[Process | None] = [None] * controllers
        self.nodes: dict[str, Process] = {}
        self.workdir = root / "work"
        self.workdir.mkdir(exist_ok=True)

    @property
    def url_list(self) -> str:
        """Every controller's URL, comma-separated, as GPUD_URL and a node's controller_url take them."""
        return ",".join(self.urls)

    def start_controller(self, i: int, init: bool = False) -> Process:
        """Start controller ``i`` (``init``: the cluster's first start) and wait until it answers /healthz."""
        args = ["controller", "--config", str(self.configs[i]), "--log-level", "info"]
        process = Process([*args, *(["--init", "--allow-root"] if init else [])], self.root / f"c{i}.log")
        self.controllers[i] = process
        wait_for(lambda: self.health(i) is not None, f"controller c{i} to serve\n{process.output()}", START_TIMEOUT_S)
        return process

    def health(self, i: int) -> dict | None:
        """Controller ``i``'s /healthz, or None when it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.urls[i]}/healthz", timeout=2) as answer:
                return json.loads(answer.read())
        except (OSError, ValueError):
            return None

    def role(self, i: int) -> str | None:
        """"leader", "standby", or None when controller ``i`` does not answer."""
        health = self.health(i)
        return health["role"] if health else None

    def wait_leader(self, i: int, timeout: float = 30.0) -> dict:
        """Wait until controller ``i`` leads; its /healthz."""
        return wait_for(lambda: (h := self.health(i)) is not None and h["role"] == "leader" and h["takeover"]
                        .get("first_cycle_s") is not None and h, f"controller c{i} to lead\n"
                        f"{self._output(i)}", timeout)

    def _output(self, i: int) -> str:
        process = self.controllers[i]
        return process.output() if process is not None else ""

    @property
    def admin_token(self) -> str:
        """The admin token --init wrote to c0's state directory."""
        return (self.root / "c0" / "admin.token").read_text().strip()

    def start_node(self, name: str, gpus: int = 4) -> Process:
        """A node daemon with fake GPUs, given every controller's URL; waits until the leader lists it up."""
        config = self.root / f"{name}.toml"
        config.write_text(f'controller_url = "{self.url_list}"\ncluster_key_file = "{self.root / "c0"}/cluster.key"\n'
                          f'state_dir = "{self.root / name}"\nname = "{name}"\ngpu_backend = "fake"\n'
                          f"fake_gpus = {gpus}\n")
        process = Process(["node", "--config", str(config), "--log-level", "info"], self.root / f"{name}.log")
        self.nodes[name] = process
        wait_for(lambda: self.node_state(name) == "up", f"node {name} to register\n{process.output()}",
                 START_TIMEOUT_S)
        return process

    def client(self, **kwargs: Any):
        """A gpud.client.Client given every controller's URL and the admin token."""
        from gpud.client import Client
        return Client(self.url_list, self.admin_token, **kwargs)

    def node_state(self, name: str) -> str | None:
        """The node's state as the leader lists it, or None when unknown (or nobody leads)."""
        from gpud.client import ClientError
        try:
            nodes = self.client(connect_retry_s=0, retry_s=0).get("nodes")["nodes"]
        except ClientError:
            return None
        return next((node["state"] for node in nodes if node["name"] == name), None)

    def api(self, i: int, method: str, path: str, body: Any = None) -> tuple[int, Any, dict]:
        """One call to controller ``i`` alone (no following): status, JSON answer, headers (status 0: no answer)."""
        request = urllib.request.Request(self.urls[i] + path, method=method,
                                         data=json.dumps(body).encode() if body is not None else None,
                                         headers={"Authorization": f"Bearer {self.admin_token}",
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=15) as answer:
                return answer.status, json.loads(answer.read() or b"null"), dict(answer.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null"), dict(exc.headers)
        except OSError as exc:  # no answer: the connection was refused, cut, or timed out
            return 0, str(exc), {}

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to controller ``i`` (SIGKILL: and reap it)."""
        process = self.controllers[i]
        assert process is not None
        os.kill(process.pid, sig)
        if sig == signal.SIGKILL:
            process.popen.wait(10)

    def close(self) -> None:
        """Stop every daemon (a stopped one is continued first) and kill every task the nodes started."""
        for process in self.nodes.values():
            process.stop(signal.SIGKILL)
        for process in self.controllers:
            if process is not None:
                if process.alive():
                    os.kill(process.pid, signal.SIGCONT)
                process.stop()
        for name in self.nodes:
            kill_everything(str(self.root / name))

