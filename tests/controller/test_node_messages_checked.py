"""Node messages are checked like API bodies: a malformed one gets an error naming the field, never a crash.

A controller in the test's process (tests/in_process.py); the test speaks the
node protocol over a real WebSocket with the cluster key, registers, and sends
messages a broken or hostile node might: NaN and Infinity, wrong types,
numbers too large for any task. Each is answered with an error naming what is
wrong; the connection stays open, and the controller logs no traceback.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

GOOD_TASK = {"job": "1", "task": 0, "attempt": 0, "state": "running", "pid": 4242}


def task(**change) -> dict:
    return {**GOOD_TASK, **change}


BAD = [
    ('{"type": "task", "job": "1", "task": Infinity, "attempt": 0, "state": "exited"}', "Infinity"),
    ('{"type": "task", "job": "1", "task": NaN, "attempt": 0, "state": "exited"}', "NaN"),
    ('{"type": "task", "job": "1", "task": -Infinity, "attempt": 0, "state": "exited"}', "-Infinity"),
    (json.dumps({"type": "task", **task(task=10 ** 30)}), "task must be an integer"),
    (json.dumps({"type": "task", **task(task=1.5)}), "task must be an integer"),
    (json.dumps({"type": "task", **task(attempt="0")}), "attempt must be an integer"),
    (json.dumps({"type": "task", **task(task=True)}), "task must be an integer"),
    (json.dumps({"type": "task", **task(job=["1"])}), "job must be"),
    (json.dumps({"type": "task", **task(state="exploded")}), "state must be one of"),
    (json.dumps({"type": "task", **task(state="exited", exit_code=2 ** 40)}), "exit_code must be an integer"),
    (json.dumps({"type": "task", **task(state="exited", ended=1e308 * 10)}), "Infinity"),
    (json.dumps({"type": "task", **task(state="exited", cpu_s=-1)}), "cpu_s must be a number"),
    (json.dumps({"type": "heartbeat", "seq": 1, "tasks": [task(), task(pid=2 ** 70)]}), "tasks[1]: pid"),
    (json.dumps({"type": "heartbeat", "seq": 1, "tasks": {"not": "a list"}}), "tasks must be a list"),
    (json.dumps({"type": "heartbeat", "seq": 1, "gpus": [{"index": 0, "memory_gib": "lots"}]}),
     "gpus[0]: memory_gib must be a number"),
    ('{"type": "heartbeat", "seq": 1, "gpus": [{"index": 0, "memory_gib": Infinity}]}', "Infinity"),
    ("[1, 2, 3]", "a message is a JSON object"),
    ("{not json", "not valid JSON"),
    ("[" * 100 + "]" * 100, "nests more than"),
]


def no_traceback(caplog) -> None:
    tracebacks = [record.getMessage() for record in caplog.records if record.exc_info]
    assert not tracebacks, tracebacks


async def test_malformed_node_messages_get_an_error_naming_the_field_and_the_link_stays(local_controller, caplog):
    cluster = local_controller
    key = (cluster.state_dir / "cluster.key").read_text().strip()
    async with cluster.client.ws_connect("/api/v1/node/connect", headers={"Authorization": f"Bearer {key}"}) as ws:
        await ws.send_str(json.dumps({"type": "register", "node": "odd", "cpus": 4, "memory_gib": 8,
                                      "gpus": [{"index": 0, "memory_gib": 80}], "tasks": []}))
        assert (await answer(ws))["type"] == "registered"
        for text, words in BAD:
            await ws.send_str(text)
            got = await answer(ws)
            assert got["type"] == "error" and words in got["error"], (text[:80], got)
            await ws.send_str(json.dumps({"type": "heartbeat", "seq": 7, "tasks": []}))
            assert (await answer(ws))["type"] == "lease", text[:80]   # the link still serves this node
    status, health = await cluster.api("GET", "/healthz", user=None)
    assert status == 200
    no_traceback(caplog)


async def test_a_register_with_impossible_sizes_is_refused_with_the_field(local_controller, caplog):
    cluster = local_controller
    key = (cluster.state_dir / "cluster.key").read_text().strip()
    for body, words in ((' "cpus": Infinity', "Infinity"), (' "cpus": -2', "cpus must be a number"),
                        (' "memory_gib": "8"', "memory_gib must be a number"), (' "cpus": 1e400', "cpus")):
        async with cluster.client.ws_connect("/api/v1/node/connect", headers={"Authorization": f"Bearer {key}"}) as ws:
            await ws.send_str('{"type": "register", "node": "odd2", "tasks": [],' + body + "}")
            got = await answer(ws)
            assert got["type"] == "error" and words in got["error"], (body, got)
    assert "odd2" not in {n["name"] for n in (await cluster.api("GET", "/api/v1/nodes"))[1]["nodes"]}
    no_traceback(caplog)


async def answer(ws: aiohttp.ClientWebSocketResponse) -> dict:
    """The next message the controller sends that is not an order for tasks."""
    while True:
        frame = await asyncio.wait_for(ws.receive(), 15)
        assert frame.type == aiohttp.WSMsgType.TEXT, frame
        message = json.loads(frame.data)
        if message["type"] in ("registered", "lease", "error", "refused"):
            return message


def test_a_repeated_report_is_read_as_it_was_checked():
    from gpud.controller.node_schema import task_reports
    first = task_reports([{"job": "1", "task": 1, "attempt": 0, "state": "running", "pid": 7}])
    again = task_reports([{"job": "1", "task": True, "attempt": 0, "state": "running", "pid": 7.0}], checked=first)
    assert again[0] is first[0] and type(again[0]["task"]) is int and type(again[0]["pid"]) is int
    with pytest.raises(ValueError, match=r"tasks\[1\]: pid"):
        task_reports([first[0], {"job": "1", "task": 2, "attempt": 0, "state": "running", "pid": -1}], checked=first)


def test_a_heartbeat_repeating_every_report_keeps_the_checked_list():
    """A node's heartbeat mostly repeats its last task list: the checked list stays, no new one is made (a
    controller of thousands of nodes would otherwise keep a fresh list per node alive between heartbeats)."""
    from gpud.controller.node_schema import task_reports
    first = task_reports([{"job": "1", "task": 1, "attempt": 0, "state": "running", "pid": 7}])
    same = task_reports([{"job": "1", "task": True, "attempt": 0, "state": "running", "pid": 7.0}], checked=first)
    assert same is first and type(same[0]["task"]) is int
    assert task_reports([], checked=[]) == []
    longer = task_reports([first[0], {"job": "1", "task": 2, "attempt": 0, "state": "running", "pid": 8}],
                          checked=first)
    assert longer is not first and longer[0] is first[0] and longer[1]["task"] == 2
    with pytest.raises(ValueError, match=r"tasks\[0\]: pid"):
        task_reports([{"job": "1", "task": 1, "attempt": 0, "state": "running", "pid": -1}], checked=first)
