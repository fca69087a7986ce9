"""No request can grow the controller's memory, hold a connection or flood it, against a real controller.

The controller here takes bodies of at most 1 MiB, closes connections idle
for 1 s, wants a body within 1 s, and lets each token submit 2 jobs a second
with bursts of 4.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from daemons import LiveCluster

LIMITS = "[api]\nmax_body_mib = 1\nidle_timeout_s = 1\nbody_timeout_s = 1\nsubmit_rate = 2\nsubmit_burst = 4\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    live = LiveCluster(tmp_path_factory.mktemp("bounds"))
    with open(live.config, "a") as f:
        f.write(LIMITS)
    try:
        live.start_controller()
        live.alice = live.token_for("alice")
        live.bob = live.token_for("bob")
        yield live
    finally:
        live.close()


def peak_rss_kib(cluster: LiveCluster) -> int:
    with open(f"/proc/{cluster.controller.pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def exchange(cluster: LiveCluster, head: str, body: bytes = b"", chunks: list[bytes] | None = None,
             pause: float = 0.0) -> tuple[int, dict | None]:
    """Send raw HTTP on a fresh connection; the status and JSON answer (None when the controller hung up)."""
    with socket.create_connection(("127.0.0.1", cluster.port), timeout=20) as sock:
        try:
            sock.sendall(head.encode() + body)
            for chunk in chunks or ():
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                time.sleep(pause)
            if chunks is not None:
                sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the controller may answer and close before the body is all sent
        data = b""
        try:
            while True:
                got = sock.recv(65536)
                if not got:
                    break
                data += got
                head_end = data.find(b"\r\n\r\n")
                if head_end >= 0:
                    length = [int(line.split(b":")[1]) for line in data[:head_end].split(b"\r\n")
                              if line.lower().startswith(b"content-length:")]
                    if length and len(data) >= head_end + 4 + length[0]:
                        break
        except (ConnectionResetError, TimeoutError):
            pass
    if not data:
        return 0, None
    status = int(data.split(b" ", 2)[1])
    payload = data.partition(b"\r\n\r\n")[2]
    return status, json.loads(payload) if payload else None


def post_head(cluster: LiveCluster, path: str, extra: str) -> str:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {cluster.admin_token}\r\n"
            f"Content-Type: application/json\r\n{extra}\r\n")


def test_a_63_mb_body_is_refused_from_its_length_or_while_it_streams_and_memory_stays_put(cluster):
    before = peak_rss_kib(cluster)
    status, answer = exchange(cluster, post_head(cluster, "/api/v1/jobs", "Content-Length: 66060288\r\n"),
                              b"[" + b"{}," * 1000)
    assert status == 413 and "at most 1048576 bytes" in answer["error"], answer
    piece = b"{}," * 100_000
    status, answer = exchange(cluster, post_head(cluster, "/api/v1/jobs/batch", "Transfer-Encoding: chunked\r\n"),
                              chunks=[b'{"jobs": ['] + [piece] * 210)
    assert status == 413 and "too large" in answer["error"], answer
    assert peak_rss_kib(cluster) - before < 32 * 1024, "the controller grew by more than 32 MiB"


def test_bodies_of_many_values_or_deep_nesting_are_refused_before_they_are_built(cluster):
    status, answer = cluster.api("POST", "/api/v1/jobs/batch", raw=b'{"jobs": [' + b"{}," * 300_000 + b"{}]}")
    assert status == 413 and "JSON values" in answer["error"], answer
    status, answer = cluster.api("POST", "/api/v1/jobs", raw=b"[" * 40 + b"]" * 40)
    assert status == 400 and "levels deep" in answer["error"], answer
    text = json.dumps({"project": "alpha", "workdir": str(cluster.workdir), "hold": True,
                       "command": ["echo", "[[[[{{{{,,,," * 10]}).encode()
    status, answer = cluster.api("POST", "/api/v1/jobs", raw=text)
    assert status == 201, "punctuation inside strings counts for nothing"


def test_idle_and_slow_connections_are_closed(cluster):
    with socket.create_connection(("127.0.0.1", cluster.port), timeout=10) as idle:
        began = time.monotonic()
        assert idle.recv(1) == b""
        assert time.monotonic() - began < 5
    with socket.create_connection(("127.0.0.1", cluster.port), timeout=10) as slow:
        began = time.monotonic()
        try:
            for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\n":
                slow.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:
            pass
        assert slow.recv(1) == b"" and time.monotonic() - began < 8, "a header sent slowly holds no connection"
    status, answer = exchange(cluster, post_head(cluster, "/api/v1/jobs", "Content-Length: 200\r\n"), b"{",
                              chunks=None, pause=0)
    assert status == 408 and "did not arrive within 1 s" in answer["error"], answer


def test_each_token_submits_at_its_rate(cluster):
    job = {"project": "alpha", "workdir": str(cluster.workdir), "command": ["true"], "hold": True}
    answers = [cluster.api_with_headers("POST", "/api/v1/jobs", job, {}, token=cluster.alice) for _ in range(6)]
    statuses = [a[0] for a in answers]
    assert statuses.count(201) in (4, 5) and statuses[-1] == 429, statuses
    refused = answers[-1]
    assert "alice may submit 2 jobs a second, 4 at once" in refused[1]["error"] and int(refused[2]["Retry-After"]) >= 1
    assert cluster.api("POST", "/api/v1/jobs", job, token=cluster.bob)[0] == 201, "another token is not slowed"
    status, answer = cluster.api("POST", "/api/v1/jobs", {**job, "array": "0-9"}, token=cluster.bob)
    assert status == 429 and "try again" not in answer["error"], "more than a burst never fits"
    time.sleep(1.2)
    assert cluster.api("POST", "/api/v1/jobs", job, token=cluster.alice)[0] == 201
