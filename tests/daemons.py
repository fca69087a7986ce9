"""A real gpud cluster for tests: a controller process and node daemon processes on 127.0.0.1.

Every process is started by this module and stopped by pid (SIGTERM, then
SIGKILL); tasks the nodes left running are killed through their state
directories.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

from node_helpers import kill_everything
from waiting import poll

TIMEOUT_S = 30.0
# A daemon's start imports most of gpud: on a host busy with other test workers that alone can take many seconds.
START_TIMEOUT_S = 90.0

POLICY = """\
grace_period = 2
min_runtime = 0

[[departments]]
name = "research"
gpu_quota = 4

[[projects]]
name = "alpha"
department = "research"
gpu_quota = 2

[[projects]]
name = "beta"
department = "research"
gpu_quota = 2

[[projects]]
name = "private"
gpu_quota = 0
users = ["carol"]
"""


# A port that bind(0) hands out is in the kernel's range for outgoing connections: any process's connection, or
# another worker's test, may take it before the daemon it was meant for binds it. The ports handed out here
# come from below that range, from a block of each pytest-xdist worker's own. `gpud up` puts its dashboard on
# the API's port + 2, so the two after each port are free too. The blocks start at 20000: browsers refuse some
# ports below it (Chromium: 10080), and the dashboard's browser tests would see no page.
PORT_SPAN = 3
PORT_BLOCK = 1500
PORTS_FROM = 20000
_next_ports: Iterator[int] | None = None


def _ports() -> Iterator[int]:
    """This worker's ports, PORT_SPAN apart, round and round; empty where its block would reach the kernel's range."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            kernels = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return iter(())
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    start = PORTS_FROM + (int(worker) if worker.isdigit() else 0) * PORT_BLOCK
    if start + PORT_BLOCK > kernels:
        return iter(())
    return itertools.cycle(range(start, start + PORT_BLOCK - PORT_SPAN + 1, PORT_SPAN))


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now, nor on the two after it, that no other test worker
    and no outgoing connection is handed meanwhile (where the host's port ranges allow; else any free port)."""
    global _next_ports
    if _next_ports is None:
        _next_ports = _ports()
    for _, port in zip(range(PORT_BLOCK), _next_ports):
        if all(_free(port + k) for k in range(PORT_SPAN)):
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check: Callable[[], Any], what: str, timeout: float = TIMEOUT_S, interval: float = 0.05) -> Any:
    """Poll ``check`` until it returns something true; fail with ``what`` after ``timeout`` seconds."""
    last = poll(check, timeout, interval)
    if not last:
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")
    return last


class Process:
    """A daemon run as ``python -m gpud.cli.gpud_main ARGS``, its output in a log file."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        self._out = open(log, "ab")
        self.popen = subprocess.Popen([sys.executable, "-m", "gpud.cli.gpud_main", *argv],
                                      stdout=self._out, stderr=subprocess.STDOUT)
        self.pid = self.popen.pid

    def alive(self) -> bool:
        """True while the process runs."""
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Signal the process and wait for it; SIGKILL when it does not exit in time."""
        if self.popen.poll() is None:
            os.kill(self.pid, sig)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(10)
        self._out.close()

    def output(self) -> str:
        """The end of the process's log."""
        return self.log.read_text(errors="replace")[-4000:]


class LiveCluster:
    """A controller plus node daemons with fake GPUs, all separate processes, and an API client."""

    def __init__(self, root: Path, policy: str = POLICY, node_timeout_s: float = 60.0,
                 heartbeat_s: float = 0.5, tls_dir: Path | None = None) -> None:
        """``tls_dir``: serve TLS with controller.pem and controller.key from there, and have the nodes and
        this client check it against ca.pem there (the files `gpud cert` writes)."""
        self.root = root
        self.port = free_port()
        self.tls_dir = tls_dir
        self.url = f"{'https' if tls_dir else 'http'}://127.0.0.1:{self.port}"
        self.ssl_context = ssl.create_default_context(cafile=str(tls_dir / "ca.pem")) if tls_dir else None
        self.state_dir = root / "controller"
        self.policy_file = root / "policy.toml"
        self.policy_file.write_text(policy)
        self.config = root / "controller.toml"
        self.config.write_text(f'listen = "127.0.0.1:{self.port}"\nstate_dir = "{self.state_dir}"\n'
                               f'policy = "{self.policy_file}"\n[scheduler]\ninterval_s = 1\n'
                               f"node_timeout_s = {node_timeout_s}\nheartbeat_s = {heartbeat_s}\n")
        if tls_dir is not None:
            with self.config.open("a") as f:
                f.write(f'[tls]\ncert = "{tls_dir}/controller.pem"\nkey = "{tls_dir}/controller.key"\n')
        self.controller: Process | None = None
        self.nodes: dict[str, Process] = {}
        self.emulator: subprocess.Popen | None = None
        self.workdir = root / "work"
        self.workdir.mkdir()

    # ------------------------------------------------------------ processes

    def start_controller(self) -> None:
        """Start the controller and wait until it answers /healthz.

        The first start makes the cluster (--init); its admin token may run
        jobs as root, since the tests may run as root.
        """
        first = ["--init", "--allow-root"] if not (self.state_dir / "gpud.sqlite").exists() else []
        self.controller = Process(["controller", "--config", str(self.config), "--log-level", "info", *first],
                                  self.root / "controller.log")
        wait_for(self._healthy, f"the controller to serve\n{self.controller.output()}", START_TIMEOUT_S)

    def _healthy(self) -> bool:
        if self.controller is not None and not self.controller.alive():
            raise AssertionError(f"the controller exited:\n{self.controller.output()}")
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2, context=self.ssl_context) as answer:
                return answer.status == 200
        except OSError:
            return False

    @property
    def admin_token(self) -> str:
        """The admin token the controller wrote on its first start."""
        return (self.state_dir / "admin.token").read_text().strip()

    def start_node(self, name: str, gpus: int = 4, pool: str = "default", labels: dict | None = None,
                   wait: bool = True, cpus: float | None = None, memory_gib: float | None = None) -> Process:
        """Start a node daemon with ``gpus`` fake GPUs (and ``cpus``, ``memory_gib`` when given);
        wait until the controller lists it up."""
        config = self.root / f"{name}.toml"
        label_lines = "".join(f'{k} = "{v}"\n' for k, v in (labels or {}).items())
        sizes = "".join(f"{key} = {value}\n" for key, value in (("cpus", cpus), ("memory_gib", memory_gib))
                        if value is not None)
        ca = f'ca_file = "{self.tls_dir}/ca.pem"\n' if self.tls_dir else ""
        config.write_text(f'controller_url = "{self.url}"\n{ca}cluster_key_file = "{self.state_dir}/cluster.key"\n'
                          f'state_dir = "{self.root / name}"\nname = "{name}"\npool = "{pool}"\n'
                          f'gpu_backend = "fake"\nfake_gpus = {gpus}\n{sizes}[labels]\n{label_lines}')
        process = Process(["node", "--config", str(config), "--log-level", "info"], self.root / f"{name}.log")
        self.nodes[name] = process
        if wait:
            wait_for(lambda: self.node_state(name) == "up", f"node {name} to register\n{process.output()}",
                     START_TIMEOUT_S)
        return process

    def start_emulator(self, nodes: int, gpus: int, ramp_s: float, *options: str) -> subprocess.Popen:
        """Start ``nodes`` emulated nodes of ``gpus`` GPUs each in a process of their own (gpud.testing.fleet,
        the real node protocol), connecting over ``ramp_s`` seconds; its output goes to fleet.log."""
        with open(self.root / "fleet.log", "wb") as log:
            self.emulator = subprocess.Popen([sys.executable, "-m", "gpud.testing.fleet", "--controller", self.url,
                                              "--key-file", str(self.state_dir / "cluster.key"), "--nodes", str(nodes),
                                              "--gpus-per-node", str(gpus), "--ramp-s", str(ramp_s), *options],
                                             stdout=log, stderr=subprocess.STDOUT)
        return self.emulator

    def emulator_output(self) -> str:
        """The end of the emulator's output."""
        return (self.root / "fleet.log").read_text(errors="replace")[-3000:]

    def nodes_up(self) -> int:
        """How many nodes the controller lists up."""
        _, body = self.api("GET", "/api/v1/nodes")
        return sum(1 for node in body.get("nodes", []) if node["state"] == "up")

    def node_state(self, name: str) -> str | None:
        """The node's state as the controller lists it, or None when unknown."""
        status, body = self.api("GET", "/api/v1/nodes")
        for node in body.get("nodes", []):
            if node["name"] == name:
                return node["state"]
        return None

    def close(self) -> None:
        """Stop every daemon and kill every task the nodes started."""
        if self.emulator is not None and self.emulator.poll() is None:
            self.emulator.send_signal(signal.SIGTERM)
            self.emulator.wait(30)
        for process in self.nodes.values():
            process.stop(signal.SIGKILL)
        if self.controller is not None:
            self.controller.stop()
        for name in self.nodes:
            kill_everything(str(self.root / name))

    # ------------------------------------------------------------------ API

    def api(self, method: str, path: str, body: Any = None, token: str | None = "admin",
            raw: bytes | None = None) -> tuple[int, Any]:
        """Call the API; returns the status and the decoded JSON answer."""
        headers = {"Content-Type": "application/json"}
        if token == "admin":
            token = self.admin_token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=15, context=self.ssl_context) as answer:
                payload = answer.read()
                status = answer.status
        except urllib.error.HTTPError as exc:
            payload, status = exc.read(), exc.code
        try:
            return status, json.loads(payload) if payload else None
        except ValueError:
            return status, payload.decode(errors="replace")

    def api_with_headers(self, method: str, path: str, body: Any, headers: dict[str, str],
                         token: str | None = "admin") -> tuple[int, Any, dict[str, str]]:
        """Call the API with extra request headers; returns the status, the decoded JSON answer and its headers."""
        sent = {"Content-Type": "application/json", **headers}
        if token == "admin":
            token = self.admin_token
        if token:
            sent["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method=method,
                                         headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=15, context=self.ssl_context) as answer:
                payload, status, got = answer.read(), answer.status, dict(answer.headers)
        except urllib.error.HTTPError as exc:
            payload, status, got = exc.read(), exc.code, dict(exc.headers)
        return status, json.loads(payload) if payload else None, got

    def submit(self, token: str | None = "admin", **job: Any) -> str:
        """Submit a job (workdir defaults to the test's work directory); returns its id."""
        job.setdefault("workdir", str(self.workdir))
        job.setdefault("project", "alpha")
        status, body = self.api("POST", "/api/v1/jobs", job, token=token)
        assert status == 201, (status, body)
        return body["ids"][0]

    def job(self, job_id: str) -> dict:
        """The job as the API shows it."""
        status, body = self.api("GET", f"/api/v1/jobs/{job_id}")
        assert status == 200, (status, body)
        return body

    def wait_state(self, job_id: str, *states: str, timeout: float = TIMEOUT_S) -> dict:
        """Wait until the job is in one of ``states``; returns the job."""
        def reached():
            job = self.job(job_id)
            return job if job["state"] in states else None
        return wait_for(reached, f"job {job_id} to be {'/'.join(states)} ({self.job(job_id)['reason']})",
                        timeout)

    def cycles(self) -> int:
        """How many scheduling cycles the controller has run (its /healthz says)."""
        status, body = self.api("GET", "/healthz", token=None)
        assert status == 200, (status, body)
        return body["cycles"]

    def wait_cycles(self, count: int = 2, timeout: float = TIMEOUT_S) -> None:
        """Wait until the controller has run ``count`` more scheduling cycles: what they would do is done."""
        target = self.cycles() + count
        wait_for(lambda: self.cycles() >= target, f"{count} more scheduling cycles", timeout)

    def token_for(self, user: str, admin: bool = False) -> str:
        """A new token for ``user``, made by the admin."""
        status, body = self.api("POST", "/api/v1/tokens", {"user": user, "admin": admin})
        assert status == 201, body
        return body["token"]


@contextlib.contextmanager
def running_cluster(root: Path, policy: str = POLICY, nodes: dict[str, int] | None = None,
                    **options: Any) -> Iterator[LiveCluster]:
    """A started controller and node daemons (``nodes``: name to fake GPUs), under ``root``; on leaving, every
    process is stopped by pid and every task the nodes left is killed. ``options`` go to :class:`LiveCluster`."""
    cluster = LiveCluster(root, policy, **options)
    try:
        cluster.start_controller()
        for name, gpus in (nodes or {}).items():
            cluster.start_node(name, gpus=gpus)
        yield cluster
    finally:
        cluster.close()
