"""Interactive work end to end: gpuctl run/attach/forward on a real pseudo-terminal, a controller and a node on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from daemons import POLICY, LiveCluster, free_port, wait_for
from gpud.gpu.fake import set_process_usage
from pty_helpers import PtyProcess

NODE = "n1"
DETACH_TIMEOUT_S = 10
IDLE_TIMEOUT_S = 6
POLICY_WITH_IDLE = POLICY + f"""
[priority_classes]
idle-test = {{ priority = 100, idle_timeout = {IDLE_TIMEOUT_S} }}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A controller and one node daemon with 4 fake GPUs, as processes; stopped by pid after."""
    live = LiveCluster(tmp_path_factory.mktemp("interactive"), policy=POLICY_WITH_IDLE)
    with open(live.config, "a") as f:
        f.write(f"[interactive]\ndetach_timeout_s = {DETACH_TIMEOUT_S}\n")
    try:
        live.start_controller()
        live.start_node(NODE, gpus=4)
        yield live
    finally:
        live.close()


@pytest.fixture
def terminals():
    """Every gpuctl started on a terminal by the test, killed and reaped after it."""
    started: list[PtyProcess] = []
    yield started
    for process in started:
        process.close()


def user_env(cluster: LiveCluster, token: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GPUD_PROJECT", "GPUD_TOKEN", "GPUD_URL")}
    env.update({"GPUD_URL": cluster.url, "GPUD_TOKEN": token or cluster.admin_token, "TERM": "xterm",
                "XDG_CONFIG_HOME": str(cluster.root / "no-config")})
    return env


def gpuctl_pty(cluster, terminals, *args: str, token: str | None = None, rows: int = 24,
               cols: int = 80) -> PtyProcess:
    process = PtyProcess(list(args), user_env(cluster, token), str(cluster.workdir), rows, cols)
    terminals.append(process)
    return process


def gpuctl(cluster, *args: str, token: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", *args], env=user_env(cluster, token),
                          capture_output=True, text=True, timeout=timeout, cwd=cluster.workdir)


def submitted_id(process: PtyProcess) -> str:
    return process.expect(r"submitted interactive job (\d+)").group(1).decode()


def test_shell_runs_in_the_job_with_its_gpus_and_exits_with_its_status(cluster, terminals):
    term = gpuctl_pty(cluster, terminals, "run", "-p", "alpha", "--gpus", "1")
    job_id = submitted_id(term)
    term.expect(r"runs on n1; attaching")
    term.send('echo "gpus=[$CUDA_VISIBLE_DEVICES] job=$GPUD_JOB_ID dir=$(pwd) tty=$(tty)"\r')
    match = term.expect(r"gpus=\[(\S+)\] job=(\d+) dir=(\S+) tty=/dev/pts/\d+")
    job = cluster.job(job_id)
    assert job["state"] == "RUNNING" and job["interactive"] and job["priority_class"] == "build"
    assert match.group(1).decode().startswith("GPU-") and match.group(2).decode() == job_id
    assert match.group(3).decode() == str(cluster.workdir)
    term.send("exit 3\r")
    assert term.wait() == 3
    done = cluster.wait_state(job_id, "FAILED")
    assert done["exit_code"] == 3


def test_window_size_and_its_changes_reach_the_job(cluster, terminals):
    script = "stty size; read line; stty size; read line; exit 0"
    term = gpuctl_pty(cluster, terminals, "run", "-p", "alpha", "--gpus", "1", "--", "sh", "-c", script,
                      rows=33, cols=101)
    term.expect(r"\b33 101\b")
    term.resize(47, 133)
    time.sleep(1.0)  # the change travels gpuctl -> controller -> node before the next line is typed
    term.send("\r")
    term.expect(r"\b47 133\b")
    term.send("\r")
    assert term.wait() == 0


def command_running(*argv: str) -> int | None:
    """The pid of a process that runs exactly ``argv`` and is not stopped, if there is one."""
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["cmdline"] == list(argv) and proc.info["status"] != psutil.STATUS_STOPPED:
            return proc.pid
    return None


def test_ctrl_c_and_ctrl_z_act_in_the_job(cluster, terminals):
    term = gpuctl_pty(cluster, terminals, "run", "-p", "alpha", "--gpus", "1", "--", "bash", "--norc", "-i")
    term.expect(r"attaching")
    term.expect(r"bash-\S+[#$] ")  # the job's prompt: attached, so keys now go to the job, not to gpuctl
    term.send("sleep 1001\r")
    wait_for(lambda: command_running("sleep", "1001"), "the job's sleep to run")
    term.send(b"\x03")  # Ctrl-C: SIGINT to the job's foreground process group, not to gpuctl
    term.expect(r"\^C")
    term.send("echo status-$((100+$?))\r")
    term.expect(r"status-230")  # 130: the sleep was killed by SIGINT
    term.send("sleep 1002\r")
    wait_for(lambda: command_running("sleep", "1002"), "the job's second sleep to run")
    term.send(b"\x1a")  # Ctrl-Z: the job's shell stops its sleep
    term.expect(r"Stopped")
    term.send("fg\r")
    term.expect(r"sleep 1002")
    wait_for(lambda: command_running("sleep", "1002"), "the sleep to run on in the foreground")
    term.send(b"\x03")
    term.expect(r"\^C")
    term.send("exit 5\r")
    assert term.wait() == 5


def test_waiting_shows_the_queue_place_and_why_and_ctrl_c_cancels(cluster, terminals):
    blocker = cluster.submit(command=["sleep", "300"], gpus=2, priority="build", project="beta")
    cluster.wait_state(blocker, "RUNNING")
    try:
        term = gpuctl_pty(cluster, terminals, "run", "-p", "beta", "--gpus", "1")
        job_id = submitted_id(term)
        term.expect(r"job \d+ waits, 1 of 1 in project beta's queue")
        term.expect(r"quota")
        term.send(b"\x03")
        term.expect(rf"cancelled job {job_id}")
        assert term.wait() == 130
        assert cluster.job(job_id)["state"] == "CANCELLED"
    finally:
        cluster.api("POST", f"/api/v1/jobs/{blocker}/cancel")


def test_only_the_owner_and_admins_may_attach_run_inside_or_forward(cluster, terminals):
    carol = cluster.token_for("carol")
    term = gpuctl_pty(cluster, terminals, "run", "-p", "alpha", "--gpus", "1", "--", "sh", "-c",
                      "echo ready; read line; echo owner-typed:$line; exit 0")
    job_id = submitted_id(term)
    term.expect(r"ready")
    for args in (["attach", job_id], ["run", "--in", job_id, "--", "id"], ["forward", job_id, "8888:0"]):
        refused = gpuctl(cluster, *args, token=carol, timeout=30)
        assert refused.returncode == 1, (args, refused.stdout, refused.stderr)
        assert f"job {job_id} belongs to" in refused.stderr and "only its owner and admins" in refused.stderr
    # The WebSockets themselves refuse too, whatever a client skips.
    import asyncio

    import aiohttp

    async def handshake(path: str) -> int:
        async with aiohttp.ClientSession() as http:
            try:
                async with http.ws_connect(f"ws://127.0.0.1:{cluster.port}/api/v1/jobs/{job_id}/{path}",
                                           headers={"Authorization": f"Bearer {carol}"}):
                    return 101
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status
    for path in ("attach", "exec?argv=id", "forward?port=8888"):
        assert asyncio.run(handshake(path)) == 403, path
    # Nothing carol tried reached the terminal; its owner still has it.
    term.send("mine\r")
    term.expect(r"owner-typed:mine")
    assert term.wait() == 0
    admin_view = gpuctl(cluster, "show", job_id)
    assert admin_view.returncode == 0


def test_attach_after_the_client_is_killed_shows_what_was_missed(cluster, terminals):
    script = "echo started; sleep 2; echo while-away; read line; echo got:$line; exit 7"
    first = gpuctl_pty(cluster, terminals, "run", "-p", "alpha", "--gpus", "1", "--", "sh", "-c", script)
    job_id = submitted_id(first)
    first.expect(r"started")
    first.kill(signal.SIGKILL)  # the connection is lost; the terminal on the node goes on
    first.close()
    time.sleep(3)
    assert cluster.job(job_id)["state"] == "RUNNING"
    again = gpuctl_pty(cluster, terminals, "attach", job_id)
    again.expect(r"while-away")
    again.send("back\r")
    again.expect(r"got:back")
    assert again.wait() == 7
    assert cluster.wait_state(job_id, "FAILED")["exit_code"] == 7


def test_a_terminal_left_detached_too_long_ends_its_job(cluster, terminals):
    term = gpuctl_pty(cluster, terminals, "run", "-p", "alpha", "--gpus", "1", "--", "sleep", "300")
    job_id = submitted_id(term)
    term.expect(r"attaching")
    time.sleep(0.5)
    term.kill(signal.SIGKILL)
    term.close()
    job = cluster.wait_state(job_id, "CANCELLED", timeout=DETACH_TIMEOUT_S + 15)
    assert f"nobody attached to its terminal for {DETACH_TIMEOUT_S}s" in job["reason"]


def test_run_in_runs_inside_a_running_job_with_its_gpus(cluster, terminals):
    batch = cluster.submit(command=["sleep", "300"], gpus=2)
    try:
        job = cluster.wait_state(batch, "RUNNING")
        term = gpuctl_pty(cluster, terminals, "run", "--in", batch, "--", "sh", "-c",
                          'echo "inside=$GPUD_JOB_ID gpus=$CUDA_VISIBLE_DEVICES"; '
                          'echo "cgroup=$(grep :freezer: /proc/self/cgroup | cut -d: -f3)"; exit 4')
        match = term.expect(r"inside=(\d+) gpus=(\S+)")
        assert match.group(1).decode() == batch
        assert len(match.group(2).decode().split(",")) == 2
        cgroup = term.expect(r"cgroup=(\S*)").group(1).decode()
        assert term.wait() == 4
        task_cgroup = cluster.root / NODE / "tasks" / f"{batch}.0.0" / "cgroup"
        if task_cgroup.exists():  # the task has a freezer cgroup here: the command joined it
            assert cgroup and task_cgroup.read_text().strip().endswith(cgroup), (cgroup, task_cgroup.read_text())
        assert cluster.job(batch)["state"] == "RUNNING"  # the job goes on
        # An admin other than the owner may too; a shell without a command is the login shell.
        other_admin = cluster.token_for("dave", admin=True)
        shell = gpuctl_pty(cluster, terminals, "run", "--in", batch, token=other_admin)
        shell.send("echo in-$GPUD_JOB_ID; exit 0\r")
        shell.expect(rf"in-{batch}")
        assert shell.wait() == 0
        assert job["state"] == "RUNNING"
        # A job that is not running has nothing to run in.
        ended = gpuctl(cluster, "run", "--in", "99999", "--", "true")
        assert ended.returncode == 1 and "no job 99999" in ended.stderr
    finally:
        cluster.api("POST", f"/api/v1/jobs/{batch}/cancel")


def _start_forward(cluster, *args: str, token: str | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpud.cli.gpuctl", "forward", *args], env=user_env(cluster, token),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cluster.workdir)


def _stop(process: subprocess.Popen) -> str:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    return process.stderr.read()


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read()


def test_forward_reaches_an_http_server_in_the_job(cluster, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "hello.txt").write_text("served from the job\n" * 2000)
    remote, local = free_port(), free_port()
    job_id = cluster.submit(command=[sys.executable, "-m", "http.server", str(remote), "--bind", "127.0.0.1",
                                     "--directory", str(site)], gpus=1)
    forward = None
    try:
        cluster.wait_state(job_id, "RUNNING")
        forward = _start_forward(cluster, job_id, f"{remote}:{local}")
        body = wait_for(lambda: _try_get(f"http://127.0.0.1:{local}/hello.txt"), "the forwarded server")
        assert body == ("served from the job\n" * 2000).encode()
        assert _get(f"http://127.0.0.1:{local}/hello.txt") == body  # a second connection
        # A port nothing listens on is refused by the node, with the reason.
        unused = free_port()
        other = _start_forward(cluster, job_id, f"{unused}:0")
        time.sleep(1.5)
        assert other.poll() is None
        line = other.stderr.readline()
        port = int(line.split("127.0.0.1:")[1].split()[0])
        with pytest.raises(OSError):
            _get(f"http://127.0.0.1:{port}/")
        assert f"nothing listens on port {unused}" in _stop(other)
    finally:
        if forward is not None:
            _stop(forward)
        cluster.api("POST", f"/api/v1/jobs/{job_id}/cancel")


def _try_get(url: str) -> bytes | None:
    try:
        return _get(url)
    except OSError:
        return None


FAKE_LAB = """\
#!{python}
import http.server, json, sys
with open("lab-argv.json", "w") as f:
    json.dump(sys.argv[1:], f)
args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:] if "=" in a)
token = args["ServerApp.token"]
class Lab(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = ("token=" + token) in self.path
        self.send_response(200 if ok else 403)
        self.end_headers()
        self.wfile.write(b"lab for " + sys.argv[0].encode() if ok else b"bad token")
print("fake lab listening", flush=True)
http.server.HTTPServer(("127.0.0.1", int(args["port"])), Lab).serve_forever()
"""


def test_notebook_says_clearly_when_jupyter_is_missing(cluster, tmp_path):
    env = user_env(cluster)
    env["PATH"] = str(tmp_path)  # no jupyter-lab here
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "notebook", "-p", "alpha", "--gpus", "1"],
                            env=env, capture_output=True, text=True, timeout=30, cwd=cluster.workdir)
    assert result.returncode == 2
    assert "Jupyter Lab is not installed" in result.stderr and "pip install jupyterlab" in result.stderr
    assert not [j for j in cluster.api("GET", "/api/v1/jobs")[1]["jobs"] if j["name"] == "notebook"]


def test_notebook_prints_a_local_url_with_its_token(cluster, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    lab = bin_dir / "jupyter-lab"
    lab.write_text(FAKE_LAB.format(python=sys.executable))
    lab.chmod(0o755)
    env = user_env(cluster)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    (cluster.workdir / "lab-argv.json").unlink(missing_ok=True)
    process = subprocess.Popen([sys.executable, "-m", "gpud.cli.gpuctl", "notebook", "-p", "alpha", "--gpus", "1",
                                "--", "--notebook-dir=/srv/notebooks", "--ServerApp.iopub_data_rate_limit=1e10"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=cluster.workdir)
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = process.stdout.readline()
            if "http://127.0.0.1:" in line:
                url = line.strip()
        assert url and "/lab?token=" in url, process.stderr.read() if process.poll() is not None else url
        assert _get(url) == b"lab for " + str(lab).encode()
    finally:
        stderr = _stop(process)
    job_line = [line for line in stderr.splitlines() if "submitted interactive job" in line]
    job_id = job_line[0].rsplit(" ", 1)[1]
    assert cluster.wait_state(job_id, "CANCELLED", "COMPLETED", "FAILED")["state"] == "CANCELLED"
    argv = json.loads((cluster.workdir / "lab-argv.json").read_text())
    assert argv[-2:] == ["--notebook-dir=/srv/notebooks", "--ServerApp.iopub_data_rate_limit=1e10"] or \
        argv[-3:-1] == ["--notebook-dir=/srv/notebooks", "--ServerApp.iopub_data_rate_limit=1e10"], argv
    # The admin token's user here is the one running the tests: as root, Jupyter needs --allow-root, said aloud.
    as_root = cluster.api("GET", "/api/v1/whoami")[1]["user"] == "root"
    assert ("--allow-root" in argv) == as_root, argv
    assert ("passing --allow-root" in stderr) == as_root, stderr


@pytest.mark.parametrize("flags", [["--array", "0-3"], ["--tasks", "2"], ["--hold"], ["--min-tasks", "1"]])
def test_notebook_and_run_refuse_batch_options(cluster, flags):
    for verb in ("notebook", "run"):
        result = gpuctl(cluster, verb, "-p", "alpha", *flags)
        assert result.returncode == 2, result.stderr
        assert f"{flags[0]} cannot be used here" in result.stderr and "gpuctl run --in" in result.stderr


def test_run_stops_waiting_for_a_job_that_can_never_start(cluster):
    """Class build runs only within quota; project private has none, so the job is cancelled, not waited on."""
    result = gpuctl(cluster, "run", "-p", "private", "--gpus", "1", "--", "true")
    assert result.returncode == 1, result.stderr
    job_id = re.search(r"submitted interactive job (\d+)", result.stderr).group(1)
    assert f"job {job_id} can never start as asked, so it was cancelled" in result.stderr
    assert "quota of 0" in result.stderr and "preemptible priority" in result.stderr, result.stderr
    assert cluster.job(job_id)["state"] == "CANCELLED"


def test_a_terminal_without_a_size_gets_24_by_80(cluster, terminals):
    term = gpuctl_pty(cluster, terminals, "run", "-p", "alpha", "--", "sh", "-c", "echo size=$(stty size)",
                      rows=0, cols=0)
    term.expect(r"size=24 80")
    assert term.wait() == 0


def test_an_idle_interactive_job_is_warned_then_released(cluster, terminals):
    term = gpuctl_pty(cluster, terminals, "run", "-p", "alpha", "--gpus", "1", "--priority", "idle-test", "--",
                      "sh", "-c", "echo ready; sleep 300")
    job_id = submitted_id(term)
    term.expect(r"ready")
    # A busy GPU keeps the job, however long nobody types.
    gpu = cluster.job(job_id)["placements"][0]["gpus"][0]
    user = subprocess.Popen(["sleep", "300"])
    try:
        set_process_usage(str(cluster.root / NODE), user.pid, gpu, memory_gib=3.0, utilization=60.0)
        term.send("x")  # input, while the node's next sample sees the GPU busy; then nothing more is typed
        time.sleep(2 * IDLE_TIMEOUT_S + 2)
        assert cluster.job(job_id)["state"] == "RUNNING"
        # Idle now (memory still held): warned on the terminal, then ended with the reason recorded.
        set_process_usage(str(cluster.root / NODE), user.pid, gpu, memory_gib=3.0, utilization=0.0)
        began = time.monotonic()
        term.expect(rf"\[gpud\] job {job_id}: its GPUs have been idle and its terminal without input")
        term.expect(r"Type anything or use the GPUs to keep it")
        term.expect(rf"\[gpud\] job {job_id} ended: idle")
        assert time.monotonic() - began >= IDLE_TIMEOUT_S / 4  # the warning came that long before the end
        assert term.wait() == 1
        assert f"gpuctl: job {job_id} ended CANCELLED: idle: its GPUs were idle (3 GiB of memory held)" in term.text
        job = cluster.wait_state(job_id, "CANCELLED")
        assert f"idle_timeout of priority class idle-test" in job["reason"]
        shown = gpuctl(cluster, "show", job_id)
        assert "idle: its GPUs were idle" in shown.stdout
    finally:
        user.kill()
        user.wait()


def test_typing_keeps_an_idle_gpu_job(cluster, terminals):
    term = gpuctl_pty(cluster, terminals, "run", "-p", "alpha", "--gpus", "1", "--priority", "idle-test", "--",
                      "sh", "-c", "while read line; do echo typed:$line; done")
    job_id = submitted_id(term)
    term.expect(r"attaching")
    for n in range(int(2 * IDLE_TIMEOUT_S)):
        term.send(f"{n}\r")
        term.expect(rf"typed:{n}")
        time.sleep(1.0)
    assert cluster.job(job_id)["state"] == "RUNNING"
    assert b"[gpud]" not in term.seen
    term.send(b"\x04")  # Ctrl-D: end of input, the loop ends, so does the job
    assert term.wait() == 0
    assert cluster.wait_state(job_id, "COMPLETED")["exit_code"] == 0


def test_an_interactive_job_is_one_task_and_defaults_to_build(cluster):
    status, body = cluster.api("POST", "/api/v1/jobs", {"project": "alpha", "workdir": str(cluster.workdir),
                                                        "interactive": True, "tasks": 2})
    assert status == 422 and body["field"] == "tasks" and "gpuctl run --in" in body["error"]
    status, body = cluster.api("POST", "/api/v1/jobs", {"project": "alpha", "workdir": str(cluster.workdir),
                                                        "interactive": True, "array": "0-3"})
    assert status == 422 and body["field"] == "array"
    status, body = cluster.api("POST", "/api/v1/jobs", {"project": "alpha", "workdir": str(cluster.workdir),
                                                        "interactive": "yes"})
    assert status in (400, 422) and body["field"] == "interactive"
    # A batch job has no terminal to attach to.
    batch = cluster.submit(command=["sleep", "300"])
    try:
        cluster.wait_state(batch, "RUNNING")
        refused = gpuctl(cluster, "attach", batch)
        assert refused.returncode == 1 and "is a batch job with no terminal" in refused.stderr
    finally:
        cluster.api("POST", f"/api/v1/jobs/{batch}/cancel")


def test_a_terminal_lost_with_its_node_daemon_is_started_again_on_attach(cluster, terminals):
    term = gpuctl_pty(cluster, terminals, "run", "-p", "alpha", "--gpus", "1", "--", "sh", "-c",
                      "echo run-$$; read line; echo got:$line; exit 6")
    job_id = submitted_id(term)
    first_pid = term.expect(r"run-(\d+)").group(1)
    cluster.nodes[NODE].stop(signal.SIGKILL)  # the daemon dies; the job's holder lives on, its terminal does not
    log = cluster.root / f"{NODE}.log"
    registered = log.read_text().count("registered with the controller")
    cluster.start_node(NODE, gpus=4)
    wait_for(lambda: log.read_text().count("registered with the controller") > registered, "the node to come back")
    assert cluster.job(job_id)["state"] == "RUNNING"
    term.send("hello\r")
    term.expect(rf"the terminal was lost on node {NODE} \(its daemon restarted\); gpuctl attach {job_id} opens")
    assert term.wait() == 1
    again = gpuctl_pty(cluster, terminals, "attach", job_id)
    second_pid = again.expect(r"run-(\d+)").group(1)
    assert second_pid != first_pid
    again.send("back\r")
    again.expect(r"got:back")
    assert again.wait() == 6
    assert cluster.wait_state(job_id, "FAILED")["exit_code"] == 6


def test_a_run_in_terminal_ends_with_its_client(cluster, terminals, tmp_path):
    batch = cluster.submit(command=["sleep", "300"], gpus=1)
    marker = tmp_path / "still-running"
    try:
        cluster.wait_state(batch, "RUNNING")
        term = gpuctl_pty(cluster, terminals, "run", "--in", batch, "--", "sh", "-c",
                          f"echo inside; while true; do touch {marker}; sleep 0.2; done")
        term.expect(r"inside")
        wait_for(marker.exists, "the command to run")
        term.kill(signal.SIGKILL)
        term.close()
        time.sleep(4)  # hung up on the node: SIGHUP, SIGKILL 2 s later
        marker.unlink()
        time.sleep(1)
        assert not marker.exists()
        assert cluster.job(batch)["state"] == "RUNNING"
    finally:
        cluster.api("POST", f"/api/v1/jobs/{batch}/cancel")


def test_run_reads_a_pipe_and_ends_its_input(cluster):
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "run", "-p", "alpha", "--", "sh", "-c",
                             "while read line; do echo got:$line; done; exit 2"], env=user_env(cluster),
                            input="one\ntwo\n", capture_output=True, text=True, timeout=60, cwd=cluster.workdir)
    assert result.returncode == 2, result.stderr
    assert "got:one" in result.stdout and "got:two" in result.stdout
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "run", "-p", "alpha", "--", "sh", "-c",
                             "cat; echo done"], env=user_env(cluster), stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=60, cwd=cluster.workdir)
    assert result.returncode == 0 and "done" in result.stdout, result.stderr


def _listening(pid: int) -> set:
    import psutil
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


def test_terminals_run_as_the_jobs_user_and_nothing_new_listens_on_the_node(cluster, terminals):
    import pwd
    import shutil
    import tempfile
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("this machine has no user nobody to run a job as")
    node_pid = cluster.nodes[NODE].pid
    before = _listening(node_pid)
    workdir = tempfile.mkdtemp(prefix="gpud-nobody-", dir="/tmp")
    os.chmod(workdir, 0o777)
    try:
        token = cluster.token_for("nobody")
        term = gpuctl_pty(cluster, terminals, "run", "-p", "alpha", "--gpus", "1", "--workdir", workdir, "--",
                          "sh", "-c", "echo uid=$(id -u) user=$USER dir=$(pwd); read line; exit 0", token=token)
        job_id = submitted_id(term)
        match = term.expect(r"uid=(\d+) user=(\S+) dir=(\S+)")
        assert int(match.group(1)) == nobody.pw_uid and match.group(2) == b"nobody"
        assert match.group(3).decode() == workdir
        inside = gpuctl(cluster, "run", "--in", job_id, "--", "id", "-u", token=token)
        assert inside.returncode == 0 and inside.stdout.strip() == str(nobody.pw_uid), inside.stderr
        assert _listening(node_pid) == before  # terminals came over the node's own link
        term.send("\r")
        assert term.wait() == 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_refused_terminal_shows_the_controllers_reason_and_frees_the_job(cluster):
    env = {**user_env(cluster), "TERM": "no such term!"}
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "run", "-p", "alpha", "--", "true"], env=env,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, cwd=cluster.workdir)
    assert result.returncode == 1, result.stderr
    assert "term must be a terminal name" in result.stderr and "HTTP 422" in result.stderr, result.stderr
    job_id = re.search(r"submitted interactive job (\d+)", result.stderr).group(1)
    assert f"cancelled job {job_id}" in result.stderr
    assert cluster.wait_state(job_id, "CANCELLED")["state"] == "CANCELLED"
