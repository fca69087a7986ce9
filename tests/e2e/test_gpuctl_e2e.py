"""gpuctl against a real controller (and a node daemon with fake GPUs) on 127.0.0.1, as separate processes."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("gpud.controller") is None or importlib.util.find_spec("gpud.cli.controller_cmd") is None:
    pytest.skip("gpud.controller is not importable yet: the end-to-end gpuctl tests need `gpud controller`",
                allow_module_level=True)

from daemons import POLICY, running_cluster, wait_for  # noqa: E402  (after the skip: it needs the daemons)
from waiting import poll

ANSWER_TIMEOUT_S = "10"
NODE = "n1"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A controller and one node daemon with 4 fake GPUs, as processes on 127.0.0.1; stopped by pid after."""
    with running_cluster(tmp_path_factory.mktemp("gpuctl-e2e"), nodes={NODE: 4}) as live:
        yield {"live": live, "url": live.url, "token": live.admin_token, "root": live.root, "hung": None}


def gpuctl(cluster, *args: str, token: str | None = None, cwd: Path | None = None, stdin: str | None = None):
    """Run gpuctl as a user would; returns the finished process (returncode, stdout, stderr).

    Once the controller has stopped answering, every later call fails at
    once instead of waiting out its timeout again.
    """
    if cluster["hung"]:
        pytest.fail(f"the controller stopped answering earlier ({cluster['hung']}); its log:\n"
                    f"{cluster['live'].controller.output()}")
    env = {**os.environ, "GPUD_URL": cluster["url"], "GPUD_TOKEN": token or cluster["token"],
           "GPUD_TIMEOUT": ANSWER_TIMEOUT_S, "XDG_CONFIG_HOME": str(cluster["root"] / "no-config")}
    env.pop("GPUD_PROJECT", None)
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", *args], env=env, capture_output=True,
                            text=True, timeout=60, cwd=cwd or cluster["root"], input=stdin)
    if result.returncode == 3 and "cannot reach the controller" in result.stderr:
        cluster["hung"] = f"gpuctl {' '.join(args)}: {result.stderr.strip()}"
    return result


def ok(result) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result.stdout


def submit(cluster, *args: str, **kw) -> str:
    return ok(gpuctl(cluster, "submit", "--parsable", *args, **kw)).strip()


def user_token(cluster, user: str) -> str:
    return ok(gpuctl(cluster, "token", "create", "--user", user)).strip()


def job(cluster, job_id: str) -> dict:
    return json.loads(ok(gpuctl(cluster, "show", job_id, "--json")))


def wait_state(cluster, job_id: str, states: tuple[str, ...], timeout: float = 20.0) -> dict:
    found = poll(lambda: (lambda now: now if now["state"] in states else None)(job(cluster, job_id)), timeout, 0.2)
    assert found, job(cluster, job_id)
    return found


def test_whoami_and_tokens(cluster):
    assert ok(gpuctl(cluster, "whoami")) == "root (admin)\n"
    token = user_token(cluster, "alice")
    assert ok(gpuctl(cluster, "whoami", token=token)) == "alice\n"
    assert json.loads(ok(gpuctl(cluster, "whoami", "--json", token=token))) == {"user": "alice", "admin": False}


def test_a_wrong_token_is_refused_with_exit_1(cluster):
    result = gpuctl(cluster, "queue", token="gpud_not-a-token")
    assert result.returncode == 1
    assert "(HTTP 401)" in result.stderr and result.stdout == ""


def test_submit_queue_show_hold_release_cancel_history(cluster):
    job_id = submit(cluster, "-p", "alpha", "-J", "e2e-life", "--hold", "--", "sleep", "600")
    queue = ok(gpuctl(cluster, "queue", "--project", "alpha"))
    line = next(ln for ln in queue.splitlines() if ln.startswith(job_id + " "))
    assert "e2e-life" in line and "PENDING" in line and "root" in line
    shown = ok(gpuctl(cluster, "show", job_id))
    assert "Command:     sleep 600" in shown and "Held:        yes" in shown
    why = ok(gpuctl(cluster, "why", job_id))
    assert why.startswith(f"job {job_id} is PENDING") and f"gpuctl release {job_id}" in why
    assert ok(gpuctl(cluster, "release", job_id)) == f"released {job_id}\n"
    assert ok(gpuctl(cluster, "cancel", job_id)) == f"cancelled {job_id}\n"
    history = json.loads(ok(gpuctl(cluster, "history", "--json", "--project", "alpha")))
    assert any(j["id"] == job_id and j["state"] == "CANCELLED" for j in history["jobs"])
    table = ok(gpuctl(cluster, "history", "--since", "1h", "--limit", "50"))
    assert any(ln.startswith(job_id + " ") and "CANCELLED" in ln for ln in table.splitlines())


def test_a_script_with_directives(cluster, tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n#GPUD --project alpha --cpus 2\n#GPUD --time 1:00:00 --hold\necho hi\n")
    job_id = submit(cluster, "--mem", "2G", str(script))
    shown = job(cluster, job_id)
    assert (shown["name"], shown["project"], shown["cpus"], shown["memory_gib"], shown["time_limit_s"],
            shown["hold"]) == ("train.sh", "alpha", 2, 2, 3600, True)
    assert shown["script"] == script.read_text()
    ok(gpuctl(cluster, "cancel", job_id))


def test_arrays_and_batches(cluster, tmp_path):
    array_id = submit(cluster, "-p", "alpha", "--hold", "--array", "0-4%2", "--", "true")
    mine = json.loads(ok(gpuctl(cluster, "queue", "--json")))["jobs"]
    elements = sorted(j["id"] for j in mine if j.get("array_id") == array_id)
    assert elements == [f"{array_id}_{i}" for i in range(5)]
    assert ok(gpuctl(cluster, "cancel", array_id)).split()[1:] == elements
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"command": ["echo", str(i)], "hold": True}) + "\n" for i in range(50)))
    ids = ok(gpuctl(cluster, "submit", "-p", "alpha", "--from-file", str(jobs), "--parsable")).split()
    assert len(ids) == 50 == len(set(ids))
    assert ok(gpuctl(cluster, "cancel", *ids)).count("cancelled") == 50


def test_dependencies(cluster):
    first = submit(cluster, "-p", "alpha", "--hold", "--", "true")
    second = submit(cluster, "-p", "alpha", "--depends", f"afterok:{first}", "--", "true")
    why = ok(gpuctl(cluster, "why", second))
    assert f"waits for job {first}" in why
    unknown = gpuctl(cluster, "submit", "-p", "alpha", "--depends", "afterok:999999", "--", "true")
    assert unknown.returncode == 1 and "999999" in unknown.stderr
    ok(gpuctl(cluster, "cancel", first, second))


@pytest.mark.parametrize("args, message", [
    (["submit", "-p", "nope", "--", "true"], "unknown project 'nope'"),
    (["submit", "-p", "alpha", "--gpus", "0.5", "--gpu-memory", "10G", "--", "true"], "HTTP 422"),
    (["submit", "-p", "alpha", "--gpus", "64", "--", "true"], "HTTP 422"),
    (["show", "424242"], "no job 424242 (HTTP 404)"),
    (["cancel", "424242"], "HTTP 404"),
    (["drain", "no-such-node", "--reason", "x"], "HTTP 404"),
])
def test_refusals_exit_1_with_the_controllers_message(cluster, args, message):
    result = gpuctl(cluster, *args)
    assert result.returncode == 1, result
    assert message in result.stderr and result.stderr.count("\n") == 1


def test_users_are_kept_to_their_jobs_and_projects(cluster):
    alice = user_token(cluster, "alice")
    root_job = submit(cluster, "-p", "alpha", "--hold", "--", "true")
    refused = gpuctl(cluster, "cancel", root_job, token=alice)
    assert refused.returncode == 1 and "HTTP 403" in refused.stderr
    refused = gpuctl(cluster, "submit", "-p", "private", "--", "true", token=alice)
    assert refused.returncode == 1 and "may not submit to project 'private'" in refused.stderr
    for admin_verb in (["policy", "reload"], ["token", "create", "--user", "eve"], ["simulate", "--from-controller"]):
        refused = gpuctl(cluster, *admin_verb, token=alice)
        assert refused.returncode == 1 and "HTTP 403" in refused.stderr, admin_verb
    own = submit(cluster, "-p", "alpha", "--hold", "--", "true", token=alice)
    assert [j["id"] for j in json.loads(ok(gpuctl(cluster, "queue", "--me", "--json", token=alice)))["jobs"]] == [own]
    ok(gpuctl(cluster, "cancel", own, token=alice))
    ok(gpuctl(cluster, "cancel", root_job))


def test_policy_reload_keeps_the_old_policy_when_the_new_one_is_bad(cluster):
    policy = cluster["live"].policy_file
    assert ok(gpuctl(cluster, "policy", "reload")) == "policy reloaded\n"
    policy.write_text(POLICY + "\n[[projects]]\nname = 'gamma'\ngpu_quota = 'lots'\n")
    try:
        refused = gpuctl(cluster, "policy", "reload")
        assert refused.returncode == 1 and "the old one stays" in refused.stderr and "gpu_quota" in refused.stderr
    finally:
        policy.write_text(POLICY)
    assert gpuctl(cluster, "submit", "-p", "gamma", "--", "true").returncode == 1


def test_read_commands_answer_tables_and_json(cluster):
    for verb in (["queue"], ["queue", "--all"], ["history"], ["nodes"], ["projects"]):
        assert ok(gpuctl(cluster, *verb)).split()[0] in ("ID", "NODE", "POOL"), verb
        json.loads(ok(gpuctl(cluster, *verb, "--json")))


def test_simulate_from_the_controller(cluster, tmp_path):
    extra = tmp_path / "extra.toml"
    extra.write_text('[[jobs]]\nname = "what-if"\nproject = "alpha"\ngpus = 0\n')
    out = ok(gpuctl(cluster, "simulate", "--from-controller", str(extra)))
    assert "what-if" in out


# Jobs that really run on the node.

@pytest.fixture
def node(cluster):
    wait_for(lambda: any(n["name"] == NODE and n["state"] == "up" for n in
                         json.loads(ok(gpuctl(cluster, "nodes", "--json")))["nodes"]), f"node {NODE} up")
    return NODE


def test_a_job_runs_to_the_end_and_its_output_reads_back(cluster, node, tmp_path):
    job_id = submit(cluster, "-p", "alpha", "--gpus", "1", "--", "sh", "-c", "echo hello from $GPUD_JOB_ID; "
                                                                          "echo oops >&2", cwd=tmp_path)
    done = wait_state(cluster, job_id, ("COMPLETED", "FAILED"))
    assert done["state"] == "COMPLETED" and done["exit_code"] == 0 and done["nodes"] == [node]
    assert ok(gpuctl(cluster, "logs", job_id)) == f"hello from {job_id}\noops\n"
    history = ok(gpuctl(cluster, "history", "--limit", "20"))
    line = next(ln for ln in history.splitlines() if ln.startswith(job_id + " "))
    assert "COMPLETED" in line and node in line and line.split()[-1] == "0"


def test_separate_error_stream_and_a_failing_exit_code(cluster, node, tmp_path):
    job_id = submit(cluster, "-p", "alpha", "-e", "err-%j.txt", "--", "sh", "-c", "echo out; echo err >&2; exit 3",
                    cwd=tmp_path)
    done = wait_state(cluster, job_id, ("COMPLETED", "FAILED"))
    assert (done["state"], done["exit_code"]) == ("FAILED", 3)
    assert ok(gpuctl(cluster, "logs", job_id)) == "out\n"
    assert ok(gpuctl(cluster, "logs", job_id, "--err")) == "err\n"


def test_a_slurm_script_runs_as_it_is(cluster, node, tmp_path):
    script = tmp_path / "slurm.sh"
    script.write_text("#!/bin/sh\n#SBATCH -A alpha\n#SBATCH --job-name=sl --gres=gpu:1 -c 1 --mem=512\n"
                      "#SBATCH -t 10:00 -o %x-%j.log\n#SBATCH --mail-type=END\n"
                      "echo gpus=$CUDA_VISIBLE_DEVICES\n")
    result = gpuctl(cluster, "submit", "--parsable", str(script), cwd=tmp_path)
    job_id = ok(result).strip()
    assert "line 5: #SBATCH --mail-type=END ignored" in result.stderr
    done = wait_state(cluster, job_id, ("COMPLETED", "FAILED"))
    assert (done["state"], done["name"], done["gpus"], done["memory_gib"], done["time_limit_s"]) == (
        "COMPLETED", "sl", 1, 0.5, 600)
    assert (tmp_path / f"sl-{job_id}.log").read_text().startswith("gpus=GPU-")

def test_nodes_drain_and_resume(cluster, node):
    table = ok(gpuctl(cluster, "nodes"))
    assert any(ln.split()[:3] == [node, "default", "up"] for ln in table.splitlines())
    assert ok(gpuctl(cluster, "drain", node, "--reason", "e2e maintenance")).startswith(f"draining {node}")
    try:
        drained = next(n for n in json.loads(ok(gpuctl(cluster, "nodes", "--json")))["nodes"] if n["name"] == node)
        assert drained["state"] in ("drained", "draining") and drained["reason"] == "e2e maintenance"
        assert "e2e maintenance" in ok(gpuctl(cluster, "nodes"))
        alice = user_token(cluster, "alice")
        assert gpuctl(cluster, "resume", node, token=alice).returncode == 1
    finally:
        assert ok(gpuctl(cluster, "resume", node)) == f"resumed {node}\n"


def test_follow_a_running_jobs_log_until_it_ends(cluster, node, tmp_path):
    job_id = submit(cluster, "-p", "alpha", "--", "sh", "-c", "for i in 1 2 3; do echo tick $i; sleep 0.3; done",
                    cwd=tmp_path)
    wait_state(cluster, job_id, ("RUNNING", "COMPLETED"))
    out = ok(gpuctl(cluster, "logs", job_id, "-f"))
    assert out == "tick 1\ntick 2\ntick 3\n"
