"""The controller's REST API against a real controller and node daemons on 127.0.0.1.

One cluster serves the whole module: a controller, node ``n1`` (label
role=main) that runs most jobs, and node ``d1`` (label role=drain) that only
the drain test uses. Jobs ask for a tenth of a CPU so the two-CPU nodes never
limit what these tests look at.
"""

from __future__ import annotations

import http.client
import json
import os
import stat
import time
import urllib.parse

import aiohttp
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from daemons import LiveCluster, wait_for

MAIN = {"role": "main"}
DRAIN = {"role": "drain"}
SMALL = {"cpus": 0.1, "memory_gib": 0.1}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    live = LiveCluster(tmp_path_factory.mktemp("api"))
    try:
        live.start_controller()
        live.start_node("n1", gpus=4, labels=MAIN)
        live.start_node("d1", gpus=2, labels=DRAIN)
        live.alice = live.token_for("alice")
        live.bob = live.token_for("bob")
        live.carol = live.token_for("carol")
        live.sentinel = submit(live, command=["true"], hold=True)
        yield live
    finally:
        live.close()


def submit(cluster: LiveCluster, token: str | None = "admin", **job) -> str:
    """Submit a small job to role=main nodes (unless the job says otherwise); returns its id."""
    for key, value in SMALL.items():
        job.setdefault(key, value)
    job.setdefault("constraint", MAIN)
    return cluster.submit(token=token, **job)


def post_job(cluster: LiveCluster, job: dict, token: str | None = "admin") -> tuple[int, dict]:
    """POST a job object with the test's workdir and project filled in unless given."""
    body = {"project": "alpha", "workdir": str(cluster.workdir), "command": ["true"], **job}
    return cluster.api("POST", "/api/v1/jobs", body, token=token)


def active_ids(cluster: LiveCluster) -> set[str]:
    status, body = cluster.api("GET", "/api/v1/jobs")
    assert status == 200, body
    return {job["id"] for job in body["jobs"]}


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


# ------------------------------------------------------------------- auth


def test_missing_or_unknown_token_is_401(cluster):
    for path in ("/api/v1/jobs", "/api/v1/whoami", "/api/v1/nodes"):
        status, body = cluster.api("GET", path, token=None)
        assert status == 401 and "error" in body, (path, status, body)
        status, body = cluster.api("GET", path, token="gpud_not-a-real-token")
        assert status == 401 and "error" in body, (path, status, body)
    status, body = cluster.api("POST", "/api/v1/jobs", {"project": "alpha"}, token=None)
    assert status == 401, body


def test_whoami_names_the_token_owner(cluster):
    assert cluster.api("GET", "/api/v1/whoami", token=cluster.alice) == (200, {"user": "alice", "admin": False})
    status, body = cluster.api("GET", "/api/v1/whoami")
    assert status == 200 and body["admin"] is True


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/api/v1/nodes/n1/drain", {"reason": "maintenance"}),
    ("POST", "/api/v1/nodes/n1/resume", None),
    ("POST", "/api/v1/policy/reload", None),
    ("POST", "/api/v1/tokens", {"user": "mallory", "admin": True}),
    ("GET", "/api/v1/state", None),
])
def test_admin_verbs_refuse_users_with_403(cluster, method, path, body):
    status, answer = cluster.api(method, path, body, token=cluster.alice)
    assert status == 403, (status, answer)
    assert "admin" in answer["error"]
    assert cluster.node_state("n1") == "up"


def test_admin_may_read_the_state(cluster):
    status, body = cluster.api("GET", "/api/v1/state")
    assert status == 200 and {"policy", "nodes", "jobs"} <= set(body)


def test_users_change_only_their_own_jobs(cluster):
    job = submit(cluster, token=cluster.alice, command=["true"], hold=True)
    for verb in ("cancel", "hold", "release"):
        status, body = cluster.api("POST", f"/api/v1/jobs/{job}/{verb}", token=cluster.bob)
        assert status == 403, (verb, status, body)
        assert "alice" in body["error"]
    assert cluster.job(job)["state"] == "PENDING"
    status, body = cluster.api("POST", f"/api/v1/jobs/{job}/cancel", token=cluster.alice)
    assert (status, body) == (200, {"ids": [job]})


def test_admin_may_cancel_and_hold_anyones_job(cluster):
    job = submit(cluster, token=cluster.alice, command=["true"], constraint={"pool": "nowhere"})
    assert cluster.api("POST", f"/api/v1/jobs/{job}/hold") == (200, {"ids": [job]})
    assert cluster.api("POST", f"/api/v1/jobs/{job}/release") == (200, {"ids": [job]})
    assert cluster.api("POST", f"/api/v1/jobs/{job}/cancel") == (200, {"ids": [job]})
    assert cluster.job(job)["state"] == "CANCELLED"


def test_project_users_list_is_enforced(cluster):
    status, body = post_job(cluster, {"project": "private", "hold": True}, token=cluster.alice)
    assert status == 403, body
    assert body["field"] == "project" and "alice" in body["error"]
    status, body = post_job(cluster, {"project": "private", "hold": True}, token=cluster.carol)
    assert status == 201, body
    cluster.api("POST", f"/api/v1/jobs/{body['ids'][0]}/cancel")


def test_cluster_key_opens_no_user_endpoint(cluster):
    key = (cluster.state_dir / "cluster.key").read_text().strip()
    for method, path in (("GET", "/api/v1/jobs"), ("GET", "/api/v1/whoami"), ("POST", "/api/v1/jobs"),
                         ("GET", "/api/v1/state")):
        status, body = cluster.api(method, path, {"project": "alpha"} if method == "POST" else None, token=key)
        assert status == 401, (path, status, body)


async def test_user_tokens_do_not_open_the_node_websocket(cluster):
    async with aiohttp.ClientSession() as session:
        for token in (cluster.alice, cluster.admin_token, None):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                async with session.ws_connect(cluster.url + "/api/v1/node/connect", headers=headers):
                    pass
            assert refused.value.status == 401
        key = (cluster.state_dir / "cluster.key").read_text().strip()
        async with session.ws_connect(cluster.url + "/api/v1/node/connect",
                                      headers={"Authorization": f"Bearer {key}"}) as ws:
            await ws.send_json({"type": "heartbeat", "tasks": []})
            answer = await ws.receive_json(timeout=5)
            assert answer["type"] == "error" and "register" in answer["error"]


def test_healthz_and_metrics_need_no_credentials(cluster):
    status, body = cluster.api("GET", "/healthz", token=None)
    assert status == 200 and body["ok"] is True
    status, body = cluster.api("GET", "/metrics", token=None)
    assert status == 200 and "gpud_jobs" in body


def test_admin_token_file_is_private(cluster):
    mode = stat.S_IMODE(os.stat(cluster.state_dir / "admin.token").st_mode)
    assert mode == 0o600, oct(mode)
    assert stat.S_IMODE(os.stat(cluster.state_dir / "cluster.key").st_mode) == 0o600


# -------------------------------------------------------------- bad input


def test_malformed_json_is_400(cluster):
    for raw in (b"{bad", b"", b"\xff\xfe\x00", b'{"project": "alpha",}', b"[" * 100_000):
        status, body = cluster.api("POST", "/api/v1/jobs", raw=raw)
        assert status == 400, (raw[:20], status, body)
        assert "JSON" in body["error"]


def test_a_job_that_is_not_an_object_is_400(cluster):
    for raw in (b"[]", b"42", b'"job"', b"null", b"true"):
        status, body = cluster.api("POST", "/api/v1/jobs", raw=raw)
        assert status == 400, (raw, status, body)
        assert "object" in body["error"]


BAD_JOBS = [
    ({"gpu": 1}, "gpu", "gpus"),
    ({"project": "nosuch"}, "project", "nosuch"),
    ({"gpus": 1.5}, "gpus", "1.5"),
    ({"gpus": 5}, "gpus", "largest node"),
    ({"gpu_memory_gib": 500}, "gpu_memory_gib", "largest GPU"),
    ({"cpus": -1}, "cpus", "at least 0"),
    ({"constraint": {"gpu": "h100"}}, "constraint", "the labels nodes have: role=drain, role=main"),
    ({"constraint": {"role": "main", "rack": "r9"}}, "constraint", "no node has role=main, rack=r9"),
    ({"memory_gib": -2}, "memory_gib", "above 0"),
    ({"tasks": 0}, "tasks", "between"),
    ({"min_tasks": 3, "tasks": 2}, "min_tasks", "between"),
    ({"array": "5-1"}, "array", "5-1"),
    ({"array": "a-b"}, "array", "a-b"),
    ({"array": "0-9%0"}, "array", "%"),
    ({"array": "0-1000000"}, "array", "at most"),
    ({"depends": ["afterwards:1"]}, "depends", "afterwards:1"),
    ({"depends": ["afterok:x"]}, "depends", "afterok:x"),
    ({"depends": ["afterok:999999"]}, "depends", "999999"),
    ({"workdir": "relative/dir"}, "workdir", "absolute"),
    ({"output": "../escape.out"}, "output", ".."),
    ({"output": "/etc/passwd"}, "output", "inside workdir"),
    ({"error": "logs/../../x"}, "error", ".."),
    ({"priority": "urgent"}, "priority", "urgent"),
    ({"pool": "nopool"}, "pool", "nopool"),
    ({"stop_signal": "BOOM"}, "stop_signal", "stop_signal"),
    ({"command": []}, "command", "empty"),
    ({"script": "#!/bin/sh\ntrue\n"}, "command", "exactly one"),
    ({"env": {"1BAD": "x"}}, "env", "1BAD"),
    ({"time_limit_s": 0}, "time_limit_s", "above 0"),
    ({"gpus": 0.5, "gpu_memory_gib": 10}, "gpu_memory_gib", "not both"),
]


@pytest.mark.parametrize("change, field, words", BAD_JOBS, ids=[f[1] + "-" + str(i) for i, f in enumerate(BAD_JOBS)])
def test_impossible_jobs_are_422_naming_the_field(cluster, change, field, words):
    status, body = post_job(cluster, change)
    assert status == 422, (change, status, body)
    assert body.get("field") == field, body
    assert words in body["error"], body


@pytest.mark.parametrize("change, field", [
    ({"gpus": "2"}, "gpus"),
    ({"cpus": True}, "cpus"),
    ({"command": "true"}, "command"),
    ({"command": ["true", 1]}, "command"),
    ({"env": ["A=1"]}, "env"),
    ({"hold": "yes"}, "hold"),
    ({"tasks": 1.0}, "tasks"),
    ({"project": 7}, "project"),
    ({"depends": "afterok:1"}, "depends"),
])
def test_wrong_types_are_400_naming_the_field(cluster, change, field):
    status, body = post_job(cluster, change)
    assert status == 400, (change, status, body)
    assert body.get("field") == field, body


def test_numbers_too_large_for_a_float_are_refused_not_crashed(cluster):
    for field in ("gpus", "cpus", "memory_gib", "time_limit_s", "gpu_memory_gib"):
        status, body = cluster.api("POST", "/api/v1/jobs",
                                   raw=('{"project": "alpha", "workdir": "/tmp", "command": ["true"], '
                                        f'"{field}": 1{"0" * 400}}}').encode())
        assert status in (400, 422), (field, status, body)
        assert body.get("field") == field, body
    for literal in ("NaN", "Infinity", "-Infinity"):
        status, body = cluster.api("POST", "/api/v1/jobs",
                                   raw=('{"project": "alpha", "workdir": "/tmp", "command": ["true"], '
                                        f'"cpus": {literal}}}').encode())
        assert status == 400 and body["field"] == "cpus", (literal, status, body)


def test_a_batch_with_one_bad_job_is_refused_whole(cluster):
    before = active_ids(cluster)
    good = {"project": "alpha", "workdir": str(cluster.workdir), "command": ["true"], "hold": True}
    status, body = cluster.api("POST", "/api/v1/jobs/batch",
                               {"jobs": [good, good, {**good, "gpus": 1.5}, good]})
    assert status == 422, body
    assert body["index"] == 2 and body["field"] == "gpus"
    status, body = cluster.api("POST", "/api/v1/jobs/batch", {"jobs": [good, {**good, "bogus": 1}]})
    assert status == 422 and body["index"] == 1 and body["field"] == "bogus", body
    assert active_ids(cluster) == before
    for bad in ([good], {"jobs": good}, {"jobs": [good], "extra": 1}):
        status, body = cluster.api("POST", "/api/v1/jobs/batch", bad)
        assert status == 400, (bad, status, body)
    status, body = cluster.api("POST", "/api/v1/jobs/batch", {"jobs": []})
    assert status == 422, body
    status, body = cluster.api("POST", "/api/v1/jobs/batch", {"jobs": [good, good]})
    assert status == 201 and len(body["ids"]) == 2, body
    for job in body["ids"]:
        cluster.api("POST", f"/api/v1/jobs/{job}/cancel")


@pytest.mark.parametrize("method, path, status", [
    ("GET", "/api/v1/nothing", 404),
    ("GET", "/api/v2/jobs", 404),
    ("GET", "/", 404),
    ("GET", "/api/v1/jobs/999999", 404),
    ("GET", "/api/v1/jobs/not-an-id", 404),
    ("POST", "/api/v1/jobs/999999/cancel", 404),
    ("POST", "/api/v1/nodes/nosuch/drain", 404),
    ("DELETE", "/api/v1/jobs", 405),
    ("GET", "/api/v1/jobs?state=DONE", 422),
    ("GET", "/api/v1/history?limit=many", 400),
])
def test_unknown_things_are_json_errors(cluster, method, path, status):
    got, body = cluster.api(method, path)
    assert got == status, (method, path, got, body)
    assert isinstance(body, dict) and body["error"], body


@pytest.mark.parametrize("change, field", [
    ({"env": {"A": "\ud800"}}, "env"),
    ({"command": ["echo", "\udc80"]}, "command"),
    ({"name": "\ud83d"}, "name"),
])
def test_a_lone_surrogate_is_400_naming_the_field_and_the_next_job_is_stored(cluster, change, field):
    raw = json.dumps({"project": "alpha", "workdir": str(cluster.workdir), "command": ["true"], "hold": True,
                      **change}).encode()  # JSON escapes such as "\ud800", as a client may send them
    status, body = cluster.api("POST", "/api/v1/jobs", raw=raw)
    assert status == 400 and body["field"] == field and "surrogate" in body["error"], body
    job_id = submit(cluster, command=["true"], hold=True)
    assert cluster.job(job_id)["state"] == "PENDING"
    cluster.api("POST", f"/api/v1/jobs/{job_id}/cancel")


def test_bad_input_lost_nothing(cluster):
    assert cluster.controller.alive()
    assert cluster.job(cluster.sentinel)["state"] == "PENDING"
    assert cluster.api("GET", "/healthz", token=None)[0] == 200


# ------------------------------------------------------------------ arrays


def test_array_limit_holds_while_elements_run(cluster):
    status, body = post_job(cluster, {"command": sh("sleep 0.6"), "array": "0-5%2", **SMALL,
                                      "constraint": MAIN})
    assert status == 201, body
    array_id = body["array_id"]
    assert body["ids"] == [f"{array_id}_{i}" for i in range(6)]
    most = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, listing = cluster.api("GET", "/api/v1/jobs?all=1")
        states = [j["state"] for j in listing["jobs"] if j["array_id"] == array_id]
        running = sum(1 for s in states if s == "RUNNING")
        most = max(most, running)
        if all(cluster.job(i)["state"] == "COMPLETED" for i in body["ids"]):
            break
        time.sleep(0.05)
    assert 1 <= most <= 2, most
    for element in body["ids"]:
        job = cluster.job(element)
        assert job["state"] == "COMPLETED", job
        assert job["array_id"] == array_id and job["array_limit"] == 2
    assert sorted(cluster.job(i)["array_index"] for i in body["ids"]) == list(range(6))


def test_cancelling_the_array_id_cancels_every_element(cluster):
    status, body = post_job(cluster, {"command": sh("sleep 30"), "array": "0-4", **SMALL, "constraint": MAIN})
    assert status == 201, body
    cluster.wait_state(body["ids"][0], "RUNNING")
    status, answer = cluster.api("POST", f"/api/v1/jobs/{body['array_id']}/cancel")
    assert status == 200 and sorted(answer["ids"]) == sorted(body["ids"]), answer
    for element in body["ids"]:
        assert cluster.job(element)["state"] == "CANCELLED"


# ------------------------------------------------------------ dependencies


def test_afterok_runs_after_success(cluster):
    first = submit(cluster, command=sh("sleep 1"))
    second = submit(cluster, command=["true"], depends=[f"afterok:{first}"])
    job = cluster.job(second)
    assert job["state"] == "PENDING" and first in job["reason"], job
    done = cluster.wait_state(first, "COMPLETED")
    after = cluster.wait_state(second, "COMPLETED")
    assert after["started"] >= done["ended"]


def test_afterok_on_a_failed_job_never_starts(cluster):
    first = submit(cluster, command=sh("exit 3"))
    second = submit(cluster, command=["true"], depends=[f"afterok:{first}"])
    assert cluster.wait_state(first, "FAILED")["exit_code"] == 3
    wait_for(lambda: "never" in cluster.job(second)["reason"], "the dependent's reason to say it can never start")
    time.sleep(1.5)
    job = cluster.job(second)
    assert job["state"] == "PENDING" and first in job["reason"], job
    cluster.api("POST", f"/api/v1/jobs/{second}/cancel")


def test_afterany_and_afternotok_run_after_a_failure(cluster):
    first = submit(cluster, command=sh("sleep 0.5; exit 1"))
    any_ = submit(cluster, command=["true"], depends=[f"afterany:{first}"])
    notok = submit(cluster, command=["true"], depends=[f"afternotok:{first}"])
    cluster.wait_state(first, "FAILED")
    cluster.wait_state(any_, "COMPLETED")
    cluster.wait_state(notok, "COMPLETED")


def test_afternotok_on_a_success_never_starts_and_finished_targets_count(cluster):
    first = submit(cluster, command=["true"])
    cluster.wait_state(first, "COMPLETED")
    notok = submit(cluster, command=["true"], depends=[f"afternotok:{first}"])
    ok = submit(cluster, command=["true"], depends=[f"afterok:{first}"])
    cluster.wait_state(ok, "COMPLETED")
    job = cluster.job(notok)
    assert job["state"] == "PENDING" and "never" in job["reason"], job
    cluster.api("POST", f"/api/v1/jobs/{notok}/cancel")


# ------------------------------------------------------------ hold/release


def test_hold_and_release(cluster):
    held = submit(cluster, command=["true"], hold=True)
    time.sleep(1.2)
    job = cluster.job(held)
    assert job["state"] == "PENDING" and "held" in job["reason"], job
    assert cluster.api("POST", f"/api/v1/jobs/{held}/release") == (200, {"ids": [held]})
    cluster.wait_state(held, "COMPLETED")

    waiting = submit(cluster, command=["true"], constraint={"pool": "nowhere"})
    assert cluster.api("POST", f"/api/v1/jobs/{waiting}/hold") == (200, {"ids": [waiting]})
    assert "held" in cluster.job(waiting)["reason"]
    status, body = cluster.api("POST", f"/api/v1/jobs/{waiting}/hold")
    assert status == 409, body
    assert cluster.api("POST", f"/api/v1/jobs/{waiting}/release") == (200, {"ids": [waiting]})
    cluster.api("POST", f"/api/v1/jobs/{waiting}/cancel")

    running = submit(cluster, command=sh("sleep 30"))
    cluster.wait_state(running, "RUNNING")
    status, body = cluster.api("POST", f"/api/v1/jobs/{running}/hold")
    assert status == 409 and "running" in body["error"], body
    cluster.api("POST", f"/api/v1/jobs/{running}/cancel")


# ------------------------------------------------------------------- drain


def node(cluster: LiveCluster, name: str) -> dict:
    status, body = cluster.api("GET", "/api/v1/nodes")
    return next(n for n in body["nodes"] if n["name"] == name)


def test_drain_lets_running_jobs_finish_and_resume_starts_pending_ones(cluster):
    running = submit(cluster, command=sh("sleep 2"), gpus=1, constraint=DRAIN)
    cluster.wait_state(running, "RUNNING")
    status, body = cluster.api("POST", "/api/v1/nodes/d1/drain", {"reason": "disk swap"})
    assert status == 200 and body["state"] == "draining", body
    assert node(cluster, "d1")["reason"] == "disk swap"
    pending = submit(cluster, command=["true"], gpus=1, constraint=DRAIN)
    cluster.wait_state(running, "COMPLETED")
    wait_for(lambda: node(cluster, "d1")["state"] == "drained", "d1 to show drained")
    time.sleep(1.2)
    assert cluster.job(pending)["state"] == "PENDING"
    status, body = cluster.api("POST", "/api/v1/nodes/d1/resume")
    assert status == 200 and body["state"] == "up", body
    cluster.wait_state(pending, "RUNNING", "COMPLETED")


def test_drain_needs_a_reason(cluster):
    status, body = cluster.api("POST", "/api/v1/nodes/d1/drain", {})
    assert status == 422 and body["field"] == "reason", body
    assert node(cluster, "d1")["state"] == "up"


def test_a_node_drained_under_a_cpu_only_job_shows_draining(cluster):
    running = submit(cluster, command=sh("sleep 3"), constraint=DRAIN)
    cluster.wait_state(running, "RUNNING")
    try:
        status, body = cluster.api("POST", "/api/v1/nodes/d1/drain", {"reason": "cpu job test"})
        assert status == 200
        assert node(cluster, "d1")["state"] == "draining", "a CPU-only job still runs on d1"
    finally:
        cluster.api("POST", f"/api/v1/jobs/{running}/cancel")
        cluster.api("POST", "/api/v1/nodes/d1/resume")


# ------------------------------------------------------------------ policy


def test_policy_reload_keeps_the_old_policy_on_error_and_takes_a_good_one(cluster):
    original = cluster.policy_file.read_text()
    try:
        cluster.policy_file.write_text(original + "\n[[projects]]\nname = \"gamma\"\ngpu_quota = [oops\n")
        status, body = cluster.api("POST", "/api/v1/policy/reload")
        assert status == 422, body
        assert "old one stays" in body["error"] and "policy.toml" in body["error"]
        cluster.policy_file.write_text(original + "\n[[projects]]\nname = \"gamma\"\ngpu_quota = -4\n")
        status, body = cluster.api("POST", "/api/v1/policy/reload")
        assert status == 422, body
        status, body = post_job(cluster, {"project": "gamma"})
        assert status == 422 and body["field"] == "project", body
        submit(cluster, command=["true"], project="alpha", hold=True)

        cluster.policy_file.write_text(original + "\n[[projects]]\nname = \"gamma\"\ngpu_quota = 1\n")
        status, body = cluster.api("POST", "/api/v1/policy/reload")
        assert status == 200 and body["ok"] is True, body
        job = submit(cluster, command=["true"], project="gamma")
        cluster.wait_state(job, "COMPLETED")
        status, body = cluster.api("GET", "/api/v1/projects")
        assert "gamma" in {q["name"] for q in body["queues"]}
    finally:
        cluster.policy_file.write_text(original + "\n[[projects]]\nname = \"gamma\"\ngpu_quota = 1\n")


def test_output_to_dev_null_and_no_cpu_are_accepted(cluster):
    job = submit(cluster, command=sh("echo gone; echo gone >&2"), output="/dev/null", error="/dev/null", cpus=0)
    done = cluster.wait_state(job, "COMPLETED", "FAILED")
    assert (done["state"], done["cpus"], done["output"]) == ("COMPLETED", 0, "/dev/null")
    status, body = cluster.api("GET", f"/api/v1/jobs/{job}/logs")
    assert status == 409 and "/dev/null" in body["error"], body
    assert not list(cluster.workdir.glob(f"*{job}*"))


def test_why_names_the_labels_no_node_has_as_people_write_them(cluster):
    job = submit(cluster, command=["true"], constraint={"role": "main", "pool": "elsewhere"})
    try:
        wait_for(lambda: cluster.api("GET", f"/api/v1/jobs/{job}/why")[1]["blockers"], "why to name a blocker")
        blockers = cluster.api("GET", f"/api/v1/jobs/{job}/why")[1]["blockers"]
        assert any("has role=main, pool=elsewhere" in b["message"] for b in blockers), blockers
        assert not any("{" in b["message"] for b in blockers), blockers
    finally:
        cluster.api("POST", f"/api/v1/jobs/{job}/cancel")


def test_reload_that_removes_a_project_with_jobs_says_what_becomes_of_them(cluster):
    original = cluster.policy_file.read_text()
    with_delta = original + '\n[[projects]]\nname = "delta"\ngpu_quota = 1\n'
    try:
        cluster.policy_file.write_text(with_delta)
        assert cluster.api("POST", "/api/v1/policy/reload")[0] == 200
        running = submit(cluster, command=sh("sleep 30"), project="delta", gpus=1)
        cluster.wait_state(running, "RUNNING")
        waiting = submit(cluster, command=["true"], project="delta", hold=True)
        cluster.policy_file.write_text(original)
        status, body = cluster.api("POST", "/api/v1/policy/reload")
        assert status == 200 and body["removed_projects"] == [{"project": "delta", "running": 1, "pending": 1}]
        assert cluster.api("POST", f"/api/v1/jobs/{waiting}/release")[0] == 200
        wait_for(lambda: "not in the policy" in (cluster.job(waiting).get("reason") or ""), "the waiting job's reason")
        assert cluster.job(running)["state"] == "RUNNING"
    finally:
        for job in (locals().get("running"), locals().get("waiting")):
            if job:
                cluster.api("POST", f"/api/v1/jobs/{job}/cancel")
        cluster.policy_file.write_text(original)
        cluster.api("POST", "/api/v1/policy/reload")


# --------------------------------------------------------- reads and logs


def test_listing_all_jobs_and_history_with_gpu_hours_and_exit_codes(cluster):
    good = submit(cluster, command=sh("sleep 0.5"), gpus=1, project="beta")
    bad = submit(cluster, command=sh("sleep 0.5; exit 7"), gpus=1, project="beta")
    cluster.wait_state(good, "COMPLETED")
    cluster.wait_state(bad, "FAILED")
    status, body = cluster.api("GET", "/api/v1/jobs")
    assert good not in {j["id"] for j in body["jobs"]}
    status, body = cluster.api("GET", "/api/v1/jobs?all=1")
    listed = {j["id"]: j for j in body["jobs"]}
    assert cluster.sentinel in listed
    assert listed.get(good, {}).get("state") == "COMPLETED", "all=1 lists recently finished jobs"
    status, body = cluster.api("GET", "/api/v1/history?project=beta&limit=50")
    assert status == 200, body
    ended = {j["id"]: j for j in body["jobs"]}
    assert ended[good]["state"] == "COMPLETED" and ended[good]["exit_code"] == 0
    assert ended[bad]["state"] == "FAILED" and ended[bad]["exit_code"] == 7
    for job_id in (good, bad):
        assert 0 < ended[job_id]["gpu_hours"] < 0.01, ended[job_id]
        assert ended[job_id]["nodes"] == ["n1"]
    order = [j["ended"] for j in body["jobs"]]
    assert order == sorted(order, reverse=True)
    status, body = cluster.api("GET", "/api/v1/history?user=nobody")
    assert body["jobs"] == []


def test_projects_count_a_running_job(cluster):
    job = submit(cluster, command=sh("sleep 30"), gpus=1, project="beta")
    try:
        cluster.wait_state(job, "RUNNING")

        def beta():
            status, body = cluster.api("GET", "/api/v1/projects")
            queue = next((q for q in body["queues"] if q["name"] == "beta"), None)
            return queue if queue and queue["running_jobs"] == 1 and queue["allocated"]["gpu"] == 1 else None
        queue = wait_for(beta, "projects to count the running job")
        assert queue["quota"]["gpu"] == 2 and queue["department"] == "research"
        assert queue["fair_share"]["gpu"] >= 1 and queue["demand"]["gpu"] >= 1
        assert queue["allocated"]["cpu"] == pytest.approx(0.1)
        status, body = cluster.api("GET", "/api/v1/projects")
        research = next(q for q in body["queues"] if q["name"] == "research")
        assert research["kind"] == "department" and research["allocated"]["gpu"] >= 1
    finally:
        cluster.api("POST", f"/api/v1/jobs/{job}/cancel")


def test_metrics_name_every_family(cluster):
    status, text = cluster.api("GET", "/metrics", token=None)
    assert status == 200
    for family in ("gpud_jobs", "gpud_gpus_allocated", "gpud_queue_fair_share_gpus",
                   "gpud_scheduling_cycle_seconds", "gpud_api_request_seconds"):
        assert f"# TYPE {family} " in text, family
    assert 'gpud_queue_fair_share_gpus{' in text
    assert "gpud_scheduling_cycle_seconds_count" in text
    assert 'route="/api/v1/jobs"' in text


def test_logs_return_the_jobs_output(cluster):
    job = submit(cluster, command=sh("echo out-line; echo err-line >&2"), error="gpud-%j.err")
    cluster.wait_state(job, "COMPLETED")
    assert cluster.api("GET", f"/api/v1/jobs/{job}/logs") == (200, "out-line\n")
    assert cluster.api("GET", f"/api/v1/jobs/{job}/logs?stream=err") == (200, "err-line\n")
    assert cluster.api("GET", f"/api/v1/jobs/{job}/logs?offset=4") == (200, "line\n")
    assert (cluster.workdir / f"gpud-{job}.out").read_text() == "out-line\n"
    status, body = cluster.api("GET", f"/api/v1/jobs/{job}/logs", token=cluster.bob)
    assert status == 403, body


# --------------------------------------------------------- random payloads

FIELD_NAMES = ["project", "command", "script", "name", "workdir", "env", "gpus", "gpu_memory_gib", "tasks",
               "min_tasks", "cpus", "memory_gib", "priority", "constraint", "pool", "time_limit_s", "array",
               "depends", "hold", "requeue", "stop_signal", "output", "error"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-3, 10),
                    st.floats(allow_nan=False, allow_infinity=False), st.floats(0, 2), st.text(max_size=20),
                    st.sampled_from(["alpha", "beta", "private", "/tmp", "relative", "0-3%2", "afterok:1",
                                     "afterok:1_2", "train", "TERM", "../x", "gpud-%j.out", "1,3,5-7"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)
# Commands and scripts that may be accepted and run are harmless by construction.
safe_command = st.lists(st.sampled_from(["true", "false", "/nonexistent/x"]), min_size=0, max_size=3)
safe_script = st.text(max_size=30).map(lambda text: "#!/bin/sh\nexit 0\n" + text)


def _fuzz_job(base: dict, extra: dict) -> dict:
    job = {k: v for k, v in base.items() if k not in ("command", "script")}
    job.update(extra)
    if isinstance(job.get("constraint"), dict) or "constraint" not in job:
        job["constraint"] = {"pool": "fuzz-nowhere"}   # an accepted job waits and never runs
    return job


job_payloads = st.builds(
    _fuzz_job,
    st.dictionaries(st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=10)), values, max_size=10),
    st.fixed_dictionaries({}, optional={"command": st.one_of(safe_command, values), "script": safe_script}))
VALID = {"project": "alpha", "workdir": "/tmp", "command": ["true"], "cpus": 0.1, "memory_gib": 0.1}
near_valid_payloads = st.builds(
    _fuzz_job,
    st.dictionaries(st.sampled_from(FIELD_NAMES), values, max_size=2).map(lambda change: {**VALID, **change}),
    st.one_of(st.just({"command": ["true"]}), st.fixed_dictionaries({"command": st.one_of(safe_command, values)}),
              st.fixed_dictionaries({"script": safe_script})))
bodies = st.one_of(
    job_payloads.map(lambda job: json.dumps(job).encode()),
    near_valid_payloads.map(lambda job: json.dumps(job).encode()),
    st.lists(near_valid_payloads, min_size=1, max_size=3).map(lambda jobs: json.dumps({"jobs": jobs}).encode()),
    st.lists(job_payloads, max_size=3).map(lambda jobs: json.dumps({"jobs": jobs}).encode()),
    values.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=64),
)


class Http:
    """One keep-alive connection for the fuzzing, reopened when the server closes it."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)

    def call(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes, str]:
        for attempt in range(2):
            try:
                self.conn.request(method, path, body=body,
                                  headers={"Authorization": f"Bearer {self.token}",
                                           "Content-Type": "application/json"})
                answer = self.conn.getresponse()
                return answer.status, answer.read(), answer.getheader("Content-Type", "")
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
                if attempt:
                    raise
        raise AssertionError("unreachable")


def check_answer(status: int, payload: bytes, content_type: str, what: str) -> None:
    event(f"status {status}")
    assert status < 500, (what, status, payload[:300])
    if status >= 400:
        assert content_type.startswith("application/json"), (what, status, content_type, payload[:200])
        assert isinstance(json.loads(payload).get("error"), str), (what, payload[:200])


@pytest.fixture(scope="module")
def fuzz_http(cluster):
    http_ = Http(cluster.port, cluster.token_for("fuzzer"))
    yield http_
    http_.conn.close()
    status, body = cluster.api("GET", "/api/v1/jobs?user=fuzzer")
    for job in body["jobs"]:
        cluster.api("POST", f"/api/v1/jobs/{job['id']}/cancel")


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, batch=st.booleans())
def test_random_submit_payloads_never_get_a_5xx(cluster, fuzz_http, body, batch):
    path = "/api/v1/jobs/batch" if batch else "/api/v1/jobs"
    status, payload, content_type = fuzz_http.call("POST", path, body)
    check_answer(status, payload, content_type, (path, body[:200]))


ids = st.one_of(st.sampled_from(["1", "1_0", "2", "0", "99999999999999999999", "n1", "d1", ""]), st.text(max_size=8))
TEMPLATES = ["/api/v1/jobs/{}", "/api/v1/jobs/{}/why", "/api/v1/jobs/{}/logs", "/api/v1/jobs/{}/cancel",
             "/api/v1/jobs/{}/hold", "/api/v1/jobs/{}/release", "/api/v1/jobs/{}/{}", "/api/v1/nodes/{}/drain",
             "/api/v1/nodes/{}/resume", "/api/v1/{}", "/api/v1/{}/{}", "/{}", "/api/v1/jobs", "/api/v1/jobs/batch",
             "/api/v1/history", "/api/v1/nodes", "/api/v1/projects", "/api/v1/policy/reload", "/api/v1/tokens",
             "/api/v1/state", "/api/v1/whoami", "/api/v1/node/connect", "/metrics", "/healthz", "/api/v1/usage", "/api/v1/report"]
paths = st.builds(lambda template, fill: template.format(*(urllib.parse.quote(p, safe="") for p in fill)),
                  st.sampled_from(TEMPLATES), st.lists(ids, min_size=2, max_size=2))
queries = st.dictionaries(st.sampled_from(["state", "all", "user", "project", "since", "limit", "offset",
                                           "task", "stream", "follow", "by", "until", "pool"]),
                          st.one_of(st.text(max_size=6), st.sampled_from(["1", "-1", "nan", "inf", "err", "RUNNING",
                                                                          "1e999", "99999999999999999999"])),
                          max_size=3)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
       path=paths, query=queries,
       body=st.one_of(st.none(), st.just("{}"), st.just('{"reason": "x"}'), values.map(json.dumps)))
def test_random_paths_and_verbs_never_get_a_5xx(cluster, fuzz_http, method, path, query, body):
    if query:
        path += "?" + urllib.parse.urlencode(query)
    status, payload, content_type = fuzz_http.call(method, path, body.encode() if body is not None else None)
    if method == "HEAD":
        assert status < 500, (path, status)
        return
    check_answer(status, payload, content_type, (method, path, body))


def test_the_controller_survived_everything(cluster):
    assert cluster.controller.alive()
    assert cluster.job(cluster.sentinel)["state"] == "PENDING"
    log = (cluster.root / "controller.log").read_text(errors="replace")
    assert "internal error" not in log and "Traceback" not in log, log[-3000:]
    job = submit(cluster, command=["true"])
    cluster.wait_state(job, "COMPLETED")
