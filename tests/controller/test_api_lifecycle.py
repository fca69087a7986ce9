"""Jobs through their lifecycle over the API, in process: arrays, dependencies, hold and release, drains.

Each test has its own controller (tests/in_process.py) with node ``n1``
registered as a record: cycles run when the test says, the node's reports
are sent by the test from the start commands it got, and the clock moves
only when the test moves it.
"""

from __future__ import annotations

from in_process import InProcessController


async def start_of(api: InProcessController, job_id: str, node: str = "n1") -> dict:
    """Run a cycle; the one start command for ``job_id`` it sends ``node``, reported running."""
    await api.cycle()
    starts = [command for command in api.starts(node) if command["job"] == job_id]
    assert len(starts) == 1, starts
    await api.report(node, starts[0], "running")
    return starts[0]


async def run_to_end(api: InProcessController, job_id: str, exit_code: int, seconds: float = 10.0) -> dict:
    """Start ``job_id``, let it run ``seconds`` on the clock and end with ``exit_code``; returns the job."""
    start = await start_of(api, job_id)
    api.clock.advance(seconds)
    await api.report("n1", start, "exited", exit_code)
    return await api.job(job_id)


async def test_afterok_waits_for_success_then_runs(local_controller):
    api = local_controller
    api.add_node("n1", gpus=4)
    first = await api.submit(command=["train"])
    second = await api.submit(command=["evaluate"], depends=[f"afterok:{first}"])
    start = await start_of(api, first)
    await api.cycle(3)
    assert api.starts("n1") == []
    job = await api.job(second)
    assert job["state"] == "PENDING" and first in job["reason"], job
    api.clock.advance(60)
    await api.report("n1", start, "exited", 0)
    done = await api.job(first)
    assert done["state"] == "COMPLETED" and done["elapsed_s"] == 60, done
    await start_of(api, second)
    after = await api.job(second)
    assert after["state"] == "RUNNING" and after["started"] >= done["ended"], after


async def test_afterok_on_a_failed_job_never_starts(local_controller):
    api = local_controller
    api.add_node("n1", gpus=4)
    first = await api.submit()
    second = await api.submit(depends=[f"afterok:{first}"])
    assert (await run_to_end(api, first, 3))["exit_code"] == 3
    await api.cycle(3)
    assert api.starts("n1") == []
    job = await api.job(second)
    assert job["state"] == "PENDING" and first in job["reason"] and "never" in job["reason"], job


async def test_afterany_and_afternotok_run_after_a_failure(local_controller):
    api = local_controller
    api.add_node("n1", gpus=4)
    first = await api.submit()
    any_ = await api.submit(depends=[f"afterany:{first}"])
    notok = await api.submit(depends=[f"afternotok:{first}"])
    assert (await run_to_end(api, first, 1))["state"] == "FAILED"
    await api.cycle()
    assert sorted(command["job"] for command in api.starts("n1")) == sorted([any_, notok])


async def test_afternotok_on_a_success_never_starts_and_finished_targets_count(local_controller):
    api = local_controller
    api.add_node("n1", gpus=4)
    first = await api.submit()
    assert (await run_to_end(api, first, 0))["state"] == "COMPLETED"
    notok = await api.submit(depends=[f"afternotok:{first}"])
    ok = await api.submit(depends=[f"afterok:{first}"])
    await start_of(api, ok)
    job = await api.job(notok)
    assert job["state"] == "PENDING" and "never" in job["reason"], job


async def test_hold_and_release(local_controller):
    api = local_controller
    api.add_node("n1", gpus=4)
    held = await api.submit(hold=True)
    await api.cycle(3)
    assert api.starts("n1") == []
    job = await api.job(held)
    assert job["state"] == "PENDING" and "held" in job["reason"], job
    assert await api.api("POST", f"/api/v1/jobs/{held}/release") == (200, {"ids": [held]})
    await start_of(api, held)

    waiting = await api.submit(constraint={"pool": "nowhere"})
    assert await api.api("POST", f"/api/v1/jobs/{waiting}/hold") == (200, {"ids": [waiting]})
    assert "held" in (await api.job(waiting))["reason"]
    status, body = await api.api("POST", f"/api/v1/jobs/{waiting}/hold")
    assert status == 409, body
    assert await api.api("POST", f"/api/v1/jobs/{waiting}/release") == (200, {"ids": [waiting]})

    status, body = await api.api("POST", f"/api/v1/jobs/{held}/hold")
    assert status == 409 and "running" in body["error"], body


async def test_requeue_stops_a_running_job_and_starts_it_again_once_stopped(local_controller):
    api = local_controller
    api.add_node("n1", gpus=4)
    job_id = await api.submit(gpus=1)
    first = await start_of(api, job_id)
    assert await api.api("POST", f"/api/v1/jobs/{job_id}/requeue") == (200, {"ids": [job_id]})
    job = await api.job(job_id)
    assert job["state"] == "PENDING" and job["restart_count"] == 1, job
    assert [e["message"] for e in job["events"] if e["kind"] == "requeued"] == ["requeued by root (restart 1)"]
    stops = [c for c in api.commands("n1") if c["type"] == "stop"]
    assert [(c["job"], c["attempt"]) for c in stops] == [(job_id, first["attempt"])]
    await api.cycle(2)
    assert api.starts("n1") == [], "the new copy waits for the old one to stop"
    await api.report("n1", first, "exited", 143)
    second = await start_of(api, job_id)
    assert second["attempt"] > first["attempt"]
    assert second["spec"]["restart_count"] == 1  # its GPUD_RESTART_COUNT and SLURM_RESTART_COUNT
    assert (await api.job(job_id))["state"] == "RUNNING"


async def test_requeue_refuses_a_pending_job_and_one_that_never_requeues(local_controller):
    api = local_controller
    api.add_node("n1", gpus=1)
    kept = await api.submit(gpus=1, requeue=False)
    await start_of(api, kept)
    status, body = await api.api("POST", f"/api/v1/jobs/{kept}/requeue")
    assert status == 409 and "--no-requeue" in body["error"], body
    waiting = await api.submit(gpus=1)
    status, body = await api.api("POST", f"/api/v1/jobs/{waiting}/requeue")
    assert status == 409 and body["error"].startswith(f"job {waiting} is pending; only a running job"), body
    assert (await api.job(kept))["state"] == "RUNNING" and (await api.job(kept))["restart_count"] == 0


async def node_view(api: InProcessController, name: str) -> dict:
    status, body = await api.api("GET", "/api/v1/nodes")
    assert status == 200, body
    return next(n for n in body["nodes"] if n["name"] == name)


async def test_drain_lets_running_jobs_finish_and_resume_starts_pending_ones(local_controller):
    api = local_controller
    api.add_node("n1", gpus=1)
    running = await api.submit(gpus=1)
    start = await start_of(api, running)
    status, body = await api.api("POST", "/api/v1/nodes/n1/drain", {"reason": "disk swap"})
    assert status == 200 and body["state"] == "draining", body
    assert (await node_view(api, "n1"))["reason"] == "disk swap"
    pending = await api.submit(gpus=1)
    await api.report("n1", start, "exited", 0)
    await api.cycle(3)
    assert api.starts("n1") == []
    assert (await node_view(api, "n1"))["state"] == "drained"
    assert (await api.job(pending))["state"] == "PENDING"
    status, body = await api.api("POST", "/api/v1/nodes/n1/resume")
    assert status == 200 and body["state"] == "up", body
    await start_of(api, pending)


async def test_drain_needs_a_reason(local_controller):
    api = local_controller
    api.add_node("n1")
    status, body = await api.api("POST", "/api/v1/nodes/n1/drain", {})
    assert status == 422 and body["field"] == "reason", body
    assert (await node_view(api, "n1"))["state"] == "up"


async def test_a_node_drained_under_a_cpu_only_job_shows_draining(local_controller):
    api = local_controller
    api.add_node("n1")
    running = await api.submit(gpus=0, cpus=1)
    await start_of(api, running)
    status, body = await api.api("POST", "/api/v1/nodes/n1/drain", {"reason": "cpu job test"})
    assert status == 200
    assert (await node_view(api, "n1"))["state"] == "draining", "a CPU-only job still runs on n1"


async def test_an_array_runs_at_most_its_limit_at_once(local_controller):
    api = local_controller
    api.add_node("n1", gpus=4)
    status, body = await api.api("POST", "/api/v1/jobs", {"project": "alpha", "workdir": str(api.workdir),
                                                          "command": ["true"], "array": "0-5%2"})
    assert status == 201, body
    array_id = body["array_id"]
    assert body["ids"] == [f"{array_id}_{i}" for i in range(6)]
    running: list[dict] = []
    for _ in range(10):
        await api.cycle()
        for start in api.starts("n1"):
            await api.report("n1", start, "running")
            running.append(start)
        assert len(running) <= 2, [start["job"] for start in running]
        if not running:
            break
        await api.report("n1", running.pop(0), "exited", 0)  # the oldest ends: one more may start
    for element in body["ids"]:
        job = await api.job(element)
        assert job["state"] == "COMPLETED", job
        assert job["array_id"] == array_id and job["array_limit"] == 2
    assert sorted([(await api.job(i))["array_index"] for i in body["ids"]]) == list(range(6))


async def test_cancelling_the_array_id_cancels_every_element(local_controller):
    api = local_controller
    api.add_node("n1", gpus=4)
    status, body = await api.api("POST", "/api/v1/jobs", {"project": "alpha", "workdir": str(api.workdir),
                                                          "command": ["true"], "array": "0-4"})
    assert status == 201, body
    await api.cycle()
    started = api.starts("n1")
    for start in started:
        await api.report("n1", start, "running")
    assert started and (await api.job(started[0]["job"]))["state"] == "RUNNING"
    status, answer = await api.api("POST", f"/api/v1/jobs/{body['array_id']}/cancel")
    assert status == 200 and sorted(answer["ids"]) == sorted(body["ids"]), answer
    for element in body["ids"]:
        assert (await api.job(element))["state"] == "CANCELLED"
    stopped = {command["job"] for command in api.commands("n1") if command["type"] == "stop"}
    assert stopped == {start["job"] for start in started}
