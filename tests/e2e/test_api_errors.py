"""Every error the controller answers is JSON with a message, none is a 500, and a client that hangs up is quiet."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from daemons import LiveCluster, running_cluster, wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("errors")) as live:
        yield live


def raw_exchange(cluster: LiveCluster, data: bytes) -> tuple[int, str, bytes]:
    """Send raw bytes; the status, the Content-Type and the body of the answer."""
    with socket.create_connection(("127.0.0.1", cluster.port), timeout=10) as sock:
        sock.sendall(data)
        answer = b""
        while True:
            got = sock.recv(65536)
            if not got:
                break
            answer += got
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), headers.get("Content-Type", ""), body


@pytest.mark.parametrize("data", [
    b"GARBAGE\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
    b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n",
    b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: x\r\n\r\n",
])
def test_aiohttps_own_refusals_are_json(cluster, data):
    status, content_type, body = raw_exchange(cluster, data)
    assert 400 <= status < 500 and content_type.startswith("application/json"), (status, content_type, body)
    import json
    assert json.loads(body)["error"].startswith("bad HTTP request")


@pytest.mark.parametrize("path, status", [
    ("/api/v1/history?limit=-1e30", 400), ("/api/v1/history?limit=-1", 422), ("/api/v1/history?limit=0", 422),
    ("/api/v1/history?limit=10001", 422), ("/api/v1/history?since=nan", 422), ("/api/v1/history?since=1e999", 422),
    ("/api/v1/jobs/1/logs?offset=99999999999999999999999999", 404), ("/api/v1/jobs?state=%00", 422),
    ("/api/v1/jobs/%F0%9F%92%A9", 404), ("/api/v1/jobs/1_1_1/why", 404),
])
def test_odd_queries_are_refused_with_a_message_never_a_500(cluster, path, status):
    got, body = cluster.api("GET", path)
    assert got == status and isinstance(body, dict) and body["error"], (path, got, body)


def test_a_deep_policy_is_refused_by_reload_and_check_config_with_a_message(cluster):
    good = cluster.policy_file.read_text()
    try:
        cluster.policy_file.write_text(good + "\n[plugins]\nx = " + "{a = " * 2000 + "1" + "}" * 2000 + "\n")
        status, body = cluster.api("POST", "/api/v1/policy/reload")
        assert status == 422 and "nest more than 32 levels" in body["error"], body
        done = subprocess.run([sys.executable, "-m", "gpud.cli.gpud_main", "check-config", str(cluster.policy_file)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and "nest more than 32 levels" in done.stdout + done.stderr
        assert "Traceback" not in done.stderr
    finally:
        cluster.policy_file.write_text(good)


def test_a_client_that_hangs_up_is_one_quiet_line(cluster):
    log = cluster.root / "controller.log"
    before = log.read_text(errors="replace")
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", cluster.port), timeout=10) as sock:
            sock.sendall(f"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {cluster.admin_token}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"project\"".encode())
            time.sleep(0.1)
    wait_for(lambda: cluster.api("GET", "/healthz", token=None)[0] == 200, "the controller")
    time.sleep(0.5)
    added = log.read_text(errors="replace")[len(before):]
    assert "Traceback" not in added and "ERROR" not in added, added[-3000:]


@pytest.mark.parametrize("method, path, allowed", [
    ("DELETE", "/api/v1/jobs", {"GET", "POST"}),
    ("PUT", "/healthz", {"GET"}),
    ("GET", "/api/v1/policy/reload", {"POST"}),
])
def test_a_405_names_the_allowed_methods_in_allow(cluster, method, path, allowed):
    import http.client
    import json
    connection = http.client.HTTPConnection("127.0.0.1", cluster.port, timeout=10)
    try:
        connection.request(method, path, headers={"Authorization": f"Bearer {cluster.admin_token}"})
        answer = connection.getresponse()
        body = json.loads(answer.read())
    finally:
        connection.close()
    assert answer.status == 405, (answer.status, body)
    assert {m.strip() for m in (answer.getheader("Allow") or "").split(",")} - {"HEAD"} == allowed
    assert method in body["error"] and path in body["error"]
