"""Arrays as one object, logs of jobs that wait or run as gangs: gpuctl against a live controller and node."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daemons import running_cluster, wait_for

NODE = "n1"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A controller and one node daemon with 4 fake GPUs, as processes on 127.0.0.1; stopped by pid after."""
    with running_cluster(tmp_path_factory.mktemp("daily"), nodes={NODE: 4}) as cluster:
        yield cluster


def gpuctl(live, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPUD_URL": live.url, "GPUD_TOKEN": live.admin_token, "GPUD_TIMEOUT": "10",
           "XDG_CONFIG_HOME": str(live.root / "no-config")}
    env.pop("GPUD_PROJECT", None)
    return subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", *args], env=env, capture_output=True,
                          text=True, timeout=60, cwd=cwd or live.workdir)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result.stdout


def show(live, job_id: str) -> dict:
    return json.loads(ok(gpuctl(live, "show", job_id, "--json")))


def wait_state(live, job_id: str, *states: str, timeout: float = 30) -> dict:
    return wait_for(lambda: (lambda j: j if j["state"] in states else None)(show(live, job_id)),
                    f"job {job_id} to be {'/'.join(states)}", timeout)


def test_an_array_is_one_object_in_every_verb(live):
    # Elements run until the test lets them end: the counts below must not move while gpuctl reads them.
    go = live.workdir / "array-go"
    go.unlink(missing_ok=True)
    array_id = ok(gpuctl(live, "submit", "--parsable", "-p", "alpha", "--gpus", "1", "--array", "0-5%2", "--",
                         "sh", "-c", f"echo element $GPUD_ARRAY_TASK_ID; while [ ! -e {go} ]; do sleep 0.1; done"
                         )).strip()
    wait_for(lambda: show(live, array_id)["array"]["states"].get("RUNNING") == 2, "two elements running")

    queue = ok(gpuctl(live, "queue")).splitlines()
    rows = [line for line in queue if line.startswith(f"{array_id}_")]
    assert len(rows) == 1 and rows[0].startswith(f"{array_id}_[0-5]") and "RUNNING" in rows[0], queue
    assert "2 running, 4 pending" in rows[0]
    expanded = [line.split()[0] for line in ok(gpuctl(live, "queue", "--array")).splitlines()[1:]]
    assert sorted(e for e in expanded if e.startswith(f"{array_id}_")) == [f"{array_id}_{i}" for i in range(6)]

    shown = ok(gpuctl(live, "show", array_id))
    assert f"Array:     {array_id} (6 jobs {array_id}_N, at most 2 at once)" in shown
    assert f"  {array_id}_5" in shown and "RUNNING (2 running, 4 pending)" in shown
    why = ok(gpuctl(live, "why", array_id))
    assert why.startswith(f"array {array_id}: 6 jobs, 2 running, 4 pending\njob {array_id}_2 is PENDING"), why

    held = ok(gpuctl(live, "hold", array_id))
    assert held.startswith("held ") and f"{array_id}_5" in held
    assert "the job is held" in ok(gpuctl(live, "why", array_id))
    assert f"{array_id}_5" in ok(gpuctl(live, "release", array_id))

    go.touch()
    done = wait_state(live, array_id, "COMPLETED", timeout=60)
    assert done["array"]["states"] == {"COMPLETED": 6} and len(done["elements"]) == 6
    logs = ok(gpuctl(live, "logs", array_id))
    assert f"==> {array_id}_0 (completed) <==\nelement 0\n" in logs and "element 5\n" in logs
    cancelled = gpuctl(live, "cancel", array_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout == f"array {array_id} has already ended (6 completed); nothing to cancel\n"
    assert "array" in ok(gpuctl(live, "why", array_id)) and "no job of it waits" in ok(gpuctl(live, "why", array_id))
    following = gpuctl(live, "logs", "-f", array_id)
    assert following.returncode == 1 and f"follow one of them, e.g. gpuctl logs -f {array_id}_0" in following.stderr


def test_logs_follow_waits_for_a_pending_job_to_start(live, tmp_path):
    job_id = ok(gpuctl(live, "submit", "--parsable", "-p", "alpha", "--hold", "--", "sh", "-c",
                       "echo started; sleep 0.5; echo done", cwd=tmp_path)).strip()
    plain = gpuctl(live, "logs", job_id)
    assert plain.returncode == 1 and "gpuctl logs -f waits for it to start" in plain.stderr
    follower = subprocess.Popen([sys.executable, "-m", "gpud.cli.gpuctl", "logs", "-f", job_id],
                                env={**os.environ, "GPUD_URL": live.url, "GPUD_TOKEN": live.admin_token},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        live.wait_cycles(2)  # the held job does not start, and the follower waits on
        assert follower.poll() is None, follower.communicate()
        ok(gpuctl(live, "release", job_id))
        out, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            os.kill(follower.pid, signal.SIGKILL)
            follower.wait()
    assert (follower.returncode, out) == (0, "started\ndone\n"), err


def test_ctrl_c_of_logs_follow_leaves_no_traceback_in_the_controller_log(live, tmp_path):
    job_id = ok(gpuctl(live, "submit", "--parsable", "-p", "alpha", "--", "sh", "-c",
                       "while true; do echo tick; sleep 0.1; done", cwd=tmp_path)).strip()
    wait_state(live, job_id, "RUNNING")
    before = len(live.controller.log.read_text(errors="replace"))
    follower = subprocess.Popen([sys.executable, "-m", "gpud.cli.gpuctl", "logs", "-f", job_id],
                                env={**os.environ, "GPUD_URL": live.url, "GPUD_TOKEN": live.admin_token},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: follower.stdout.read1(100), "the followed log to print")
        os.kill(follower.pid, signal.SIGINT)
        assert follower.wait(10) == 130
    finally:
        if follower.poll() is None:
            os.kill(follower.pid, signal.SIGKILL)
            follower.wait()
        ok(gpuctl(live, "cancel", job_id))
    time.sleep(2)  # the controller finds the reader gone at its next write
    after = live.controller.log.read_text(errors="replace")[before:]
    assert "Traceback" not in after and "Error handling request" not in after, after


def test_a_gang_writes_one_output_file_per_task(live, tmp_path):
    job_id = ok(gpuctl(live, "submit", "--parsable", "-p", "alpha", "--tasks", "3", "--", "sh", "-c",
                       "echo rank $RANK of $WORLD_SIZE", cwd=tmp_path)).strip()
    assert show(live, job_id)["output"] == "gpud-%j.%t.out"
    wait_state(live, job_id, "COMPLETED")
    for task in range(3):
        assert ok(gpuctl(live, "logs", job_id, "--task", str(task))) == f"rank {task} of 3\n"
        assert (tmp_path / f"gpud-{job_id}.{task}.out").read_text() == f"rank {task} of 3\n"


def test_an_elastic_gang_says_what_it_runs_and_restarts_with_each_new_world_size(live, tmp_path):
    blocker = ok(gpuctl(live, "submit", "--parsable", "-p", "alpha", "--gpus", "2", "--", "sleep", "300")).strip()
    wait_state(live, blocker, "RUNNING")
    gang = ok(gpuctl(live, "submit", "--parsable", "-p", "alpha", "--tasks", "4", "--min-tasks", "2", "--gpus", "1",
                     "--", "sh", "-c", "echo rank $RANK of $WORLD_SIZE; sleep 300", cwd=tmp_path)).strip()
    try:
        wait_state(live, gang, "RUNNING")
        running = wait_for(lambda: (lambda j: j if j["reason"] else None)(show(live, gang)), "the gang's reason")
        # The same words whether the cycle that started the job or a later one judged the others last.
        assert running["reason"].startswith("runs 2 of its 4 tasks; the others wait: project alpha: "), running["reason"]
        assert "; waiting for GPUs: " in running["reason"] and running["reason_code"] == "partial", running
        live.wait_cycles(2)  # later cycles too: they no longer start the job, only find its other tasks no room
        row = next(line for line in ok(gpuctl(live, "queue")).splitlines() if line.startswith(gang + " "))
        assert "runs 2 of its 4 tasks; the others wait: " in row, row
        out = [tmp_path / f"gpud-{gang}.{task}.out" for task in range(4)]
        wait_for(lambda: [p.read_text() if p.exists() else "" for p in out[:2]] == ["rank 0 of 2\n", "rank 1 of 2\n"],
                 "the two running ranks to see WORLD_SIZE=2")
        ok(gpuctl(live, "cancel", blocker))
        wait_for(lambda: all(p.exists() and p.read_text().endswith(f"rank {t} of 4\n") for t, p in enumerate(out)),
                 "every rank to restart with WORLD_SIZE=4")
        assert out[0].read_text() == "rank 0 of 2\nrank 0 of 4\n" and out[3].read_text() == "rank 3 of 4\n"
        grown = show(live, gang)
        assert grown["state"] == "RUNNING" and grown["reason"] == ""
        assert any(e["kind"] == "resized" and "WORLD_SIZE=4" in e["message"] for e in grown["events"])
    finally:
        gpuctl(live, "cancel", gang, blocker)


def test_an_elastic_gang_that_loses_tasks_restarts_the_rest_with_the_smaller_world_size(live, tmp_path):
    gang = ok(gpuctl(live, "submit", "--parsable", "-p", "alpha", "--tasks", "4", "--min-tasks", "2", "--gpus", "1",
                     "--", "sh", "-c", "echo rank $RANK of $WORLD_SIZE; sleep 300", cwd=tmp_path)).strip()
    out = [tmp_path / f"gpud-{gang}.{task}.out" for task in range(4)]
    newcomer = None
    try:
        wait_for(lambda: all(p.exists() and p.read_text() == f"rank {t} of 4\n" for t, p in enumerate(out)),
                 "four ranks with WORLD_SIZE=4")
        newcomer = ok(gpuctl(live, "submit", "--parsable", "-p", "beta", "--gpus", "2", "--", "sleep", "300")).strip()
        wait_state(live, newcomer, "RUNNING")
        def restarted() -> list[int] | None:  # both kept ranks, not the first of them to write
            found = [t for t, p in enumerate(out) if p.read_text().endswith("of 2\n")]
            return found if len(found) >= 2 else None

        kept = wait_for(restarted, "the kept ranks to restart with WORLD_SIZE=2")
        assert len(kept) == 2
        assert sorted(p.read_text().splitlines()[-1] for p in (out[t] for t in kept)) == ["rank 0 of 2", "rank 1 of 2"]
        shrunk = show(live, gang)
        assert shrunk["state"] == "RUNNING"
        assert shrunk["reason"].startswith("runs 2 of its 4 tasks"), shrunk["reason"]
        assert any(e["kind"] == "resized" and "WORLD_SIZE=2" in e["message"] for e in shrunk["events"])
    finally:
        gpuctl(live, "cancel", gang, *([newcomer] if newcomer else []))


def test_show_of_an_array_gives_the_reason_each_element_failed(live):
    array_id = ok(gpuctl(live, "submit", "--parsable", "-p", "alpha", "--array", "0-1", "--", "sh", "-c",
                         'exit "$GPUD_ARRAY_TASK_ID"')).strip()
    done = wait_state(live, array_id, "FAILED", "COMPLETED", timeout=60)
    failed = next(e for e in done["elements"] if e["state"] == "FAILED")
    assert failed["reason"], done["elements"]
    row = next(line for line in ok(gpuctl(live, "show", array_id)).splitlines()
               if line.split() and line.split()[0] == failed["id"])
    assert row.rstrip().endswith(failed["reason"]), row


def test_a_refusal_names_the_job_once(live):
    job_id = ok(gpuctl(live, "submit", "--parsable", "-p", "alpha", "--", "true")).strip()
    wait_state(live, job_id, "COMPLETED")
    refused = gpuctl(live, "cancel", job_id, "999999")
    assert refused.returncode == 1
    lines = refused.stderr.splitlines()
    assert lines[0].startswith(f"gpuctl cancel: job {job_id} has already ended"), refused.stderr
    assert lines[1].startswith("gpuctl cancel: ") and lines[1].count("999999") == 1, refused.stderr
