"""Who sees and runs what, against a real controller and node daemon on 127.0.0.1.

A job's command, environment and paths are its owner's (and the admins');
the controller's files holding them are its own alone. The policy says
which priorities a project's users may ask for; jobs run as their token's
user, never as root unless the token allows it; admins list and revoke
tokens.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import stat
import subprocess
import sys
import time

import pytest

from daemons import POLICY, LiveCluster, running_cluster
from gpud.cli.job_cmd import show_text

SECRET = "hf_s3cr3t-value"
RESTRICTED = """
[[projects]]
name = "strict"
gpu_quota = 0
priorities = ["train", "nightly"]
max_priority = 60

[[projects]]
name = "strict-shell"
gpu_quota = 0
priorities = ["train", "interactive-preemptible"]
interactive_class = "interactive-preemptible"

[priority_classes]
nightly = 40
"""
ROOT_IS_UID_0 = pwd.getpwnam("root").pw_uid == 0
ME = pwd.getpwuid(os.geteuid()).pw_name


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("trust"), POLICY + RESTRICTED, nodes={"n1": 2}) as live:
        live.alice = live.token_for("alice")
        live.bob = live.token_for("bob")
        yield live


def alice_job(cluster: LiveCluster, **extra) -> str:
    """A held job of alice's carrying a secret in its environment and its command."""
    return cluster.submit(token=cluster.alice, command=["python3", "train.py", f"--key={SECRET}"],
                          env={"HF_TOKEN": SECRET}, output="secret/%j.out", error="secret/%j.err",
                          hold=True, cpus=0.1, memory_gib=0.1, **extra)


CONFIDENTIAL = ("command", "script", "env", "workdir", "output", "error")


def assert_public_only(view: dict) -> None:
    assert view["confidential"] is True
    for key in CONFIDENTIAL:
        assert key not in view, (key, view)
    assert SECRET not in repr(view) and "secret/" not in repr(view)


def test_another_user_sees_only_the_public_fields_of_a_job(cluster):
    job_id = alice_job(cluster, name="finetune")
    status, seen = cluster.api("GET", f"/api/v1/jobs/{job_id}", token=cluster.bob)
    assert status == 200
    assert_public_only(seen)
    assert (seen["id"], seen["user"], seen["name"], seen["state"]) == (job_id, "alice", "finetune", "PENDING")
    status, listing = cluster.api("GET", "/api/v1/jobs", token=cluster.bob)
    mine = [job for job in listing["jobs"] if job["id"] == job_id]
    assert len(mine) == 1
    assert_public_only(mine[0])
    status, why = cluster.api("GET", f"/api/v1/jobs/{job_id}/why", token=cluster.bob)
    assert status == 200 and SECRET not in repr(why)
    text = show_text(seen, time.time())
    assert "only its owner and admins see its command" in text and SECRET not in text


def test_an_array_shown_to_another_user_keeps_its_secrets(cluster):
    element = alice_job(cluster, array="0-2")
    array_id = element.partition("_")[0]
    for path in (f"/api/v1/jobs/{array_id}", f"/api/v1/jobs/{array_id}/why"):
        status, seen = cluster.api("GET", path, token=cluster.bob)
        assert status == 200 and SECRET not in repr(seen) and "secret/" not in repr(seen), (path, seen)
    status, seen = cluster.api("GET", f"/api/v1/jobs/{array_id}", token=cluster.bob)
    assert_public_only(seen)
    assert len(seen["elements"]) == 3
    status, own = cluster.api("GET", f"/api/v1/jobs/{array_id}", token=cluster.alice)
    assert own["env"]["HF_TOKEN"] == SECRET


def test_the_owner_and_an_admin_see_everything(cluster):
    job_id = alice_job(cluster)
    for token in (cluster.alice, "admin"):
        status, seen = cluster.api("GET", f"/api/v1/jobs/{job_id}", token=token)
        assert status == 200
        assert seen["env"] == {"HF_TOKEN": SECRET}
        assert seen["command"][-1] == f"--key={SECRET}"
        assert seen["workdir"] == str(cluster.workdir) and seen["output"] == "secret/%j.out"
        assert "confidential" not in seen


def test_finished_jobs_stay_confidential_in_history_and_listings(cluster):
    job_id = alice_job(cluster)
    status, _ = cluster.api("POST", f"/api/v1/jobs/{job_id}/cancel", token=cluster.alice)
    assert status == 200
    status, history = cluster.api("GET", "/api/v1/history?user=alice&limit=50", token=cluster.bob)
    assert status == 200
    ended = [job for job in history["jobs"] if job["id"] == job_id]
    assert len(ended) == 1 and ended[0]["state"] == "CANCELLED"
    assert_public_only(ended[0])
    status, listing = cluster.api("GET", "/api/v1/jobs?all=1", token=cluster.bob)
    assert_public_only(next(job for job in listing["jobs"] if job["id"] == job_id))
    status, shown = cluster.api("GET", f"/api/v1/jobs/{job_id}", token=cluster.bob)
    assert_public_only(shown)
    status, own = cluster.api("GET", "/api/v1/history?user=alice&limit=50", token=cluster.alice)
    assert next(job for job in own["jobs"] if job["id"] == job_id)["env"] == {"HF_TOKEN": SECRET}


def test_another_users_log_is_refused(cluster):
    job_id = alice_job(cluster)
    status, body = cluster.api("GET", f"/api/v1/jobs/{job_id}/logs", token=cluster.bob)
    assert status == 403 and SECRET not in repr(body)


def test_the_controllers_files_are_its_own_alone(cluster):
    alice_job(cluster)   # something written, so the WAL exists
    state = cluster.state_dir
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    for name in ("gpud.sqlite", "gpud.sqlite-wal", "gpud.sqlite-shm", "cluster.key", "admin.token"):
        assert stat.S_IMODE(os.stat(state / name).st_mode) == 0o600, name


# ------------------------------------------------------------ priorities


def post(cluster: LiveCluster, token: str, **job) -> tuple[int, dict]:
    body = {"project": "strict", "workdir": str(cluster.workdir), "command": ["true"], "hold": True,
            "cpus": 0.1, "memory_gib": 0.1, **job}
    return cluster.api("POST", "/api/v1/jobs", body, token=token)


@pytest.mark.parametrize("priority", ["inference", "build", 61, 1_000_000])
def test_a_user_is_refused_a_priority_the_project_does_not_allow(cluster, priority):
    status, body = post(cluster, cluster.alice, priority=priority)
    assert status == 403, body
    assert body["field"] == "priority"
    assert "train, nightly" in body["error"] and "up to 60" in body["error"], body


@pytest.mark.parametrize("priority", ["train", "nightly", 60, -5, None])
def test_a_user_gets_the_priorities_the_project_allows(cluster, priority):
    status, body = post(cluster, cluster.alice, **({} if priority is None else {"priority": priority}))
    assert status == 201, body


def test_an_interactive_job_gets_no_class_by_default_that_its_project_does_not_allow(cluster):
    """The default class of interactive work (gpuctl run sends no priority) is checked as a named one is."""
    status, body = post(cluster, cluster.alice, interactive=True)
    assert status == 403 and body["field"] == "priority", body
    assert "'build'" in body["error"] and "interactive_class" in body["error"] and "--priority" in body["error"]
    status, body = post(cluster, cluster.alice, interactive=True, priority="train")
    assert status == 201, body
    assert cluster.job(body["ids"][0])["priority"] == 50


def test_a_project_names_the_class_of_its_interactive_jobs(cluster):
    status, body = post(cluster, cluster.alice, project="strict-shell", interactive=True)
    assert status == 201, body
    job = cluster.job(body["ids"][0])
    assert (job["priority_class"], job["priority"]) == ("interactive-preemptible", 75)
    status, body = post(cluster, cluster.alice, project="strict-shell", command=["true"])
    assert status == 201 and cluster.job(body["ids"][0])["priority_class"] == "train", body


def test_an_admin_may_set_any_priority(cluster):
    status, body = post(cluster, "admin", priority=1_000_000)
    assert status == 201, body
    assert cluster.job(body["ids"][0])["priority"] == 1_000_000


def test_without_a_list_a_project_allows_every_class_and_integers_up_to_the_highest(cluster):
    status, body = post(cluster, cluster.bob, project="alpha", priority="inference")
    assert status == 201, body
    status, body = post(cluster, cluster.bob, project="alpha", priority=1_000_000)
    assert status == 403 and "up to 125" in body["error"], body


# ------------------------------------------------------------- identity


@pytest.mark.skipif(not ROOT_IS_UID_0, reason="this host has no root account with uid 0")
def test_a_token_for_root_without_allow_root_is_refused_at_submit(cluster):
    plain = cluster.token_for("root")
    status, body = post(cluster, plain, project="alpha")
    assert status == 403 and "uid 0" in body["error"] and "--allow-root" in body["error"], body


@pytest.mark.skipif(os.geteuid() != 0 or not ROOT_IS_UID_0, reason="only a node running as root runs jobs as root")
def test_a_token_made_with_allow_root_runs_jobs_as_root(cluster):
    status, body = cluster.api("POST", "/api/v1/tokens", {"user": "root", "allow_root": True})
    assert status == 201 and body["allow_root"] is True, body
    out = cluster.workdir / "whoami.out"
    job_id = cluster.submit(token=body["token"], command=["sh", "-c", f"id -u > {out}"], cpus=0.1, memory_gib=0.1)
    assert cluster.wait_state(job_id, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert out.read_text().strip() == "0"


@pytest.mark.skipif(os.geteuid() != 0 or not ROOT_IS_UID_0, reason="needs a node running as root")
def test_a_failure_that_quotes_the_workdir_does_not_show_it_to_others(cluster):
    status, body = cluster.api("POST", "/api/v1/tokens", {"user": "root", "allow_root": True})
    hidden = cluster.workdir / "project-x-secret" / "gone"
    job_id = cluster.submit(token=body["token"], command=["true"], workdir=str(hidden), cpus=0.1, memory_gib=0.1)
    ended = cluster.wait_state(job_id, "FAILED", "COMPLETED")
    assert "project-x-secret" in ended["reason"]    # the admin sees where
    status, seen = cluster.api("GET", f"/api/v1/jobs/{job_id}", token=cluster.bob)
    assert "project-x-secret" not in json.dumps(seen) and "<workdir>" in seen["reason"], seen
    status, why = cluster.api("GET", f"/api/v1/jobs/{job_id}/why", token=cluster.bob)
    assert "project-x-secret" not in json.dumps(why)


@pytest.mark.skipif(os.geteuid() != 0, reason="a node not running as root runs every job as its own user")
def test_a_job_whose_user_has_no_account_on_the_node_fails_saying_so(cluster):
    ghost = cluster.token_for("no-such-account-here")
    job_id = cluster.submit(token=ghost, command=["true"], cpus=0.1, memory_gib=0.1)
    ended = cluster.wait_state(job_id, "FAILED", "COMPLETED")
    assert ended["state"] == "FAILED"
    assert "unknown user 'no-such-account-here' on this node" in ended["reason"], ended


# ---------------------------------------------------------------- tokens


def gpuctl(cluster: LiveCluster, *args: str, token: str = "admin") -> subprocess.CompletedProcess:
    env = {**os.environ, "GPUD_URL": cluster.url, "GPUD_TOKEN": cluster.admin_token if token == "admin" else token,
           "XDG_CONFIG_HOME": str(cluster.root / "no-config")}
    return subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def test_an_admin_lists_tokens_without_seeing_them(cluster):
    dave = cluster.token_for("dave")
    listed = gpuctl(cluster, "token", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    tokens = json.loads(listed.stdout)["tokens"]
    users = [t["user"] for t in tokens]
    assert "dave" in users and "alice" in users
    assert dave not in listed.stdout and cluster.admin_token not in listed.stdout
    first = tokens[0]
    assert first["admin"] is True and first["allow_root"] is True   # the first admin token, made with --allow-root
    assert set(first) == {"id", "user", "admin", "allow_root", "created"}
    table = gpuctl(cluster, "token", "list")
    assert table.returncode == 0 and "ALLOW-ROOT" in table.stdout and "dave" in table.stdout
    refused = gpuctl(cluster, "token", "list", token=cluster.alice)
    assert refused.returncode == 1 and "not an admin" in refused.stderr


def test_a_revoked_token_is_refused_from_then_on(cluster):
    erin = cluster.token_for("erin")
    assert cluster.api("GET", "/api/v1/whoami", token=erin)[0] == 200
    tokens = json.loads(gpuctl(cluster, "token", "list", "--json").stdout)["tokens"]
    erin_id = next(t["id"] for t in tokens if t["user"] == "erin")
    revoked = gpuctl(cluster, "token", "revoke", erin_id)
    assert revoked.returncode == 0, revoked.stderr
    assert f"revoked token {erin_id} of erin" in revoked.stdout
    assert cluster.api("GET", "/api/v1/whoami", token=erin)[0] == 401
    again = gpuctl(cluster, "token", "revoke", erin_id)
    assert again.returncode == 1 and "no token in use" in again.stderr


def test_revoking_every_token_of_a_user(cluster):
    tokens = [cluster.token_for("frank") for _ in range(3)]
    revoked = gpuctl(cluster, "token", "revoke", "--user", "frank", "--json")
    assert revoked.returncode == 0, revoked.stderr
    assert len(json.loads(revoked.stdout)["revoked"]) == 3
    assert all(cluster.api("GET", "/api/v1/whoami", token=t)[0] == 401 for t in tokens)
    assert gpuctl(cluster, "token", "revoke").returncode == 2


def test_the_last_admin_token_cannot_be_revoked(cluster):
    admins = [t for t in cluster.api("GET", "/api/v1/tokens")[1]["tokens"] if t["admin"]]
    assert len(admins) == 1
    status, body = cluster.api("POST", "/api/v1/tokens/revoke", {"id": admins[0]["id"]})
    assert status == 409 and "last admin token" in body["error"], body
    assert cluster.api("GET", "/api/v1/whoami")[0] == 200
    # The command the message suggests works as it is written (NAME filled in).
    hint = re.search(r"\((gpuctl token create [^)]*)\)", body["error"]).group(1)
    made = gpuctl(cluster, *hint.replace("NAME", "ops").split()[1:], "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["admin"] is True


def test_token_list_shows_the_date_each_token_was_made(cluster):
    listed = gpuctl(cluster, "token", "list")
    assert listed.returncode == 0, listed.stderr
    tokens = cluster.api("GET", "/api/v1/tokens")[1]["tokens"]
    rows = {row.split()[0]: row for row in listed.stdout.splitlines()[1:]}
    for token in tokens:
        made = time.strftime("%Y-%m-%dT%H:%M", time.localtime(token["created"]))
        assert made in rows[token["id"]], listed.stdout
    status, body = cluster.api("POST", "/api/v1/tokens/revoke", {"id": "zz"})
    assert status == 422, body


def test_a_revocation_survives_a_controller_restart(cluster):
    gina = cluster.token_for("gina")
    status, _ = cluster.api("POST", "/api/v1/tokens/revoke", {"user": "gina"})
    assert status == 200
    cluster.controller.stop()
    cluster.start_controller()
    assert cluster.api("GET", "/api/v1/whoami", token=gina)[0] == 401
    assert cluster.api("GET", "/api/v1/whoami", token=cluster.alice)[0] == 200


# ---------------------------------------------------------------- policy


@pytest.mark.parametrize("text", ["", "grace_period = 3\n"])
def test_a_reload_to_a_policy_without_projects_is_refused_and_the_old_one_stays(cluster, text):
    good = cluster.policy_file.read_text()
    cluster.policy_file.write_text(text)
    try:
        status, body = cluster.api("POST", "/api/v1/policy/reload")
        assert status == 422 and "no projects" in body["error"] and "the old one stays" in body["error"], body
    finally:
        cluster.policy_file.write_text(good)
    status, body = post(cluster, cluster.alice, project="alpha")
    assert status == 201, body


def test_a_controller_will_not_start_with_a_policy_without_projects(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text("")
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpud_main", "controller", "--init", "--listen",
                             "127.0.0.1:1", "--state-dir", str(tmp_path / "state"), "--policy", str(policy)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "projects: the policy has no projects" in result.stderr


def test_on_a_one_host_cluster_a_user_without_an_account_here_is_refused_at_submit():
    from gpud.controller.auth import Principal
    from gpud.controller.identity import refusal

    ghost = Principal("no-such-account-here")
    assert "has no account on this host" in refusal(ghost, local_node=True)
    assert refusal(ghost, local_node=False) is None   # the node that runs the job decides
    me = Principal(ME, allow_root=True)
    assert refusal(me, local_node=True) is None
