"""The controller's REST API against a real controller and node daemons on 127.0.0.1: jobs that run.

Who may do what, bad input, arrays, dependencies, holds and drains are
tested in process (tests/controller/test_api.py, test_api_lifecycle.py);
here jobs run, and random requests hit the real process.

One cluster serves the whole module: a controller and node ``n1`` (label
role=main). Jobs ask for a tenth of a CPU so the node's CPUs never limit
what these tests look at.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from daemons import LiveCluster, running_cluster, wait_for

MAIN = {"role": "main"}
SMALL = {"cpus": 0.1, "memory_gib": 0.1}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("api")) as live:
        live.start_node("n1", gpus=4, labels=MAIN)
        live.alice = live.token_for("alice")
        live.bob = live.token_for("bob")
        live.carol = live.token_for("carol")
        live.sentinel = submit(live, command=["true"], hold=True)
        yield live


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


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


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


@settings(max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
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


@settings(max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
