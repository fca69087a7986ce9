"""The controller calls gpud_job_event for submitted, started, finished and preempted jobs, off the event loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemons import POLICY, LiveCluster, wait_for
from gpud.controller.job_events import hook_event
from gpud.jobs import Job

RECORDER = """\
import json
import os

from gpud import hookimpl

@hookimpl
def gpud_job_event(event, job, detail):
    with open(os.environ["GPUD_TEST_EVENTS"], "a") as f:
        f.write(json.dumps({"event": event, "job": job.id, "state": detail["state"],
                            "exit_code": detail["exit_code"]}) + "\\n")
"""


class _Job:
    def __init__(self, state: str) -> None:
        self.state = state


@pytest.mark.parametrize("kind, state, expected", [
    ("submitted", "PENDING", "submitted"), ("started", "RUNNING", "started"),
    ("preempted", "RUNNING", "preempted"), ("completed", "COMPLETED", "finished"),
    ("cancelled", "CANCELLED", "finished"), ("preempted", "PREEMPTED", "finished"),
    ("node_fail", "NODE_FAIL", "finished"), ("held", "PENDING", None), ("requeued", "PENDING", None),
    ("moved", "RUNNING", None),
])
def test_controller_events_map_onto_the_hook_events(kind: str, state: str, expected: str | None) -> None:
    assert hook_event(kind, _Job(state)) == expected  # type: ignore[arg-type]


def test_a_site_plugin_sees_a_jobs_life(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugins = tmp_path / "site-plugins"
    plugins.mkdir()
    (plugins / "recorder.py").write_text(RECORDER)
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("GPUD_TEST_EVENTS", str(events))
    live = LiveCluster(tmp_path, policy=POLICY + f'\n[plugins]\ndirectory = "{plugins}"\n')
    try:
        live.start_controller()
        live.start_node("n1", gpus=2)
        done = live.submit(command=["true"], gpus=1)
        waiting = live.submit(command=["sleep", "60"], gpus=1, hold=True)
        live.api("POST", f"/api/v1/jobs/{waiting}/cancel")

        def seen() -> list[dict]:
            lines = events.read_text().splitlines() if events.exists() else []
            records = [json.loads(line) for line in lines]
            return records if any(r["job"] == done and r["event"] == "finished" for r in records) else []

        records = wait_for(seen, "the finished event")
    finally:
        live.close()
    mine = [(r["event"], r["state"]) for r in records if r["job"] == done]
    assert mine == [("submitted", "PENDING"), ("started", "RUNNING"), ("finished", "COMPLETED")]
    finished = [r for r in records if r["job"] == done and r["event"] == "finished"][0]
    assert finished["exit_code"] == 0
    assert [(r["event"], r["state"]) for r in records if r["job"] == waiting] == [
        ("submitted", "PENDING"), ("finished", "CANCELLED")]


def test_jobs_are_not_touched_when_no_plugin_listens() -> None:
    from gpud.controller.job_events import JobEvents
    from gpud.plugins import make_plugin_manager

    events = JobEvents(make_plugin_manager(load_entry_points=False))
    assert not events.wanted()
    events.emit("submitted", Job.__new__(Job), "")  # nothing is read from the job
    assert events._executor is None
