"""sd_notify: the message format, both socket namespaces, and READY=1/STOPPING=1 from the real daemons."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from daemons import free_port
from gpud import sdnotify


def _bind(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(20)
    return sock


def test_notify_sends_to_a_path_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "notify.sock")
    with _bind(path) as sock:
        assert sdnotify.notify("READY=1\nSTATUS=hi", {"NOTIFY_SOCKET": path})
        assert sock.recv(4096) == b"READY=1\nSTATUS=hi"


def test_notify_sends_to_an_abstract_socket() -> None:
    name = f"gpud-test-{os.getpid()}"
    with _bind("\0" + name) as sock:
        assert sdnotify.notify("STOPPING=1", {"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(4096) == b"STOPPING=1"


@pytest.mark.parametrize("value", ["", "relative/path", "/nonexistent/gpud/notify.sock"])
def test_notify_without_a_usable_socket_is_a_quiet_no(value: str) -> None:
    assert sdnotify.notify("READY=1", {"NOTIFY_SOCKET": value}) is False


def _start(argv: list[str], notify: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "NOTIFY_SOCKET": notify}
    return subprocess.Popen([sys.executable, "-m", "gpud.cli.gpud_main", *argv], env=env,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def test_controller_says_ready_once_it_serves_and_stopping_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    notify = str(tmp_path / "notify.sock")
    with _bind(notify) as sock:
        proc = _start(["controller", "--init", "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state"),
                       "--policy", str(Path(__file__).parents[2] / "etc/gpud/policy.toml")],
                      notify, tmp_path / "controller.log")
        try:
            try:
                message = sock.recv(4096).decode()
            except TimeoutError:
                pytest.fail("no READY=1:\n" + (tmp_path / "controller.log").read_text())
            assert message.splitlines()[0] == "READY=1"
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
                assert answer.status == 200
            proc.send_signal(signal.SIGTERM)
            assert sock.recv(4096) == b"STOPPING=1"
            assert proc.wait(20) == 0
        finally:
            _stop(proc)


def test_node_says_ready_with_its_loop_started_even_without_a_controller(tmp_path: Path) -> None:
    notify = str(tmp_path / "notify.sock")
    key = tmp_path / "cluster.key"
    key.write_text("k" * 32 + "\n")
    metrics_port = free_port()
    with _bind(notify) as sock:
        proc = _start(["node", "--controller", f"http://127.0.0.1:{free_port()}", "--fake-gpus", "2",
                       "--state-dir", str(tmp_path / "node"), "--cluster-key-file", str(key), "--name", "n1",
                       "--metrics-listen", f"127.0.0.1:{metrics_port}"], notify, tmp_path / "node.log")
        try:
            try:
                message = sock.recv(4096).decode()
            except TimeoutError:
                pytest.fail("no READY=1:\n" + (tmp_path / "node.log").read_text())
            assert message.splitlines()[0] == "READY=1"
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as answer:
                text = answer.read().decode()
            assert 'gpud_node_gpus{node="n1",health="healthy"} 2' in text
            assert 'gpud_node_connected{node="n1"} 0' in text
            proc.send_signal(signal.SIGTERM)
            assert sock.recv(4096) == b"STOPPING=1"
            assert proc.wait(20) == 0
        finally:
            _stop(proc)
