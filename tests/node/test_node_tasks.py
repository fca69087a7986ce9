"""Running tasks with real processes and signals: environment, output files, exits, stopping, time limits."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import sys
import tempfile
import time

import pytest

from gpud.node.spec import SpecError, TaskKey, TaskSpec
from gpud.wire.task import ExitCause
from gpud.node.taskstate import Layout
from gpud.node.tasks import TaskTable
from node_helpers import alive, kill_everything, run_to_end, running, spec, wait_for
from programs import FOREVER, until_exists

PRINT_ENV = ("import json, os; keys = ['CUDA_VISIBLE_DEVICES', 'GPUD_JOB_ID', 'GPUD_TASK_INDEX', "
             "'GPUD_NUM_TASKS', 'GPUD_RESTART_COUNT', 'GPUD_CHECKPOINT_DIR', 'MASTER_ADDR', 'MASTER_PORT', "
             "'WORLD_SIZE', 'RANK', 'LOCAL_RANK', 'FROM_JOB']; "
             "print(json.dumps({k: os.environ.get(k) for k in keys} | {'uid': os.getuid(), 'cwd': os.getcwd(), "
             "'pgid': os.getpgid(0), 'pid': os.getpid()}))")

WAIT_FOR_GO = "import sys\n" + until_exists("go")

# The user nobody may not reach a virtualenv under a private home; the system Python has what PRINT_ENV needs.
SYSTEM_PYTHON = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None)


@pytest.fixture
def table(tmp_path):
    state_dir = tmp_path / "state"
    table = TaskTable(Layout(str(state_dir)))
    table.adopt()
    yield table
    table.launcher.close()
    kill_everything(str(state_dir))


@pytest.fixture
def workdir(tmp_path):
    path = tmp_path / "work"
    path.mkdir()
    return path


def test_task_gets_its_gpus_and_gpud_variables(table, workdir):
    uuids = ["GPU-aaaa", "GPU-bbbb"]
    key = TaskKey("7", 0, 2)
    table.start(key, spec(workdir, [sys.executable, "-c", PRINT_ENV], gpu_uuids=uuids, gpu_indices=[0, 1],
                          env={"FROM_JOB": "yes", "CUDA_VISIBLE_DEVICES": "ignored"}, restart_count=2))
    state = run_to_end(table, key)
    assert (state.exit_code, state.term_signal, state.reason, state.cause) == (0, None, "", ExitCause.EXITED)
    env = json.loads((workdir / "gpud-7.out").read_text())
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa,GPU-bbbb"
    assert (env["GPUD_JOB_ID"], env["GPUD_TASK_INDEX"], env["GPUD_NUM_TASKS"], env["GPUD_RESTART_COUNT"]) == \
        ("7", "0", "1", "2")
    assert env["GPUD_CHECKPOINT_DIR"] == table.layout.checkpoint_dir("7")
    assert os.path.isdir(env["GPUD_CHECKPOINT_DIR"])
    assert env["FROM_JOB"] == "yes" and env["MASTER_ADDR"] is None
    assert env["cwd"] == str(workdir)
    assert env["pgid"] == env["pid"], "the task leads its own process group"


def test_cpu_only_gang_task_gets_empty_gpus_and_rendezvous_variables(table, workdir):
    key = TaskKey("8", 1, 0)
    table.start(key, spec(workdir, [sys.executable, "-c", PRINT_ENV], num_tasks=2, master_addr="10.0.0.5",
                          master_port=29511, rank=1, local_rank=0, world_size=2, output="out-%j-%t.txt"))
    run_to_end(table, key)
    env = json.loads((workdir / "out-8-1.txt").read_text())
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"], env["RANK"], env["LOCAL_RANK"]) == \
        ("10.0.0.5", "29511", "2", "1", "0")
    assert env["GPUD_NUM_TASKS"] == "2"


@pytest.mark.skipif(os.geteuid() != 0 or not SYSTEM_PYTHON, reason="dropping privileges needs root")
def test_task_runs_as_the_jobs_user_never_root(table):
    workdir = tempfile.mkdtemp(prefix="gpud-test-")
    try:
        os.chmod(workdir, 0o777)
        key = TaskKey("9", 0, 0)
        table.start(key, spec(workdir, [SYSTEM_PYTHON, "-c", PRINT_ENV], user="nobody"))
        assert run_to_end(table, key).exit_code == 0
        out = os.path.join(workdir, "gpud-9.out")
        env = json.loads(open(out).read())
        assert env["uid"] == 65534 and os.stat(out).st_uid == 65534
        assert os.stat(table.layout.checkpoint_dir("9")).st_uid == 65534
    finally:
        for name in os.listdir(workdir):
            os.unlink(os.path.join(workdir, name))
        os.rmdir(workdir)


@pytest.mark.skipif(os.geteuid() != 0, reason="the user is checked only when the node runs as root")
def test_unknown_user_is_refused(table, workdir):
    key = TaskKey("10", 0, 0)
    table.start(key, spec(workdir, ["true"], user="no-such-user-gpud"))
    state = run_to_end(table, key)
    assert state.reason == "failed to start: unknown user 'no-such-user-gpud' on this node"
    assert state.cause is ExitCause.FAILED_TO_START
    assert state.exit_code is None and state.pid is None


@pytest.mark.skipif(os.geteuid() != 0, reason="only a node running as root could run a task as root")
def test_root_is_refused_unless_the_order_allows_it(table, workdir):
    key = TaskKey("10r", 0, 0)
    marker = workdir / "ran-as-root"
    table.start(key, spec(workdir, ["touch", str(marker)], user="root", allow_root=False))
    state = run_to_end(table, key)
    assert state.reason == ("failed to start: user 'root' is uid 0 on this node, and jobs run as root only for a "
                            "token created with --allow-root")
    assert state.pid is None and not marker.exists()
    allowed = TaskKey("10s", 0, 0)
    table.start(allowed, spec(workdir, ["touch", str(marker)], user="root"))
    assert run_to_end(table, allowed).exit_code == 0 and marker.exists()


def test_output_and_error_files_and_exit_code(table, workdir):
    key = TaskKey("11", 0, 0)
    code = "import sys; print('to out'); print('to err', file=sys.stderr); sys.exit(3)"
    table.start(key, spec(workdir, [sys.executable, "-c", code], output="logs-%j.out", error="logs-%j.%t.err"))
    state = run_to_end(table, key)
    assert (state.exit_code, state.term_signal, state.state) == (3, None, "exited")
    assert state.report()["exit_code"] == 3 and state.report()["ended"] >= state.report()["started"]
    assert (workdir / "logs-11.out").read_text() == "to out\n"
    assert (workdir / "logs-11.0.err").read_text() == "to err\n"


def test_terminating_signal_is_recorded(table, workdir):
    key = TaskKey("12", 0, 0)
    table.start(key, spec(workdir, [sys.executable, "-c", "import os; os.kill(os.getpid(), 6)"]))
    state = run_to_end(table, key)
    assert (state.exit_code, state.term_signal, state.reason) == (None, 6, "")


def test_script_runs_with_its_interpreter_line(table, workdir):
    key = TaskKey("13", 0, 0)
    script = f"#!{sys.executable}\nimport sys\nprint('python script', sys.argv[0].startswith('/dev/fd/'))\n"
    table.start(key, spec(workdir, script=script))
    assert run_to_end(table, key).exit_code == 0
    assert (workdir / "gpud-13.out").read_text() == "python script True\n"
    key = TaskKey("14", 0, 0)
    table.start(key, spec(workdir, script="echo from sh $GPUD_JOB_ID\nexit 4\n"))
    assert run_to_end(table, key).exit_code == 4
    assert (workdir / "gpud-14.out").read_text() == "from sh 14\n"


def test_missing_program_and_bad_spec_fail_to_start(table, workdir):
    key = TaskKey("15", 0, 0)
    table.start(key, spec(workdir, ["/no/such/program"]))
    assert run_to_end(table, key).reason.startswith("failed to start: cannot run /no/such/program")
    key = TaskKey("16", 0, 0)
    with pytest.raises(SpecError, match="workdir must be an absolute path") as bad:
        TaskSpec.decode({"user": "x", "workdir": "relative", "command": ["true"]}, error=SpecError)
    assert bad.value.field == "workdir"
    state = table.refuse(key, str(bad.value))
    assert state.state == "exited" and state.cause is ExitCause.FAILED_TO_START
    assert "workdir must be an absolute path" in state.reason
    assert table.refuse(key, "again") is None  # a task the node has already is left as it is


def test_a_start_for_a_known_task_is_ignored(table, workdir):
    key = TaskKey("17", 0, 0)
    assert table.start(key, spec(workdir, ["true"])) is not None
    assert table.start(key, spec(workdir, ["false"])) is None
    assert run_to_end(table, key).exit_code == 0


def test_stop_sends_term_to_the_whole_group(table, workdir):
    key = TaskKey("18", 0, 0)
    table.start(key, spec(workdir, script="sleep 60 &\necho $! > child.pid\nwait\n"))
    running(table, key)
    child = int(wait_for(lambda: (workdir / "child.pid").exists() and (workdir / "child.pid").read_text().strip()))
    started = time.monotonic()
    assert table.stop(key, "cancelled", grace_s=60)
    state = run_to_end(table, key, timeout=45)
    assert time.monotonic() - started < 30, "ended by its stop signal, long before the grace's SIGKILL"
    assert (state.term_signal, state.reason, state.cause) == (signal.SIGTERM, "stopped", ExitCause.STOPPED)
    assert not alive(child)


# The handler writes with os.write, which takes no lock. With print, a stop that comes while the main thread is
# still inside print('ready') (its bytes already in the file) enters the handler there (CPython looks for
# signals between a buffered stream's writes), and print in the handler then raises "reentrant call": the
# task ends with code 1 a few hundredths of a second after the stop, whatever its grace.
TRAP_TERM = ("import os, signal, time\nsignal.signal(signal.SIGTERM, lambda *a: os.write(1, b'got TERM\\n'))\n"
             "os.write(1, b'ready\\n')\n" + FOREVER)


def test_stop_waits_grace_then_kills_a_task_that_traps_term(table, workdir):
    key = TaskKey("19", 0, 0)
    table.start(key, spec(workdir, [sys.executable, "-c", TRAP_TERM], grace_s=60))
    running(table, key)
    wait_for(lambda: "ready" in (workdir / "gpud-19.out").read_text())
    started = time.monotonic()
    table.stop(key, "preempted", grace_s=1.0)
    state = run_to_end(table, key, timeout=45)
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 30, "the stop's grace, not the 60 s of the job's own"
    assert (state.term_signal, state.exit_code, state.reason) == (signal.SIGKILL, None, "stopped")
    assert "got TERM" in (workdir / "gpud-19.out").read_text()
    assert not alive(state.pid)


def test_a_second_stop_never_cuts_the_grace_short(table, workdir):
    key = TaskKey("19", 0, 1)
    out = workdir / "gpud-19.out"
    table.start(key, spec(workdir, [sys.executable, "-c", TRAP_TERM]))
    running(table, key)
    wait_for(lambda: "ready" in out.read_text())
    started = time.monotonic()
    table.stop(key, "preempted", grace_s=1.5)
    wait_for(lambda: "got TERM" in out.read_text())
    table.stop(key, "cancelled", grace_s=0)  # the controller says it again, with a policy reloaded meanwhile
    state = run_to_end(table, key)
    assert time.monotonic() - started >= 1.5
    assert (state.term_signal, state.reason) == (signal.SIGKILL, "stopped")
    assert out.read_text().count("got TERM") == 1, "one stop signal"


def test_a_hastened_stop_ends_the_grace_at_once(table, workdir):
    """A victim that reports its checkpoint within its grace is stopped then, not at the grace's end."""
    key = TaskKey("19", 0, 2)
    out = workdir / "gpud-19.out"
    table.start(key, spec(workdir, [sys.executable, "-c", TRAP_TERM]))
    running(table, key)
    wait_for(lambda: "ready" in out.read_text())
    started = time.monotonic()
    table.stop(key, "preempted", grace_s=60)
    wait_for(lambda: "got TERM" in out.read_text())
    table.stop(key, "preempted", grace_s=0, hasten=True)
    state = run_to_end(table, key)
    assert time.monotonic() - started < 30
    assert state.term_signal == signal.SIGKILL
    assert out.read_text().count("got TERM") == 1, "one stop signal"


def test_stop_signal_of_the_job_is_used(table, workdir):
    key = TaskKey("20", 0, 0)
    table.start(key, spec(workdir, ["sleep", "60"], stop_signal="INT"))
    running(table, key)
    table.stop(key, "cancelled", grace_s=5)
    assert run_to_end(table, key).term_signal == signal.SIGINT


def test_time_limit_stops_the_task_with_reason_timeout(table, workdir):
    key = TaskKey("21", 0, 0)
    started = time.monotonic()
    table.start(key, spec(workdir, ["sleep", "60"], time_limit_s=0.5, grace_s=1))
    state = run_to_end(table, key, timeout=45)
    assert 0.5 <= time.monotonic() - started < 30, "stopped at its limit, long before its sleep ends"
    assert (state.reason, state.cause, state.term_signal) == ("timeout", ExitCause.TIMEOUT, signal.SIGTERM)


def test_no_stray_process_survives_a_finished_task(table, workdir):
    key = TaskKey("22", 0, 0)
    # One child stays in the group, one escapes into a session of its own; both outlive the main process.
    code = ("import subprocess, sys\n"
            "a = subprocess.Popen(['sleep', '60'])\n"
            "b = subprocess.Popen(['sleep', '61'], start_new_session=True)\n"
            "open('kids', 'w').write(f'{a.pid} {b.pid}')\n")
    table.start(key, spec(workdir, [sys.executable, "-c", code]))
    state = run_to_end(table, key)
    assert state.exit_code == 0
    kids = [int(p) for p in (workdir / "kids").read_text().split()]
    assert kids and not any(alive(pid) for pid in kids)


def test_one_supervisor_serves_every_task_and_outlives_the_daemon_until_its_last_task_ends(table, workdir):
    keys = [TaskKey(str(30 + i), 0, 0) for i in range(3)]
    for key in keys[:2]:
        table.start(key, spec(workdir, ["true"]))
    table.start(keys[2], spec(workdir, [sys.executable, "-c", WAIT_FOR_GO + "sys.exit(4)"]))
    supervisors = {running(table, key).supervisor_pid for key in keys[2:]} | \
        {run_to_end(table, key).supervisor_pid for key in keys[:2]}
    assert len(supervisors) == 1
    (supervisor,) = supervisors
    table.launcher.close()  # as when the daemon goes away
    time.sleep(0.3)
    assert alive(supervisor), "the supervisor keeps the task it still runs"
    (workdir / "go").write_text("")
    assert run_to_end(table, keys[2]).exit_code == 4
    wait_for(lambda: not alive(supervisor), timeout=5)


def test_a_finished_tasks_stray_is_killed_and_other_tasks_keep_running(table, workdir):
    busy, leaving = TaskKey("33", 0, 0), TaskKey("34", 0, 0)
    table.start(busy, spec(workdir, ["sleep", "60"]))
    busy_pid = running(table, busy).pid
    code = ("import subprocess\n"
            "b = subprocess.Popen(['sleep', '62'], start_new_session=True)\n"
            "open('stray', 'w').write(str(b.pid))\n")
    table.start(leaving, spec(workdir, [sys.executable, "-c", code]))
    assert run_to_end(table, leaving).exit_code == 0
    wait_for(lambda: not alive(int((workdir / "stray").read_text())))
    table.refresh([busy])
    assert alive(busy_pid) and table.get(busy).state == "running"


def test_sigterm_to_the_supervisor_stops_every_task_with_its_stop_signal(table, workdir):
    keys = [TaskKey("35", 0, 0), TaskKey("36", 0, 0)]
    for key in keys:
        table.start(key, spec(workdir, ["sleep", "60"], grace_s=5))
    supervisor = running(table, keys[0]).supervisor_pid
    running(table, keys[1])
    os.kill(supervisor, signal.SIGTERM)
    for key in keys:
        state = run_to_end(table, key)
        assert (state.reason, state.term_signal) == ("stopped", signal.SIGTERM)


def test_a_task_whose_directory_vanished_still_has_its_exit_recorded(table, workdir):
    key = TaskKey("37", 0, 0)
    table.start(key, spec(workdir, [sys.executable, "-c", WAIT_FOR_GO + "sys.exit(3)"]))
    running(table, key)
    shutil.rmtree(table.layout.task_dir(key))
    (workdir / "go").write_text("")
    assert run_to_end(table, key).exit_code == 3


def test_a_task_whose_state_cannot_be_written_does_not_end_the_supervision_of_the_others(table, workdir):
    broken, other = TaskKey("38", 0, 0), TaskKey("39", 0, 0)
    table.start(broken, spec(workdir, [sys.executable, "-c", WAIT_FOR_GO]))
    table.start(other, spec(workdir, ["sleep", "60"], grace_s=5))
    started = running(table, broken)
    supervisor = started.supervisor_pid
    running(table, other)
    state_file = os.path.join(table.layout.task_dir(broken), "state.json")
    os.remove(state_file)
    os.makedirs(os.path.join(state_file, "in-the-way"))  # the exit can no longer be written there
    (workdir / "go").write_text("")
    wait_for(lambda: not alive(started.pid), timeout=10)  # the broken task has exited
    assert table.stop(other, "cancelled")
    state = run_to_end(table, other)
    assert (state.reason, state.term_signal) == ("stopped", signal.SIGTERM)
    assert alive(supervisor)


def test_stop_before_the_supervisor_starts_the_task(table, workdir):
    key = TaskKey("23", 0, 0)
    table.start(key, spec(workdir, ["sleep", "60"]))
    table.stop(key, "cancelled", grace_s=1)
    state = run_to_end(table, key)
    assert state.reason == "stopped"
    assert state.term_signal in (None, signal.SIGTERM)


def test_ack_forgets_an_exited_task_only(table, workdir):
    key = TaskKey("24", 0, 0)
    table.start(key, spec(workdir, ["sleep", "60"]))
    running(table, key)
    assert not table.ack(key)
    table.stop(key, "cancelled", grace_s=1)
    run_to_end(table, key)
    assert table.ack(key)
    assert table.get(key) is None and table.reports() == []
    wait_for(lambda: not os.path.exists(table.layout.task_dir(key)), timeout=5)
    assert os.path.isdir(table.layout.checkpoint_dir("24")), "the checkpoint directory outlives the task"


def test_a_new_table_adopts_running_tasks_and_records_their_exit(tmp_path, workdir):
    state_dir = str(tmp_path / "state")
    try:
        first = TaskTable(Layout(state_dir))
        first.adopt()
        key = TaskKey("25", 0, 0)
        first.start(key, spec(workdir, [sys.executable, "-c", WAIT_FOR_GO + "sys.exit(5)"]))
        pid = running(first, key).pid
        first.launcher.close()
        del first
        second = TaskTable(Layout(state_dir))
        (adopted,) = second.adopt()
        assert adopted.key == key and adopted.pid == pid and adopted.state == "running"
        (workdir / "go").write_text("")
        assert run_to_end(second, key).exit_code == 5
        second.launcher.close()
    finally:
        kill_everything(state_dir)


def test_a_task_recorded_after_a_new_table_adopted_is_adopted_when_its_supervisor_pokes(tmp_path, workdir):
    state_dir = str(tmp_path / "state")
    try:
        later = TaskTable(Layout(state_dir))
        assert later.adopt() == []  # a restarted daemon looked before the old supervisor recorded the task
        first = TaskTable(Layout(state_dir))
        key = TaskKey("29", 0, 0)
        first.start(key, spec(workdir, [sys.executable, "-c", WAIT_FOR_GO + "sys.exit(6)"]))
        pid = running(first, key).pid
        (found,) = later.refresh([key])  # what the supervisor's poke makes the restarted daemon do
        assert (found.key, found.state, found.pid) == (key, "running", pid)
        (workdir / "go").write_text("")
        assert run_to_end(later, key).exit_code == 6
        assert later.ack(key) and later.refresh([key]) == [] and later.get(key) is None
        # The supervisor that ran it is not this table's: the table deletes the directory itself.
        wait_for(lambda: not os.path.exists(later.layout.task_dir(key)), timeout=5)
        first.launcher.close()
    finally:
        kill_everything(state_dir)


def test_a_task_whose_supervisor_died_is_killed_and_reported_lost(table, workdir):
    key = TaskKey("26", 0, 0)
    table.start(key, spec(workdir, ["sleep", "60"]))
    state = running(table, key)
    wait_for(lambda: table.get(key).supervisor_pid)
    os.kill(table.get(key).supervisor_pid, signal.SIGKILL)
    final = run_to_end(table, key)
    assert (final.reason, final.cause) == ("supervisor lost", ExitCause.SUPERVISOR_LOST)
    wait_for(lambda: not alive(state.pid))


def test_read_log_from_an_offset(table, workdir):
    key = TaskKey("27", 0, 0)
    table.start(key, spec(workdir, [sys.executable, "-c", "print('héllo wörld')"]))
    run_to_end(table, key)
    answer = table.read_log({"type": "read_log", "request": "r1", "job": "27", "task": 0, "attempt": 0,
                             "offset": 0, "limit": 2})
    assert answer == {"type": "log", "request": "r1", "data": "h", "offset": 1, "missing": False}
    answer = table.read_log({"request": "r2", "job": "27", "task": 0, "attempt": 0, "offset": 1, "limit": 100})
    assert answer["data"] == "éllo wörld\n" and answer["offset"] == len("héllo wörld\n".encode())
    missing = table.read_log({"request": "r3", "path": str(workdir / "nope"), "offset": 0})
    assert missing["missing"] is True and missing["data"] == ""


def test_a_supervisor_of_its_own_per_task(tmp_path, workdir):
    from gpud.node.launch import Launcher
    layout = Layout(str(tmp_path / "state"))
    table = TaskTable(layout, Launcher(layout, node_wide=False))
    table.adopt()
    try:
        key = TaskKey("28", 0, 0)
        table.start(key, spec(workdir, [sys.executable, "-c", "raise SystemExit(9)"]))
        assert run_to_end(table, key).exit_code == 9
    finally:
        kill_everything(str(tmp_path / "state"))


@pytest.mark.skipif(os.geteuid() != 0, reason="the ownership check matters when the daemon reads as root")
def test_read_log_shows_only_a_file_the_jobs_user_owns(table, workdir):
    secret = workdir / "secret"
    secret.write_text("root only\n")
    mine = workdir / "mine.out"
    mine.write_text("nobody's output\n")
    os.chown(mine, pwd.getpwnam("nobody").pw_uid, -1)
    refused = table.read_log({"request": "r1", "path": str(secret), "offset": 0, "user": "nobody"})
    assert refused["data"] == "" and "not the job user's own" in refused["error"]
    shown = table.read_log({"request": "r2", "path": str(mine), "offset": 0, "user": "nobody"})
    assert shown["data"] == "nobody's output\n"
    unknown = table.read_log({"request": "r3", "path": str(mine), "offset": 0, "user": "no-such-user-here"})
    assert unknown["data"] == ""


def test_the_supervisor_deletes_only_the_directories_of_tasks_it_no_longer_supervises(tmp_path):
    from gpud.node.supervisor import Supervisor
    supervisor = Supervisor()
    ended, running_key = TaskKey("60", 0, 0), TaskKey("61", 0, 0)
    dirs = {key: tmp_path / key.dirname for key in (ended, running_key)}
    for path in [*dirs.values(), tmp_path / "not-a-task"]:
        path.mkdir()
        (path / "state.json").write_text("{}")
    supervisor.runs[running_key] = object()  # still supervised: its exit is not recorded yet
    for path in [*dirs.values(), tmp_path / "not-a-task"]:
        supervisor.forget(str(path))
    assert not dirs[ended].exists()
    assert dirs[running_key].is_dir() and (tmp_path / "not-a-task").is_dir()


def test_task_changes_noted_together_reach_the_daemon_in_one_poke(tmp_path):
    import socket as socket_module
    from gpud.node.agent import _Poke
    from gpud.node.supervisor import Notifier
    path = str(tmp_path / "node.sock")
    with socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_DGRAM) as daemon:
        daemon.bind(path)
        daemon.settimeout(5)
        notify = Notifier()
        notify.path = path
        keys = [TaskKey("70", 0, 0), TaskKey("71", 1, 2), TaskKey("70", 0, 0)]
        for key in keys:
            notify(key)
        notify.flush()
        notify.flush()  # nothing new: no datagram
        datagram = daemon.recv(65536)
        daemon.setblocking(False)
        with pytest.raises(BlockingIOError):
            daemon.recv(65536)

    class Agent:
        poked: list = []

        def poke(self, key):
            self.poked.append(key)

    agent = Agent()
    _Poke(agent).datagram_received(datagram, None)
    assert agent.poked == keys[:2]


def test_the_task_order_with_the_jobs_environment_is_readable_by_root_alone(table, workdir):
    key = TaskKey("60", 0, 0)
    table.start(key, spec(workdir, ["true"], env={"HF_TOKEN": "hf_secret"}))
    run_to_end(table, key)
    order = os.path.join(table.layout.task_dir(key), "task.json")
    assert "hf_secret" in open(order).read()
    assert os.stat(order).st_mode & 0o777 == 0o600


@pytest.mark.parametrize("node_wide", [True, False])
def test_a_supervisor_that_cannot_start_fails_the_task_and_the_table_keeps_working(tmp_path, workdir, node_wide):
    """A broken interpreter (a supervisor dying at import, say) ends the task; it never stalls the node's checks."""
    from gpud.node.launch import Launcher
    layout = Layout(str(tmp_path / "state"))
    table = TaskTable(layout, Launcher(layout, python=shutil.which("false"), node_wide=node_wide))
    table.adopt()
    try:
        key = TaskKey("29", 0, 0)
        table.start(key, spec(workdir, [sys.executable, "-c", "pass"]))
        state = wait_for(lambda: next((s for s in table.refresh() + table.states()
                                       if s.key == key and s.state == "exited"), None), timeout=10)
        assert (state.reason, state.cause) == ("failed to start: the supervisor did not start", ExitCause.NO_SUPERVISOR)
        assert table.refresh() == [] or all(s.state == "exited" for s in table.states())
    finally:
        table.launcher.close()
        kill_everything(str(tmp_path / "state"))
