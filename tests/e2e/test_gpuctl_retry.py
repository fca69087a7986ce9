"""gpuctl waits a bounded time for a controller that refuses connections, for calls safe to repeat.

Real gpuctl processes against a real controller on 127.0.0.1 that is down
when they start: a submit (its Idempotency-Key makes a second sending safe)
and a read succeed once the controller comes up within GPUD_RETRY; with
no controller at all they give up after about GPUD_RETRY seconds with one
clear line; a change that is not safe to repeat is refused at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from daemons import LiveCluster
from gpud.client import Client, ConfigFileError
from gpuctl_helpers import closed_port


@pytest.fixture
def stopped(tmp_path):
    """A cluster made once, then stopped: its port refuses connections until the test starts it again."""
    live = LiveCluster(tmp_path)
    try:
        live.start_controller()
        live.token = live.admin_token
        live.controller.stop()
        live.controller = None
        yield live
    finally:
        live.close()


def gpuctl(cluster: LiveCluster, *argv: str, retry: str = "30") -> subprocess.Popen:
    env = {**os.environ, "GPUD_URL": cluster.url, "GPUD_TOKEN": cluster.token, "GPUD_RETRY": retry,
           "XDG_CONFIG_HOME": str(cluster.root / "no-config")}
    return subprocess.Popen([sys.executable, "-m", "gpud.cli.gpuctl", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cluster.workdir)


def test_a_submit_and_a_read_wait_for_a_controller_that_comes_up(stopped):
    submit = gpuctl(stopped, "submit", "-p", "alpha", "--hold", "--name", "patient", "--", "true")
    queue = gpuctl(stopped, "queue")
    time.sleep(1.0)   # both are refused now, and retrying
    assert submit.poll() is None and queue.poll() is None
    stopped.start_controller()
    out, err = submit.communicate(timeout=60)
    assert submit.returncode == 0, err
    assert queue.communicate(timeout=60)[0] is not None and queue.returncode == 0
    status, body = stopped.api("GET", "/api/v1/jobs")
    assert [job["name"] for job in body["jobs"]] == ["patient"]   # submitted once


def test_without_a_controller_a_read_gives_up_after_gpud_retry_with_one_line(tmp_path):
    env = {**os.environ, "GPUD_URL": f"http://127.0.0.1:{closed_port()}", "GPUD_RETRY": "2",
           "XDG_CONFIG_HOME": str(tmp_path)}
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "queue"], env=env, capture_output=True,
                            text=True, timeout=60)
    took = time.monotonic() - began
    assert result.returncode == 3
    assert result.stderr.count("\n") == 1, result.stderr
    assert "(connection refused, still after 2 s of retries (GPUD_RETRY sets how long)); is it running?" \
        in result.stderr, result.stderr
    assert 1.5 <= took < 30, took


def test_a_change_not_safe_to_repeat_is_refused_at_once(stopped):
    began = time.monotonic()
    cancel = gpuctl(stopped, "cancel", "1")
    out, err = cancel.communicate(timeout=60)
    assert cancel.returncode == 3 and "connection refused)" in err, err
    # At once: well before the 30 s a retried call would take, with room for a slow start of Python.
    assert time.monotonic() - began < 20


@pytest.mark.parametrize("value", ["soon", "-1", "inf", "nan"])
def test_a_bad_gpud_retry_is_named(value):
    with pytest.raises(ConfigFileError, match="GPUD_RETRY must be a number of seconds"):
        Client.from_environment({"GPUD_URL": "http://127.0.0.1:1", "GPUD_RETRY": value})


def test_gpud_retry_is_read_and_defaults_to_ten_seconds():
    assert Client.from_environment({"GPUD_URL": "http://127.0.0.1:1"}).connect_retry_s == 10.0
    assert Client.from_environment({"GPUD_URL": "http://127.0.0.1:1", "GPUD_RETRY": "0"}).connect_retry_s == 0.0
