"""gpud-webhook: what it sends, when, signed, and from a running gpud (gpud up) through its entry point."""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

import gpud_webhook
from gpud.model import JobSpec, TaskRequest
from gpud.plugins import make_plugin_manager


class Receiver(http.server.ThreadingHTTPServer):
    """A local HTTP server that keeps every POST (headers and JSON body) and answers ``status``."""

    def __init__(self) -> None:
        self.posts: list[tuple[dict, dict]] = []
        self.status = 204
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.posts.append((dict(self.headers), json.loads(body)))
                receiver.bodies.append(body)
                self.send_response(receiver.status)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.bodies: list[bytes] = []
        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


JOB = JobSpec(id="42", project="vision", request=TaskRequest(gpus=2), tasks=1, submitted=100.0)


def test_nothing_happens_without_a_url(monkeypatch: pytest.MonkeyPatch, receiver: Receiver) -> None:
    monkeypatch.delenv("GPUD_WEBHOOK_URL", raising=False)
    gpud_webhook.gpud_job_event("started", JOB, {})
    assert receiver.posts == []


def test_an_event_is_posted_as_json(monkeypatch: pytest.MonkeyPatch, receiver: Receiver) -> None:
    monkeypatch.setenv("GPUD_WEBHOOK_URL", receiver.url)
    gpud_webhook.gpud_job_event("finished", JOB, {"state": "COMPLETED", "exit_code": 0, "user": "ann"})
    (headers, body), = receiver.posts
    assert headers["Content-Type"] == "application/json"
    assert body["event"] == "finished"
    assert body["job"]["id"] == "42" and body["job"]["project"] == "vision" and body["job"]["gpus_per_task"] == 2
    assert body["detail"] == {"state": "COMPLETED", "exit_code": 0, "user": "ann"}
    assert "X-Gpud-Signature" not in headers


def test_only_the_chosen_events_are_sent(monkeypatch: pytest.MonkeyPatch, receiver: Receiver) -> None:
    monkeypatch.setenv("GPUD_WEBHOOK_URL", receiver.url)
    monkeypatch.setenv("GPUD_WEBHOOK_EVENTS", "finished, preempted")
    for event in gpud_webhook.EVENTS:
        gpud_webhook.gpud_job_event(event, JOB, {})
    assert [body["event"] for _, body in receiver.posts] == ["finished", "preempted"]


def test_the_body_is_signed_with_the_secret(monkeypatch: pytest.MonkeyPatch, receiver: Receiver) -> None:
    monkeypatch.setenv("GPUD_WEBHOOK_URL", receiver.url)
    monkeypatch.setenv("GPUD_WEBHOOK_SECRET", "s3cret")
    gpud_webhook.gpud_job_event("submitted", JOB, {})
    (headers, _), = receiver.posts
    expected = "sha256=" + hmac.new(b"s3cret", receiver.bodies[0], hashlib.sha256).hexdigest()
    assert headers["X-Gpud-Signature"] == expected


def test_failures_are_logged_not_raised(monkeypatch: pytest.MonkeyPatch, receiver: Receiver,
                                        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("GPUD_WEBHOOK_URL", receiver.url)
    receiver.status = 500
    gpud_webhook.gpud_job_event("started", JOB, {})
    assert len(receiver.posts) == 2  # one retry
    receiver.status = 400
    gpud_webhook.gpud_job_event("started", JOB, {})
    assert len(receiver.posts) == 3  # a refusal is not retried
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.setenv("GPUD_WEBHOOK_URL", f"http://127.0.0.1:{closed}/")
    monkeypatch.setenv("GPUD_WEBHOOK_TIMEOUT", "1")
    gpud_webhook.gpud_job_event("started", JOB, {})
    assert "webhook" in caplog.text


def test_gpud_finds_the_plugin_through_its_entry_point() -> None:
    pm = make_plugin_manager()
    assert any(getattr(p, "__name__", "") == "gpud_webhook" for p in pm.get_plugins())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(check, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_running_gpud_posts_a_jobs_life(tmp_path: Path, receiver: Receiver) -> None:
    port = _free_port()
    env = {**os.environ, "GPUD_WEBHOOK_URL": receiver.url, "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "XDG_DATA_HOME": str(tmp_path / "data")}
    env.pop("GPUD_URL", None)
    env.pop("GPUD_TOKEN", None)
    log = open(tmp_path / "gpud.log", "wb")
    up = subprocess.Popen([sys.executable, "-m", "gpud.cli.gpud_main", "up", "--fake-gpus", "1", "--port",
                           str(port), "--state-dir", str(tmp_path / "state")],
                          env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
                    return answer.status == 200
            except OSError:
                return False

        _wait(healthy, "gpud up to serve")
        submit = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "submit", "-p", "default", "--gpus", "1",
                                 "--workdir", str(tmp_path), "--parsable", "--", "true"],
                                env=env, capture_output=True, text=True, timeout=60)
        assert submit.returncode == 0, submit.stdout + submit.stderr + (tmp_path / "gpud.log").read_text()
        job = submit.stdout.strip().split(";")[0]
        events = _wait(lambda: [b["event"] for _, b in receiver.posts if b["job"]["id"] == job]
                       if any(b["event"] == "finished" for _, b in receiver.posts) else None,
                       "the finished event")
        assert events == ["submitted", "started", "finished"]
        finished = [b for _, b in receiver.posts if b["event"] == "finished"][0]
        assert finished["detail"]["state"] == "COMPLETED" and finished["detail"]["exit_code"] == 0
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(20)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait(10)
        log.close()
