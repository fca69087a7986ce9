"""The node's WebSocket protocol against a small in-test controller on 127.0.0.1, in-process and as a daemon."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest
from aiohttp import web

from gpud.gpu.fake import FakeBackend, fake_uuid, inject_fault, set_gpu_cpus
from gpud.node import cgroups
from gpud.node.agent import NodeAgent
from gpud.node.config import NodeConfig
from gpud.node.link import ControllerLink
from gpud.node.spec import TaskKey
from node_helpers import alive, kill_everything, wait_for
from node_helpers import spec_json as spec  # the start orders carry the spec as JSON
from programs import FOREVER, until_exists
from waiting import until

KEY = "test-cluster-key"


class FakeController:
    """Plays the controller's side of /api/v1/node/connect: answers register and records what nodes send."""

    def __init__(self, key: str = KEY, heartbeat_s: float = 0.2) -> None:
        self.key = key
        self.heartbeat_s = heartbeat_s
        self.messages: asyncio.Queue = asyncio.Queue()
        self.ws: web.WebSocketResponse | None = None
        self.refused = 0
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.lease: dict = {}  # granted with every answer, when set: {"lease_s": ..., "grace_s": ...}
        self.answering = True  # False: nothing is answered, as through a cut link
        self.unanswered_register = False

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/node/connect", self._connect)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        await self.runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _connect(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.key}":
            self.refused += 1
            return web.json_response({"error": "unknown cluster key"}, status=401)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.ws = ws
        async for frame in ws:
            message = json.loads(frame.data)
            if message["type"] == "register" and not self.answering:
                self.unanswered_register = True
            elif message["type"] == "register":
                await ws.send_json({"type": "registered", "heartbeat_s": self.heartbeat_s, **self.lease})
            elif message["type"] == "heartbeat" and self.lease and self.answering:
                await ws.send_json({"type": "lease", "seq": message["seq"], **self.lease})
            await self.messages.put(message)
        return ws

    async def send(self, message: dict) -> None:
        await self.ws.send_json(message)

    async def answer_again(self) -> None:
        """Answer again, starting with a registration left unanswered."""
        self.answering = True
        if self.unanswered_register:
            self.unanswered_register = False
            await self.ws.send_json({"type": "registered", "heartbeat_s": self.heartbeat_s, **self.lease})

    async def next(self, kind: str, where=lambda m: True, timeout: float = 30.0) -> dict:
        """The next message of type ``kind`` that satisfies ``where`` (earlier others are dropped)."""
        async def find():
            while True:
                message = await self.messages.get()
                if message["type"] == kind and where(message):
                    return message
        return await asyncio.wait_for(find(), timeout)

    async def first(self, where) -> dict:
        """The next message of any type that satisfies ``where`` (earlier others are dropped)."""
        while True:
            message = await self.messages.get()
            if where(message):
                return message



def task_report(job: str, state: str):
    def match(message: dict) -> bool:
        return message["job"] == job and message["state"] == state
    return match


@pytest.fixture
async def controller():
    ctl = FakeController()
    await ctl.start()
    yield ctl
    await ctl.stop()


@pytest.fixture
def state_dir(tmp_path):
    path = tmp_path / "state"
    yield path
    kill_everything(str(path))
    kill_everything(str(tmp_path / "run"))


@pytest.fixture
def workdir(tmp_path):
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
async def agent(controller, state_dir):
    config = NodeConfig(controller_url=controller.url, cluster_key=KEY, state_dir=str(state_dir), name="n1",
                        pool="a100", labels={"rack": "r1"}, gpu_backend="fake", fake_gpus=2, poll_s=0.2,
                        reconnect_max_s=0.5)
    node = NodeAgent(config, FakeBackend("n1", 2, str(state_dir)))
    await node.start()
    yield node
    await node.stop()


async def test_register_reports_gpus_resources_and_labels(agent, controller):
    register = await controller.next("register")
    assert (register["node"], register["pool"], register["labels"]) == ("n1", "a100", {"rack": "r1"})
    assert [g["uuid"] for g in register["gpus"]] == [fake_uuid("n1", 0), fake_uuid("n1", 1)]
    assert register["gpus"][0] == {"index": 0, "uuid": fake_uuid("n1", 0), "model": "NVIDIA A100-SXM4-80GB",
                                   "memory_gib": 80.0, "healthy": True}
    assert register["cpus"] >= 1 and register["memory_gib"] > 0 and register["tasks"] == []
    heartbeat = await controller.next("heartbeat")
    assert heartbeat["tasks"] == [] and len(heartbeat["gpus"]) == 2


async def test_start_report_exit_and_ack(agent, controller, workdir):
    await controller.next("register")
    order = {"type": "start", "job": "5", "task": 0, "attempt": 1,
             "spec": spec(workdir, [sys.executable, "-c", "print('hi'); raise SystemExit(2)"],
                          gpu_uuids=[fake_uuid("n1", 1)], gpu_indices=[1])}
    await controller.send(order)
    await controller.send(order)
    exited = await controller.next("task", task_report("5", "exited"))
    assert (exited["exit_code"], exited["term_signal"], exited["attempt"], exited["reason"]) == (2, None, 1, "")
    heartbeat = await controller.next("heartbeat")
    assert [(t["job"], t["state"]) for t in heartbeat["tasks"]] == [("5", "exited")]
    await controller.send({"type": "read_log", "request": "r9", "job": "5", "task": 0, "attempt": 1,
                           "path": str(workdir / "gpud-5.out"), "offset": 0, "limit": 100})
    log = await controller.next("log")
    assert (log["request"], log["data"], log["offset"], log["missing"]) == ("r9", "hi\n", 3, False)
    await controller.send({"type": "ack", "job": "5", "task": 0, "attempt": 1})
    await controller.next("heartbeat", lambda m: m["tasks"] == [])


async def test_stop_order_uses_grace_then_sigkill(agent, controller, workdir):
    await controller.next("register")
    trap = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n" + FOREVER
    await controller.send({"type": "start", "job": "6", "task": 0, "attempt": 0,
                           "spec": spec(workdir, [sys.executable, "-c", trap])})
    running = await controller.next("task", task_report("6", "running"))
    assert running["pid"]
    await until(lambda: "ready" in (workdir / "gpud-6.out").read_text(), "the task to say it is ready")
    await controller.send({"type": "stop", "job": "6", "task": 0, "attempt": 0, "reason": "preempted",
                           "grace_s": 0.3})
    exited = await controller.next("task", task_report("6", "exited"))
    assert (exited["term_signal"], exited["reason"]) == (signal.SIGKILL, "stopped")
    assert not alive(running["pid"])


async def test_a_node_whose_lease_runs_out_stops_its_tasks_and_starts_none_until_renewed(controller, state_dir,
                                                                                         workdir):
    controller.lease = {"lease_s": 1.0, "grace_s": 0.3}
    config = NodeConfig(controller_url=controller.url, cluster_key=KEY, state_dir=str(state_dir), name="n1",
                        gpu_backend="fake", fake_gpus=1, poll_s=0.2, reconnect_max_s=0.5)
    node = NodeAgent(config, FakeBackend("n1", 1, str(state_dir)))
    await node.start()
    try:
        await controller.next("register")
        assert os.stat(state_dir / "lease.json").st_mode & 0o777 == 0o600
        trap = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + FOREVER
        await controller.send({"type": "start", "job": "7", "task": 0, "attempt": 0,
                               "spec": spec(workdir, [sys.executable, "-c", trap], grace_s=30.0)})
        running = await controller.next("task", task_report("7", "running"))
        await asyncio.sleep(1.5)  # renewed all along
        assert alive(running["pid"])
        controller.answering = False
        cut = asyncio.get_running_loop().time()
        def exit_of_7(message: dict) -> bool:  # reported alone, or in the register of a new connection
            reports = [message] if message["type"] == "task" else message.get("tasks") or []
            return any(r["job"] == "7" and r["state"] == "exited" for r in reports)
        found = await asyncio.wait_for(controller.first(exit_of_7), 15)
        heard = asyncio.get_running_loop().time()
        exited = next(r for r in ([found] if found["type"] == "task" else found["tasks"]) if r["job"] == "7")
        # The lease's grace, not the task's 30 s: the controller waits only for the lease's.
        assert (exited["term_signal"], exited["reason"]) == (signal.SIGKILL, "node lease expired")
        # Killed no sooner than the last lease granted (before the cut; monotonic, as the loop's clock) and its
        # grace: bounds from the lease itself, as a busy host may space the heartbeats before the cut widely.
        assert node.lease is not None and heard >= node.lease.expires + 0.3 - 0.05, (heard, node.lease)
        assert heard - cut < 10.0, "the lease's 0.3 s grace, not the task's 30 s"
        # Its heartbeats unanswered for longer than the lease, the node drops the connection and registers on a
        # new one (unanswered too); orders go there, not to the connection being closed.
        await until(lambda: controller.unanswered_register, "the node to connect again")
        await controller.send({"type": "start", "job": "8", "task": 0, "attempt": 0,
                               "spec": spec(workdir, ["sleep", "30"])})
        await asyncio.sleep(0.5)
        assert node.tasks.get(TaskKey("8", 0, 0)) is None, "a node without a lease starts nothing"
        await controller.answer_again()
        await until(lambda: node.lease is not None and not node.lease.expired(), "the lease to be renewed")
        await controller.send({"type": "start", "job": "8", "task": 0, "attempt": 0,
                               "spec": spec(workdir, ["sleep", "30"])})
        await controller.next("task", task_report("8", "running"))
    finally:
        await node.stop()


async def test_a_lost_supervisor_is_found_however_busy_pokes_keep_the_node(agent, controller, workdir):
    await controller.next("register")
    await controller.send({"type": "start", "job": "44", "task": 0, "attempt": 0,
                           "spec": spec(workdir, ["sleep", "60"])})
    running = await controller.next("task", task_report("44", "running"))
    supervisor = agent.tasks.get(TaskKey("44", 0, 0)).supervisor_pid

    async def poke_forever():  # another task's supervisor, say, changing state every 20 ms
        while True:
            agent.poke(TaskKey("45", 0, 0))
            await asyncio.sleep(0.02)

    def reports_lost(message: dict) -> bool:  # a task message, or a heartbeat's task list
        tasks = [message] if message["type"] == "task" else message.get("tasks", [])
        return any(t["job"] == "44" and t["state"] == "exited" and t["reason"] == "supervisor lost" for t in tasks)

    poker = asyncio.create_task(poke_forever())
    try:
        os.kill(supervisor, signal.SIGKILL)
        await asyncio.wait_for(controller.first(reports_lost), timeout=15)
    finally:
        poker.cancel()
    await asyncio.to_thread(wait_for, lambda: not alive(running["pid"]))


async def test_gpu_fault_is_reported_in_a_heartbeat(agent, controller, state_dir):
    await controller.next("register")
    inject_fault(str(state_dir), 1, "lost")
    heartbeat = await controller.next("heartbeat", lambda m: not m["gpus"][1]["healthy"])
    assert heartbeat["gpus"][0]["healthy"]


async def test_node_reregisters_when_the_controller_comes_back(agent, controller):
    await controller.next("register")
    port = controller.port
    await controller.stop()
    back = FakeController()
    await back.start(port)
    try:
        register = await back.next("register")
        assert register["node"] == "n1"
        await back.next("heartbeat")
    finally:
        await back.stop()


async def test_a_wrong_cluster_key_is_refused_and_retried(controller, state_dir):
    config = NodeConfig(controller_url=controller.url, cluster_key="wrong", state_dir=str(state_dir),
                        name="n1", gpu_backend="fake", fake_gpus=1, reconnect_max_s=0.2)
    node = NodeAgent(config, FakeBackend("n1", 1, str(state_dir)))
    await node.start()
    try:
        await until(lambda: controller.refused >= 2, "the controller to refuse the node twice", timeout=10.0)
        assert controller.messages.empty()
    finally:
        await node.stop()


def start_daemon(controller: FakeController, state_dir, key_file, run_dir=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpud.cli.gpud_main", "node", "--controller", controller.url,
                             "--state-dir", str(state_dir), "--cluster-key-file", str(key_file),
                             "--fake-gpus", "2", "--name", "d1", "--log-level", "warning",
                             *(["--run-dir", str(run_dir)] if run_dir else [])])


def stop_daemon(daemon: subprocess.Popen) -> None:
    if daemon.poll() is None:
        os.kill(daemon.pid, signal.SIGKILL)
    daemon.wait()


async def test_task_survives_kill_9_of_the_daemon_and_is_readopted(controller, state_dir, workdir, tmp_path):
    key_file = tmp_path / "cluster.key"
    key_file.write_text(KEY + "\n")
    run_dir = tmp_path / "run"  # the tasks' state apart from the checkpoints, as on a tmpfs
    daemon = start_daemon(controller, state_dir, key_file, run_dir)
    try:
        await controller.next("register")
        wait = until_exists("go") + "raise SystemExit(5)\n"
        await controller.send({"type": "start", "job": "40", "task": 0, "attempt": 0,
                               "spec": spec(workdir, [sys.executable, "-c", wait])})
        running = await controller.next("task", task_report("40", "running"))
        assert (run_dir / "tasks" / "40.0.0" / "state.json").exists()
        assert (state_dir / "checkpoints" / "40").is_dir() and not (state_dir / "tasks").exists()
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.wait()
        assert alive(running["pid"])
        daemon = start_daemon(controller, state_dir, key_file, run_dir)
        register = await controller.next("register")
        assert [(t["job"], t["state"], t["pid"]) for t in register["tasks"]] == [("40", "running", running["pid"])]
        (workdir / "go").write_text("")
        exited = await controller.next("task", task_report("40", "exited"))
        assert exited["exit_code"] == 5
    finally:
        stop_daemon(daemon)


async def test_daemon_stops_on_sigterm_leaving_tasks_running(controller, state_dir, workdir, tmp_path):
    key_file = tmp_path / "cluster.key"
    key_file.write_text(KEY)
    daemon = start_daemon(controller, state_dir, key_file)
    try:
        await controller.next("register")
        await controller.send({"type": "start", "job": "41", "task": 0, "attempt": 0,
                               "spec": spec(workdir, ["sleep", "60"])})
        running = await controller.next("task", task_report("41", "running"))
        daemon.terminate()
        assert await asyncio.to_thread(daemon.wait, 10) == 0
        assert alive(running["pid"])
    finally:
        stop_daemon(daemon)


def test_daemon_without_gpus_says_so(tmp_path):
    key_file = tmp_path / "cluster.key"
    key_file.write_text(KEY)
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpud_main", "node", "--controller",
                             "http://127.0.0.1:9", "--state-dir", str(tmp_path / "s"), "--cluster-key-file",
                             str(key_file)], capture_output=True, text=True, timeout=30)
    if result.returncode == 0 or "found no GPU" not in result.stderr:
        pytest.skip("this host has NVIDIA GPUs")
    assert result.returncode == 1 and "--fake-gpus N" in result.stderr


def test_daemon_that_cannot_make_its_run_dir_says_which_and_exits(tmp_path):
    key_file = tmp_path / "cluster.key"
    key_file.write_text(KEY)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpud_main", "node", "--controller",
                             "http://127.0.0.1:9", "--state-dir", str(tmp_path / "s"), "--run-dir",
                             str(blocker / "run"), "--cluster-key-file", str(key_file), "--fake-gpus", "1"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert f"cannot use {blocker / 'run'}" in result.stderr and "--run-dir" in result.stderr
    assert "Traceback" not in result.stderr


async def test_two_jobs_given_one_id_are_two_tasks_each_stopped_and_acknowledged_by_uid(agent, controller, workdir):
    """A controller restored from a backup may give job id 7 again: the node keys tasks by the job uid too."""
    await controller.next("register")
    old_uid, new_uid = "a" * 32, "b" * 32
    old = spec(workdir, ["sleep", "300"], job_uid=old_uid, output="old.out")
    new = spec(workdir, [sys.executable, "-c", "print('new job 7')"], job_uid=new_uid, output="new.out")
    await controller.send({"type": "start", "job": "7", "task": 0, "attempt": 0, "spec": old})
    first = await controller.next("task", lambda m: m.get("job_uid") == old_uid and m["state"] == "running")
    await controller.send({"type": "start", "job": "7", "task": 0, "attempt": 0, "spec": new})
    done = await controller.next("task", lambda m: m.get("job_uid") == new_uid and m["state"] == "exited")
    assert done["exit_code"] == 0 and (workdir / "new.out").read_text() == "new job 7\n"
    assert alive(first["pid"]), "the new job's exit stopped or replaced the old one's task"
    await controller.send({"type": "stop", "job": "7", "task": 0, "attempt": 0, "job_uid": old_uid,
                           "reason": "not wanted", "grace_s": 0.3})
    stopped = await controller.next("task", lambda m: m.get("job_uid") == old_uid and m["state"] == "exited")
    assert stopped["reason"] == "stopped"
    names = sorted(os.listdir(agent.layout.tasks_dir))
    assert names == [f"7.0.0@{old_uid}", f"7.0.0@{new_uid}"]
    await controller.send({"type": "ack", "job": "7", "task": 0, "attempt": 0, "job_uid": new_uid})
    heartbeat = await controller.next("heartbeat", lambda m: len(m["tasks"]) == 1)
    assert heartbeat["tasks"][0]["job_uid"] == old_uid


async def test_orders_without_a_uid_from_an_older_controller_still_reach_the_task(agent, controller, workdir):
    await controller.next("register")
    trap = ["sleep", "300"]
    await controller.send({"type": "start", "job": "8", "task": 0, "attempt": 0,
                           "spec": spec(workdir, trap, job_uid="c" * 32)})
    await controller.next("task", lambda m: m["job"] == "8" and m["state"] == "running")
    await controller.send({"type": "stop", "job": "8", "task": 0, "attempt": 0, "reason": "cancelled", "grace_s": 0.3})
    stopped = await controller.next("task", lambda m: m["job"] == "8" and m["state"] == "exited")
    assert stopped["reason"] == "stopped"
    await controller.send({"type": "ack", "job": "8", "task": 0, "attempt": 0})
    await controller.next("heartbeat", lambda m: m["tasks"] == [])


@pytest.mark.skipif("cpuset" not in cgroups.detect().enforced() or len(os.sched_getaffinity(0)) < 2,
                    reason="the host has no writable cpuset cgroup or a single CPU")
async def test_a_task_is_pinned_to_the_cpus_the_fake_gpus_declare_near_its_gpu(agent, controller, workdir, state_dir):
    near = sorted(os.sched_getaffinity(0))[-1]
    set_gpu_cpus(str(state_dir), {0: [0], 1: [near]})
    await controller.next("register")
    show = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    await controller.send({"type": "start", "job": "9", "task": 0, "attempt": 0,
                           "spec": spec(workdir, show, cpus=1.0, gpu_uuids=[fake_uuid("n1", 1)], gpu_indices=[1])})
    exited = await controller.next("task", task_report("9", "exited"))
    assert exited["exit_code"] == 0
    assert (workdir / "gpud-9.out").read_text() == f"[{near}]\n"


async def test_the_link_stops_even_when_a_connect_swallows_the_cancel():
    # As Python 3.11's asyncio.wait_for does when a cancel races the connect's own failure.
    attempts = 0

    @contextlib.asynccontextmanager
    async def swallowing_connect():
        nonlocal attempts
        attempts += 1
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            pass
        raise OSError("refused")
        yield  # pragma: no cover - never connects

    link = ControllerLink("ws://127.0.0.1:1/never", "key", owner=None, reconnect_max_s=0.05,
                          connect=swallowing_connect)
    running = asyncio.create_task(link.run())
    await until(lambda: attempts >= 2, "a second connection attempt")
    running.cancel()
    done, _ = await asyncio.wait({running}, timeout=5)
    assert running in done and running.cancelled(), "the link kept reconnecting after it was cancelled"
