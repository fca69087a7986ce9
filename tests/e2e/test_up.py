"""``gpud up`` as a real process on 127.0.0.1, driven by gpuctl processes that find it with no flags."""

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from daemons import START_TIMEOUT_S, Process, free_port, wait_for
from node_helpers import kill_everything

from gpud.allinone import CLIENT_MARK, default_policy, default_state_dir, write_client_config
from gpud.demo import demo_jobs

STOP_TIMEOUT_S = 15


class Up:
    """One ``gpud up`` process with its own HOME, config and data directories; stopped by pid."""

    def __init__(self, root: Path, *flags: str, state_dir: Path | None = None, log: str = "up.log") -> None:
        self.root = root
        self.port = free_port()
        self.state_dir = state_dir or root / "state"
        self.workdir = root / "work"
        self.workdir.mkdir(exist_ok=True)
        self.env = {k: v for k, v in os.environ.items() if k not in ("GPUD_URL", "GPUD_TOKEN", "GPUD_PROJECT")}
        self.env.update(HOME=str(root / "home"), XDG_CONFIG_HOME=str(root / "config"),
                        XDG_DATA_HOME=str(root / "data"), GPUD_TIMEOUT="10")
        self.flags = ["--port", str(self.port), "--state-dir", str(self.state_dir), *flags]
        self.popen: subprocess.Popen | None = None
        self.log = root / log

    def start(self, wait: bool = True) -> "Up":
        """Start the process; wait until it says gpuctl is set up."""
        self._since = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen([sys.executable, "-m", "gpud.cli.gpud_main", "up", *self.flags],
                                          env=self.env, stdout=out, stderr=subprocess.STDOUT, cwd=self.root)
        if wait:
            wait_for(self._ready, "gpud up to be ready", START_TIMEOUT_S)
        return self

    def _ready(self) -> bool:
        if self.popen.poll() is not None:
            raise AssertionError(f"gpud up exited with {self.popen.returncode}:\n{self.output()}")
        return "gpuctl is set up" in self.output()[self._since:]

    def output(self) -> str:
        """Everything the process printed so far."""
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """Signal the process by pid and wait; SIGKILL when it does not stop in time. Returns its exit status."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)
            try:
                self.popen.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        return self.popen.returncode

    def gpuctl(self, *args: str) -> subprocess.CompletedProcess:
        """Run gpuctl with this HOME and no GPUD_URL or GPUD_TOKEN: it must find gpud up by itself."""
        return subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", *args], env=self.env, cwd=self.workdir,
                              capture_output=True, text=True, timeout=60)

    def job(self, job_id: str) -> dict:
        """The job as ``gpuctl show --json`` prints it."""
        result = self.gpuctl("show", job_id, "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def wait_state(self, job_id: str, state: str, timeout: float = 20) -> dict:
        """Wait until the job is in ``state``; returns it."""
        return wait_for(lambda: (lambda job: job if job["state"] == state else None)(self.job(job_id)),
                        f"job {job_id} to be {state}", timeout)


@pytest.fixture
def ups(tmp_path):
    """Makes ``gpud up`` processes; afterwards every one is stopped by pid and its tasks killed."""
    made: list[Up] = []

    def make(*flags: str, **kwargs) -> Up:
        up = Up(tmp_path, *flags, **kwargs)
        made.append(up)
        return up

    yield make
    for up in made:
        up.stop(signal.SIGKILL)
        kill_everything(str(up.state_dir / "node"))
    kill_everything(str(tmp_path / "run"))


def test_gpuctl_finds_gpud_up_and_a_job_runs_to_completed(ups):
    up = ups("--fake-gpus", "4").start()
    config = Path(up.env["XDG_CONFIG_HOME"]) / "gpud" / "client.toml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert 'project = "default"' in config.read_text()
    assert "gpuctl submit --gpus 1" in up.output()
    submitted = up.gpuctl("submit", "--parsable", "--gpus", "1", "--",
                          sys.executable, "-c", "import os; print('on', os.environ['CUDA_VISIBLE_DEVICES'])")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    queue = up.gpuctl("queue")
    assert queue.returncode == 0 and "STATE" in queue.stdout, queue.stderr
    job = up.wait_state(job_id, "COMPLETED")
    assert job["exit_code"] == 0
    history = up.gpuctl("history")
    assert history.returncode == 0 and job_id in history.stdout and "COMPLETED" in history.stdout
    output = (up.workdir / f"gpud-{job_id}.out").read_text()
    assert output.startswith("on GPU-"), output
    projects = up.gpuctl("projects")
    assert all(name in projects.stdout for name in ("default", "alice-lab", "bob-lab"))
    assert up.stop() == 0


def test_gpuctl_run_starts_at_once_on_a_fresh_gpud_up(ups):
    """Interactive work (class build, within quota only) starts: project default's quota is the machine's GPUs."""
    up = ups("--fake-gpus", "2").start()
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "run", "--gpus", "2", "--", "sh", "-c",
                             "echo on $CUDA_VISIBLE_DEVICES"], env=up.env, cwd=up.workdir, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("GPU-") == 2, result.stdout


def test_gpud_up_stops_promptly_with_another_node_daemon_connected(ups, tmp_path):
    """A node's open WebSocket used to hold the stop for aiohttp's 60 s shutdown timeout."""
    up = ups("--fake-gpus", "1").start()
    node = Process(["node", "--controller", f"http://127.0.0.1:{up.port}", "--cluster-key-file",
                    str(up.state_dir / "controller" / "cluster.key"), "--state-dir", str(tmp_path / "n2"),
                    "--fake-gpus", "1", "--name", "n2", "--metrics-listen", "off"], tmp_path / "n2.log")
    try:
        wait_for(lambda: "n2 " in up.gpuctl("nodes").stdout and "up" in up.gpuctl("nodes").stdout,
                 "node n2 to be up")
        os.kill(up.popen.pid, signal.SIGTERM)
        up.popen.wait(STOP_TIMEOUT_S)  # raises TimeoutExpired when the stop is held up
        assert up.popen.returncode == 0, up.output()
    finally:
        node.stop(signal.SIGKILL)
        kill_everything(str(tmp_path / "n2"))


def test_fake_gpus_come_with_a_host_that_runs_one_job_per_gpu(ups):
    """On a 2-core machine, 8 fake GPUs still run 8 one-GPU jobs at once (each asks 1 CPU by default)."""
    up = ups("--fake-gpus", "8").start()
    assert "8 fake GPU(s), 64 CPUs, 512G memory" in up.output()
    ids = []
    for _ in range(8):
        submitted = up.gpuctl("submit", "--parsable", "--gpus", "1", "--", "sleep", "30")
        assert submitted.returncode == 0, submitted.stderr
        ids.append(submitted.stdout.strip())
    for job_id in ids:
        up.wait_state(job_id, "RUNNING")
    nodes = up.gpuctl("nodes")
    row = nodes.stdout.splitlines()[1].split()
    assert row[3:5] == ["8/8", "0"] and "8/64 8G/512G" in " ".join(row), nodes.stdout
    cancelled = up.gpuctl("cancel", *ids)
    assert cancelled.returncode == 0, cancelled.stderr


def test_fake_cpus_and_memory_flags_set_the_node_and_bad_ones_are_refused(ups):
    up = ups("--fake-gpus", "2", "--fake-cpus", "3", "--fake-memory", "24G").start()
    node = json.loads(up.gpuctl("nodes", "--json").stdout)["nodes"][0]
    assert (node["cpus"], node["memory_gib"], node["cpus_used"]) == (3, 24, 0)
    too_big = up.gpuctl("submit", "-c", "4", "--", "true")
    assert too_big.returncode == 1 and "CPU" in too_big.stderr, too_big.stderr
    bad = subprocess.run([sys.executable, "-m", "gpud.cli.gpud_main", "up", "--fake-gpus", "1", "--fake-memory",
                          "lots"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--fake-memory: expected a size such as 512G, got 'lots'" in bad.stderr


def test_the_project_in_the_client_config_is_used_and_a_users_choice_survives_a_restart(ups):
    up = ups("--fake-gpus", "1").start()
    config = Path(up.env["XDG_CONFIG_HOME"]) / "gpud" / "client.toml"
    config.write_text(config.read_text().replace('project = "default"', 'project = "bob-lab"'))
    up.stop()
    up.start()
    assert 'project = "bob-lab"' in config.read_text()
    submitted = up.gpuctl("submit", "--parsable", "--", "true")
    assert up.job(submitted.stdout.strip())["project"] == "bob-lab"
    explicit = up.gpuctl("submit", "--parsable", "-p", "alice-lab", "--", "true")
    assert up.job(explicit.stdout.strip())["project"] == "alice-lab"
    config.write_text(config.read_text().replace('project = "bob-lab"', "project = 3"))
    broken = up.gpuctl("submit", "--", "true")
    assert broken.returncode == 2 and "project must be a project's name in quotes" in broken.stderr


def test_a_running_job_survives_a_restart_and_completes(ups, tmp_path):
    run_dir = tmp_path / "run"  # the running tasks' state apart from the rest, as on a tmpfs
    up = ups("--fake-gpus", "2", "--run-dir", str(run_dir)).start()
    submitted = up.gpuctl("submit", "--parsable", "-p", "default", "--gpus", "1", "--",
                          "sh", "-c", "echo begun; sleep 3; echo ended")
    job_id = submitted.stdout.strip()
    up.wait_state(job_id, "RUNNING")  # from the start order on; the supervisor makes the task's directory next
    wait_for(lambda: list((run_dir / "tasks").iterdir()), "the task's directory in the run directory")
    assert not (up.state_dir / "node" / "tasks").exists()
    assert up.stop() == 0
    assert "running jobs keep running" in up.output()
    up.start()
    assert up.wait_state(job_id, "COMPLETED")["exit_code"] == 0
    assert (up.workdir / f"gpud-{job_id}.out").read_text() == "begun\nended\n"


def test_demo_refuses_a_policy_without_its_projects(ups, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('[[projects]]\nname = "vision"\ngpu_quota = 2\n')
    up = ups("--fake-gpus", "2", "--policy", str(policy), "--demo", "--exit-when-idle").start(wait=False)
    assert up.popen.wait(60) != 0
    assert "--demo needs the projects alice-lab, bob-lab" in up.output()


def test_demo_runs_to_the_end_and_exits_zero(ups):
    up = ups("--fake-gpus", "4", "--demo", "--exit-when-idle").start(wait=False)
    assert up.popen.wait(90) == 0, up.output()
    out = up.output()
    assert "$ gpuctl projects" in out and "$ gpuctl history" in out
    assert "FAIR SHARE" in out and "alice-lab" in out and "bob-lab" in out
    assert "big-sweep" in out and "0 did not" in out
    assert "waiting for the next scheduling cycle" not in out  # jobs no cycle judged yet are not shown as waiting
    assert len(list((up.state_dir / "demo").glob("gpud-*.out"))) == len(demo_jobs(4, "/"))


def test_no_gpu_message(ups):
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has NVIDIA GPUs")
    except pynvml.NVMLError:
        pass
    up = ups().start(wait=False)
    assert up.popen.wait(30) == 1
    out = up.output()
    assert "found no GPU" in out and "gpud up --fake-gpus 8" in out


def test_a_run_dir_gpud_up_cannot_make_is_refused_by_name(ups, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    up = ups("--fake-gpus", "1", "--run-dir", str(blocker / "run")).start(wait=False)
    assert up.popen.wait(30) == 1
    assert f"gpud up: cannot use {blocker / 'run'}: Not a directory" in up.output()
    assert "Traceback" not in up.output()


def test_a_second_gpud_up_on_the_same_state_dir_is_refused(ups):
    first = ups("--fake-gpus", "1").start()
    second = ups("--fake-gpus", "1", state_dir=first.state_dir, log="second.log").start(wait=False)
    assert second.popen.wait(30) == 1
    assert "another gpud up is using" in second.output()


def test_a_client_config_gpud_up_did_not_write_is_left_alone(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    path, written = write_client_config("http://127.0.0.1:1", "/t", env)
    assert written and Path(path).read_text().startswith(CLIENT_MARK)
    Path(path).write_text('url = "http://cluster:6830"\n')
    assert write_client_config("http://127.0.0.1:2", "/t", env) == (path, False)
    assert Path(path).read_text() == 'url = "http://cluster:6830"\n'


def test_default_state_dir_and_policy():
    assert default_state_dir({"XDG_DATA_HOME": "/d"}) == "/d/gpud"
    assert default_state_dir({}).endswith("/.local/share/gpud")
    from gpud.policy_file import ANY_PLACEMENT, parse_policy
    import tomllib
    policy = parse_policy(tomllib.loads(default_policy(8)), "policy.toml", ANY_PLACEMENT)
    assert set(policy.projects) == {"default", "alice-lab", "bob-lab"}
    assert not policy.projects["default"].users
    assert policy.projects["default"].quota_in("default").gpu == 8


def test_projects_asked_the_moment_gpud_up_is_ready_list_the_policy(ups):
    """The views made from the scheduler's plan answer in full from the start: asked before the first cycle
    has planned, the controller waits for it rather than showing no project."""
    up = ups("--fake-gpus", "2").start()
    projects = up.gpuctl("projects", "--json")
    usage = up.gpuctl("usage", "--json")
    assert projects.returncode == 0, projects.stderr
    queues = json.loads(projects.stdout)["queues"]
    assert {q["name"] for q in queues if q["kind"] == "project"} >= {"default"}, queues
    assert usage.returncode == 0, usage.stderr
    rows = json.loads(usage.stdout)["rows"]
    assert any(row["level"] == "project" and row["fair_share"] is not None for row in rows), rows
