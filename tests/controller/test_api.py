"""The controller's REST API in process (aiohttp's test client): who may do what, and bad input refused.

One controller serves the module, with nodes ``n1`` (4 GPUs, label
role=main) and ``d1`` (2 GPUs, role=drain) registered as records: no daemon
and no job process. No cycle runs, so every accepted job stays pending.
"""

from __future__ import annotations

import json
import os
import stat

import aiohttp
import pytest
import pytest_asyncio

from in_process import InProcessController, close, open_controller

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAIN = {"role": "main"}
DRAIN = {"role": "drain"}
SMALL = {"cpus": 0.1, "memory_gib": 0.1}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api(tmp_path_factory):
    controller = await open_controller(tmp_path_factory.mktemp("api"))
    try:
        controller.add_node("n1", gpus=4, labels=MAIN, cpus=2)
        controller.add_node("d1", gpus=2, labels=DRAIN, cpus=2)
        for user in ("alice", "bob", "carol"):
            await controller.token_for(user)
        controller.sentinel = await submit(controller, command=["true"], hold=True)
        yield controller
    finally:
        await close(controller)


async def submit(api: InProcessController, user: str = "admin", **job) -> str:
    """Submit a small job to role=main nodes (unless the job says otherwise); returns its id."""
    for key, value in SMALL.items():
        job.setdefault(key, value)
    job.setdefault("constraint", MAIN)
    return await api.submit(user, **job)


async def post_job(api: InProcessController, job: dict, user: str = "admin") -> tuple[int, dict]:
    """POST a job object with the test's workdir and project filled in unless given."""
    body = {"project": "alpha", "workdir": str(api.workdir), "command": ["true"], **job}
    return await api.api("POST", "/api/v1/jobs", body, user=user)


async def active_ids(api: InProcessController) -> set[str]:
    status, body = await api.api("GET", "/api/v1/jobs")
    assert status == 200, body
    return {job["id"] for job in body["jobs"]}


# ------------------------------------------------------------------- auth


async def test_missing_or_unknown_token_is_401(api):
    for path in ("/api/v1/jobs", "/api/v1/whoami", "/api/v1/nodes"):
        status, body = await api.api("GET", path, user=None)
        assert status == 401 and "error" in body, (path, status, body)
        status, body = await api.api("GET", path, user="gpud_not-a-real-token")
        assert status == 401 and "error" in body, (path, status, body)
    status, body = await api.api("POST", "/api/v1/jobs", {"project": "alpha"}, user=None)
    assert status == 401, body


async def test_whoami_names_the_token_owner(api):
    assert await api.api("GET", "/api/v1/whoami", user="alice") == (200, {"user": "alice", "admin": False})
    status, body = await api.api("GET", "/api/v1/whoami")
    assert status == 200 and body["admin"] is True


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/api/v1/nodes/n1/drain", {"reason": "maintenance"}),
    ("POST", "/api/v1/nodes/n1/resume", None),
    ("POST", "/api/v1/policy/reload", None),
    ("POST", "/api/v1/tokens", {"user": "mallory", "admin": True}),
    ("GET", "/api/v1/state", None),
])
async def test_admin_verbs_refuse_users_with_403(api, method, path, body):
    status, answer = await api.api(method, path, body, user="alice")
    assert status == 403, (status, answer)
    assert "admin" in answer["error"]
    assert api.ctrl.cluster.nodes["n1"].state == "up"


async def test_admin_may_read_the_state(api):
    status, body = await api.api("GET", "/api/v1/state")
    assert status == 200 and {"policy", "nodes", "jobs"} <= set(body)


async def test_users_change_only_their_own_jobs(api):
    job = await submit(api, user="alice", command=["true"], hold=True)
    for verb in ("cancel", "hold", "release", "requeue"):
        status, body = await api.api("POST", f"/api/v1/jobs/{job}/{verb}", user="bob")
        assert status == 403, (verb, status, body)
        assert "alice" in body["error"]
    assert (await api.job(job))["state"] == "PENDING"
    status, body = await api.api("POST", f"/api/v1/jobs/{job}/cancel", user="alice")
    assert (status, body) == (200, {"ids": [job]})


async def test_admin_may_cancel_and_hold_anyones_job(api):
    job = await submit(api, user="alice", command=["true"], constraint={"pool": "nowhere"})
    assert await api.api("POST", f"/api/v1/jobs/{job}/hold") == (200, {"ids": [job]})
    assert await api.api("POST", f"/api/v1/jobs/{job}/release") == (200, {"ids": [job]})
    assert await api.api("POST", f"/api/v1/jobs/{job}/cancel") == (200, {"ids": [job]})
    assert (await api.job(job))["state"] == "CANCELLED"


async def test_project_users_list_is_enforced(api):
    status, body = await post_job(api, {"project": "private", "hold": True}, user="alice")
    assert status == 403, body
    assert body["field"] == "project" and "alice" in body["error"]
    status, body = await post_job(api, {"project": "private", "hold": True}, user="carol")
    assert status == 201, body
    await api.api("POST", f"/api/v1/jobs/{body['ids'][0]}/cancel")


async def test_cluster_key_opens_no_user_endpoint(api):
    key = (api.state_dir / "cluster.key").read_text().strip()
    for method, path in (("GET", "/api/v1/jobs"), ("GET", "/api/v1/whoami"), ("POST", "/api/v1/jobs"),
                         ("GET", "/api/v1/state")):
        status, body = await api.api(method, path, {"project": "alpha"} if method == "POST" else None, user=key)
        assert status == 401, (path, status, body)


async def test_user_tokens_do_not_open_the_node_websocket(api):
    async with aiohttp.ClientSession() as session:
        for token in (api.tokens["alice"], api.tokens["admin"], None):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                async with session.ws_connect(api.client.make_url("/api/v1/node/connect"), headers=headers):
                    pass
            assert refused.value.status == 401
        key = (api.state_dir / "cluster.key").read_text().strip()
        async with session.ws_connect(api.client.make_url("/api/v1/node/connect"),
                                      headers={"Authorization": f"Bearer {key}"}) as ws:
            await ws.send_json({"type": "heartbeat", "tasks": []})
            answer = await ws.receive_json(timeout=5)
            assert answer["type"] == "error" and "register" in answer["error"]


async def test_healthz_and_metrics_need_no_credentials(api):
    status, body = await api.api("GET", "/healthz", user=None)
    assert status == 200 and body["ok"] is True
    status, body = await api.api("GET", "/metrics", user=None)
    assert status == 200 and "gpud_jobs" in body


async def test_admin_token_file_is_private(api):
    mode = stat.S_IMODE(os.stat(api.state_dir / "admin.token").st_mode)
    assert mode == 0o600, oct(mode)
    assert stat.S_IMODE(os.stat(api.state_dir / "cluster.key").st_mode) == 0o600


# -------------------------------------------------------------- bad input


async def test_malformed_json_is_400(api):
    for raw in (b"{bad", b"", b"\xff\xfe\x00", b'{"project": "alpha",}', b"[" * 100_000):
        status, body = await api.api("POST", "/api/v1/jobs", raw=raw)
        assert status == 400, (raw[:20], status, body)
        assert "JSON" in body["error"]


async def test_a_job_that_is_not_an_object_is_400(api):
    for raw in (b"[]", b"42", b'"job"', b"null", b"true"):
        status, body = await api.api("POST", "/api/v1/jobs", raw=raw)
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
async def test_impossible_jobs_are_422_naming_the_field(api, change, field, words):
    status, body = await post_job(api, change)
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
async def test_wrong_types_are_400_naming_the_field(api, change, field):
    status, body = await post_job(api, change)
    assert status == 400, (change, status, body)
    assert body.get("field") == field, body


async def test_numbers_too_large_for_a_float_are_refused_not_crashed(api):
    for field in ("gpus", "cpus", "memory_gib", "time_limit_s", "gpu_memory_gib"):
        status, body = await api.api("POST", "/api/v1/jobs",
                                   raw=('{"project": "alpha", "workdir": "/tmp", "command": ["true"], '
                                        f'"{field}": 1{"0" * 400}}}').encode())
        assert status in (400, 422), (field, status, body)
        assert body.get("field") == field, body
    for literal in ("NaN", "Infinity", "-Infinity"):
        status, body = await api.api("POST", "/api/v1/jobs",
                                   raw=('{"project": "alpha", "workdir": "/tmp", "command": ["true"], '
                                        f'"cpus": {literal}}}').encode())
        assert status == 400 and body["field"] == "cpus", (literal, status, body)


async def test_a_batch_with_one_bad_job_is_refused_whole(api):
    before = await active_ids(api)
    good = {"project": "alpha", "workdir": str(api.workdir), "command": ["true"], "hold": True}
    status, body = await api.api("POST", "/api/v1/jobs/batch",
                               {"jobs": [good, good, {**good, "gpus": 1.5}, good]})
    assert status == 422, body
    assert body["index"] == 2 and body["field"] == "gpus"
    status, body = await api.api("POST", "/api/v1/jobs/batch", {"jobs": [good, {**good, "bogus": 1}]})
    assert status == 422 and body["index"] == 1 and body["field"] == "bogus", body
    assert await active_ids(api) == before
    for bad in ([good], {"jobs": good}, {"jobs": [good], "extra": 1}):
        status, body = await api.api("POST", "/api/v1/jobs/batch", bad)
        assert status == 400, (bad, status, body)
    status, body = await api.api("POST", "/api/v1/jobs/batch", {"jobs": []})
    assert status == 422, body
    status, body = await api.api("POST", "/api/v1/jobs/batch", {"jobs": [good, good]})
    assert status == 201 and len(body["ids"]) == 2, body
    for job in body["ids"]:
        await api.api("POST", f"/api/v1/jobs/{job}/cancel")


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
async def test_unknown_things_are_json_errors(api, method, path, status):
    got, body = await api.api(method, path)
    assert got == status, (method, path, got, body)
    assert isinstance(body, dict) and body["error"], body


@pytest.mark.parametrize("change, field", [
    ({"env": {"A": "\ud800"}}, "env"),
    ({"command": ["echo", "\udc80"]}, "command"),
    ({"name": "\ud83d"}, "name"),
])
async def test_a_lone_surrogate_is_400_naming_the_field_and_the_next_job_is_stored(api, change, field):
    raw = json.dumps({"project": "alpha", "workdir": str(api.workdir), "command": ["true"], "hold": True,
                      **change}).encode()  # JSON escapes such as "\ud800", as a client may send them
    status, body = await api.api("POST", "/api/v1/jobs", raw=raw)
    assert status == 400 and body["field"] == field and "surrogate" in body["error"], body
    job_id = await submit(api, command=["true"], hold=True)
    assert (await api.job(job_id))["state"] == "PENDING"
    await api.api("POST", f"/api/v1/jobs/{job_id}/cancel")


async def test_bad_input_lost_nothing(api):
    assert (await api.job(api.sentinel))["state"] == "PENDING"
    assert (await api.api("GET", "/healthz", user=None))[0] == 200
