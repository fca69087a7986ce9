"""TLS between hosts: a whole cluster (controller, node daemon, gpuctl, dashboard) over TLS on 127.0.0.1, with a
CA and certificates made by `gpud cert`; plain HTTP, wrong CAs and bad files refused with words that say why."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import ssl
import stat
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from daemons import LiveCluster, Process, free_port, wait_for
from gpud.client import Client, ConfigFileError, TlsRefused, configured_ca
from gpud.controller.config import load_config
from gpud.errors import ConfigError
from ui_helpers import csrf_of


def gpud(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpud.cli.gpud_main", *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd)


def gpuctl(cluster: LiveCluster, *args: str, url: str | None = None, ca: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPUD_URL": url or cluster.url, "GPUD_TOKEN": cluster.admin_token, "GPUD_TIMEOUT": "10",
           "XDG_CONFIG_HOME": str(cluster.root / "no-config")}
    env.pop("GPUD_CA", None)
    if ca is not None:
        env["GPUD_CA"] = ca
    return subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", *args], env=env, capture_output=True, text=True,
                          timeout=90, cwd=cluster.workdir)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """A cluster CA with a controller certificate for 127.0.0.1 and localhost, made with `gpud cert`."""
    tls = tmp_path_factory.mktemp("tls")
    made = gpud("cert", "ca", str(tls))
    assert made.returncode == 0, made.stderr
    made = gpud("cert", "issue", "--ca", str(tls), "--name", "controller", "--host", "127.0.0.1", "--host", "localhost")
    assert made.returncode == 0, made.stderr
    return tls


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory) -> Path:
    """Another CA, which did not sign the controller's certificate."""
    other = tmp_path_factory.mktemp("other-ca")
    assert gpud("cert", "ca", str(other)).returncode == 0
    return other


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, certs):
    """A controller serving TLS only, with one node daemon that trusts the cluster's CA."""
    live = LiveCluster(tmp_path_factory.mktemp("cluster"), tls_dir=certs)
    ui_port = free_port()
    with live.config.open("a") as f:
        f.write(f'[ui]\nlisten = "127.0.0.1:{ui_port}"\n')
    live.ui_port = ui_port  # type: ignore[attr-defined]
    try:
        live.start_controller()
        live.start_node("n1", gpus=2)
        yield live
    finally:
        live.close()


def test_gpud_cert_writes_a_ca_and_a_certificate_for_the_hosts_with_private_keys_0600(certs):
    for name in ("ca.key", "controller.key"):
        assert stat.S_IMODE((certs / name).stat().st_mode) == 0o600, name
    for name in ("ca.pem", "controller.pem"):
        assert stat.S_IMODE((certs / name).stat().st_mode) == 0o644, name
    # The certificate verifies against the CA for the hosts it names, and only for them.
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(str(certs / "controller.pem"), str(certs / "controller.key"))
    for host, ok in (("127.0.0.1", True), ("localhost", True), ("127.0.0.2", False), ("ctl.example", False)):
        assert _handshake(server, context, host) == ok, host


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, host: str) -> bool:
    """Whether a client checking ``host`` accepts the server's certificate (over a socket pair, no network)."""
    import threading
    left, right = socket.socketpair()
    def serve() -> None:
        try:
            with server.wrap_socket(right, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass
    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client.wrap_socket(left, server_hostname=host):
            return True
    except ssl.SSLCertVerificationError:
        return False
    finally:
        left.close()
        thread.join(10)
        right.close()


def test_gpud_cert_never_overwrites_and_names_a_bad_host(certs, tmp_path):
    again = gpud("cert", "ca", str(certs))
    assert again.returncode == 1 and "exists already" in again.stderr
    again = gpud("cert", "issue", "--ca", str(certs), "--name", "controller", "--host", "127.0.0.1")
    assert again.returncode == 1 and "controller.pem exists already" in again.stderr
    bad = gpud("cert", "issue", "--ca", str(certs), "--name", "x", "--host", "not a host", "--out", str(tmp_path))
    assert bad.returncode == 1 and "'not a host' is neither an IP address nor a DNS name" in bad.stderr
    assert not list(tmp_path.iterdir())
    missing = gpud("cert", "issue", "--ca", str(tmp_path / "nowhere"), "--name", "x", "--host", "127.0.0.1")
    assert missing.returncode == 1 and "no CA in" in missing.stderr and "gpud cert ca" in missing.stderr


def test_a_job_submitted_with_gpuctl_runs_on_a_node_over_tls(cluster, certs):
    ca = str(certs / "ca.pem")
    submitted = gpuctl(cluster, "submit", "--project", "alpha", "--gpus", "1", "--", "/bin/sh", "-c",
                       "echo over-tls", ca=ca)
    assert submitted.returncode == 0, submitted.stderr
    job = re.search(r"submitted job (\S+)", submitted.stdout).group(1)
    cluster.wait_state(job, "COMPLETED")
    queue = gpuctl(cluster, "queue", "--all", ca=ca)
    assert queue.returncode == 0 and re.search(rf"^{job}\s.*COMPLETED", queue.stdout, re.M), queue.stdout
    logs = gpuctl(cluster, "logs", job, ca=ca)
    assert logs.returncode == 0 and "over-tls" in logs.stdout
    node_log = cluster.nodes["n1"].output()
    assert f"registered with the controller at wss://127.0.0.1:{cluster.port}/" in node_log


def test_gpuctl_run_relays_a_terminal_over_wss(cluster, certs):
    env = {**os.environ, "GPUD_URL": cluster.url, "GPUD_TOKEN": cluster.admin_token, "GPUD_CA": str(certs / "ca.pem"),
           "XDG_CONFIG_HOME": str(cluster.root / "no-config")}
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "run", "-p", "alpha", "--", "sh", "-c",
                             "while read line; do echo got:$line; done; exit 2"], env=env, input="one\ntwo\n",
                            capture_output=True, text=True, timeout=90, cwd=cluster.workdir)
    assert result.returncode == 2, result.stderr
    assert "got:one" in result.stdout and "got:two" in result.stdout


def test_gpuctl_checkpointed_in_a_task_reaches_the_controller_over_tls(cluster):
    gpuctl_path = str(Path(sys.executable).parent / "gpuctl")
    job = cluster.submit(script=f"#!/bin/sh\necho \"ca=$GPUD_CA\"\nexec {gpuctl_path} checkpointed\n", gpus=1)
    done = cluster.wait_state(job, "COMPLETED", "FAILED")
    assert done["state"] == "COMPLETED", done
    assert "checkpointed" in [event["kind"] for event in done["events"]]


def test_gpuctl_reads_the_ca_from_its_config_file(cluster, certs):
    config = cluster.root / "config-with-ca" / "gpud"
    config.mkdir(parents=True)
    env = {**os.environ, "GPUD_TOKEN": cluster.admin_token, "XDG_CONFIG_HOME": str(config.parent)}
    for name in ("GPUD_URL", "GPUD_CA"):
        env.pop(name, None)
    (config / "client.toml").write_text(f'url = "{cluster.url}"\nca = 3\n')
    with pytest.raises(ConfigFileError, match="ca must be the path of a CA certificate"):
        configured_ca(env)
    (config / "client.toml").write_text('ca = "tls/ca.pem"\n')
    assert configured_ca(env) == str(config / "tls" / "ca.pem")  # relative to the file's directory
    (config / "client.toml").write_text(f'url = "{cluster.url}"\nca = "{certs / "ca.pem"}"\n')
    assert configured_ca(env) == str(certs / "ca.pem")
    assert configured_ca({**env, "GPUD_CA": "~/ca.pem"}) == os.path.expanduser("~/ca.pem")  # the variable wins
    nodes = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "nodes"], env=env, capture_output=True,
                           text=True, timeout=60)
    assert nodes.returncode == 0 and re.search(r"^n1\s+default\s+up", nodes.stdout, re.M), nodes.stderr


def test_a_plain_http_client_gets_nothing_from_the_tls_port_and_submits_nothing(cluster):
    # The jobs by id: an earlier test's job may still be ending while this one runs.
    before = [job["id"] for job in cluster.api("GET", "/api/v1/jobs?all=1")[1]["jobs"]]
    connection = http.client.HTTPConnection("127.0.0.1", cluster.port, timeout=10)
    body = json.dumps({"command": ["/bin/true"], "project": "alpha", "workdir": str(cluster.workdir)})
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        connection.request("POST", "/api/v1/jobs", body, {"Authorization": f"Bearer {cluster.admin_token}",
                                                          "Content-Type": "application/json"})
        connection.getresponse()
    connection.close()
    assert [job["id"] for job in cluster.api("GET", "/api/v1/jobs?all=1")[1]["jobs"]] == before
    # gpuctl given an http:// URL says at once that the controller speaks TLS only, and how to reach it.
    began = time.monotonic()
    queue = gpuctl(cluster, "queue", url=f"http://127.0.0.1:{cluster.port}")
    assert queue.returncode == 3, queue.stderr
    assert f"serves TLS only: use https://127.0.0.1:{cluster.port}" in queue.stderr
    assert time.monotonic() - began < 30  # no minute of retries first


def test_gpuctl_refuses_a_certificate_its_ca_did_not_sign_and_says_so(cluster, other_ca):
    wrong = gpuctl(cluster, "submit", "--project", "alpha", "--", "/bin/true", ca=str(other_ca / "ca.pem"))
    assert wrong.returncode == 3, wrong.stderr
    assert "presented a certificate that does not verify against the CA file" in wrong.stderr
    assert str(other_ca / "ca.pem") in wrong.stderr and "set GPUD_CA" in wrong.stderr
    system = gpuctl(cluster, "queue")  # no CA given: the system's CAs, which know nothing of this cluster
    assert system.returncode == 3 and "the system's CA certificates" in system.stderr
    missing = gpuctl(cluster, "queue", ca=str(other_ca / "missing.pem"))
    assert missing.returncode == 2 and "cannot read the CA file" in missing.stderr
    client = Client(cluster.url, cluster.admin_token, retry_s=60, ca=str(other_ca / "ca.pem"))
    began = time.monotonic()
    with pytest.raises(TlsRefused, match="self-signed certificate in certificate chain"):
        client.get("nodes")  # a read is retried while the controller is unreachable, never when it is untrusted
    assert time.monotonic() - began < 10


def test_a_node_with_a_wrong_ca_is_refused_and_keeps_running(cluster, other_ca):
    config = cluster.root / "stranger.toml"
    config.write_text(f'controller_url = "{cluster.url}"\nca_file = "{other_ca / "ca.pem"}"\n'
                      f'cluster_key_file = "{cluster.state_dir}/cluster.key"\nstate_dir = "{cluster.root / "stranger"}"\n'
                      f'name = "stranger"\ngpu_backend = "fake"\nfake_gpus = 1\nmetrics_listen = "off"\n')
    node = Process(["node", "--config", str(config)], cluster.root / "stranger.log")
    cluster.nodes["stranger"] = node  # stopped, and its state cleaned, with the cluster
    wait_for(lambda: node.output().count("does not verify against the CA file") >= 3,
             f"the node to be refused three times\n{node.output()}", timeout=60)
    assert node.alive(), node.output()
    assert "ERROR" in node.output() and "set ca_file in node.toml" in node.output()
    assert cluster.node_state("stranger") is None


def test_a_node_with_an_http_url_is_told_the_controller_serves_tls_only(cluster):
    config = cluster.root / "plain.toml"
    config.write_text(f'controller_url = "http://127.0.0.1:{cluster.port}"\n'
                      f'cluster_key_file = "{cluster.state_dir}/cluster.key"\nstate_dir = "{cluster.root / "plain"}"\n'
                      f'name = "plain"\ngpu_backend = "fake"\nfake_gpus = 1\nmetrics_listen = "off"\n')
    node = Process(["node", "--config", str(config)], cluster.root / "plain.log")
    cluster.nodes["plain"] = node
    wait_for(lambda: "serves TLS only" in node.output(), f"the node to say why\n{node.output()}", timeout=60)
    assert node.alive() and cluster.node_state("plain") is None


def test_the_dashboard_over_https_sets_secure_cookies(cluster, certs):
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    def exchange(method: str, path: str, body: str | None = None, headers: dict | None = None):
        connection = http.client.HTTPSConnection("127.0.0.1", cluster.ui_port, timeout=15, context=context)
        try:
            connection.request(method, path, body, headers or {})
            answer = connection.getresponse()
            return answer.status, answer.getheader("Location"), answer.msg.get_all("Set-Cookie") or [], \
                answer.read().decode()
        finally:
            connection.close()

    status, _, cookies, page = exchange("GET", "/ui/login")
    assert status == 200 and cookies and all("Secure" in c for c in cookies), cookies
    nonce = cookies[0].split(";")[0]
    form = urllib.parse.urlencode({"token": cluster.admin_token, "csrf": csrf_of(page)})
    status, location, cookies, _ = exchange("POST", "/ui/login", form, {
        "Cookie": nonce, "Content-Type": "application/x-www-form-urlencoded"})
    assert status == 303 and location == "/ui/", (status, cookies)
    session = [c for c in cookies if c.startswith("gpud_session=")]
    assert session and "Secure" in session[0] and "HttpOnly" in session[0], cookies
    # And plain HTTP gets nothing from the dashboard's port either.
    connection = http.client.HTTPConnection("127.0.0.1", cluster.ui_port, timeout=10)
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        connection.request("GET", "/ui/login")
        connection.getresponse()
    connection.close()
    controller_log = cluster.controller.output()
    assert f"dashboard on https://127.0.0.1:{cluster.ui_port}/ui/" in controller_log
    assert "without TLS" not in controller_log


def test_tls_needs_both_a_cert_and_a_key(tmp_path):
    path = tmp_path / "controller.toml"
    path.write_text('[tls]\ncert = "c.pem"\n')
    with pytest.raises(ConfigError, match=r"tls\.key: is needed too"):
        load_config(str(path))
    path.write_text('[tls]\ncert = "c.pem"\nkey = "/etc/k.pem"\n')
    config = load_config(str(path))
    assert config.tls and config.tls_cert == str(tmp_path / "c.pem") and config.tls_key == "/etc/k.pem"
    assert config.url.startswith("https://")
    with pytest.raises(ConfigError, match="--tls-cert and --tls-key go together"):
        load_config(None, tls_cert="c.pem")


def test_the_controller_refuses_to_start_with_a_certificate_it_cannot_use(tmp_path, certs, other_ca):
    base = ["controller", "--listen", f"127.0.0.1:{free_port()}", "--state-dir", str(tmp_path / "state"), "--init"]
    missing = gpud(*base, "--tls-cert", str(tmp_path / "none.pem"), "--tls-key", str(certs / "controller.key"))
    assert missing.returncode == 2 and f"cannot read the certificate {tmp_path / 'none.pem'}" in missing.stderr
    mismatch = gpud(*base, "--tls-cert", str(certs / "controller.pem"), "--tls-key", str(other_ca / "ca.key"))
    assert mismatch.returncode == 2
    assert f"the private key {other_ca / 'ca.key'} does not belong to the certificate" in mismatch.stderr
    assert not (tmp_path / "state" / "gpud.sqlite").exists()  # refused before anything was made


def test_a_node_refuses_to_start_with_a_ca_file_it_cannot_read(tmp_path, cluster):
    node = gpud("node", "--controller", cluster.url, "--ca-file", str(tmp_path / "nope.pem"), "--fake-gpus", "1",
                "--cluster-key-file", str(cluster.state_dir / "cluster.key"), "--state-dir", str(tmp_path / "n"),
                "--metrics-listen", "off")
    assert node.returncode == 1 and f"cannot read the CA file {tmp_path / 'nope.pem'}" in node.stderr


@pytest.mark.parametrize("listen, ui, warned", [
    ("127.0.0.1:6830", None, []),
    ("[::1]:6830", None, []),
    ("localhost:6830", None, []),
    ("[::ffff:127.0.0.1]:6830", None, []),
    ("0.0.0.0:6830", None, ["the API listens on 0.0.0.0:6830", "the dashboard listens on 0.0.0.0:6832"]),
    ("ctl.example:6830", "127.0.0.1:6832", ["the API listens on ctl.example:6830"]),
    ("127.0.0.1:6830", "10.1.2.3:8443", ["the dashboard listens on 10.1.2.3:8443"]),
])
def test_listening_beyond_loopback_without_tls_is_warned_about(tmp_path, listen, ui, warned):
    path = tmp_path / "controller.toml"
    ui_table = f'[ui]\nlisten = "{ui}"\n' if ui else ""
    path.write_text(f'listen = "{listen}"\n{ui_table}')
    warnings = load_config(str(path)).plain_http_warnings()
    assert [w.split(" without TLS")[0] for w in warnings] == warned
    checked = gpud("check-config", str(path))
    assert checked.returncode == 0
    assert [line for line in checked.stderr.splitlines() if "without TLS" in line] == \
        [f"gpud check-config: warning: {path}: {w}" for w in warnings]
    path.write_text(f'listen = "{listen}"\n{ui_table}[tls]\ncert = "c.pem"\nkey = "k.pem"\n')
    assert load_config(str(path)).plain_http_warnings() == []
