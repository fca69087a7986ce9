"""Fencing by lease, end to end: a node that falls silent stops its own tasks before its jobs run elsewhere.

Real processes: a controller, two node daemons with fake GPUs, and jobs
whose every process is watched through /proc. One daemon is stopped
(SIGSTOP) past its lease; in the second test a node daemon runs in a
network namespace this test makes, joined to the host by a veth pair, and
its link is cut and restored. In both, no job ever has two copies alive at
once, the silent node's tasks are stopped by the node itself, and the
node, once it speaks again, goes back up with its down reason cleared.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from daemons import POLICY, LiveCluster, Process, wait_for
from gpud.node import procs

LEASE_S = 2.0
GRACE_S = 1.0
POLICY_FENCED = POLICY.replace("grace_period = 2", f"grace_period = {GRACE_S:g}")
# Ignores the stop signal, so only the SIGKILL after the grace period ends it; every process carries the marker,
# whose value is the cluster's directory: the probes of a fencing test run beside this one (another checkout's
# suite, say) are not this test's copies.
STUBBORN = ["sh", "-c", "trap '' TERM; while true; do sleep 0.1; done"]
MARK = "GPUD_FENCE_PROBE"


class CopyWatch:
    """Samples /proc every few milliseconds: which copies (restart counts) of each of ``cluster``'s probe jobs
    have a live process."""

    def __init__(self, cluster: LiveCluster) -> None:
        self.mark = str(cluster.root)
        self.samples = 0
        self.overlaps: list[tuple[str, tuple[str, ...]]] = []  # (job, the copies alive together)
        self.seen: dict[str, set[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CopyWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def alive(self) -> dict[str, set[str]]:
        """The live copies of each probe job now: job id to the restart counts with a process."""
        copies: dict[str, set[str]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            marks = procs.environ_marks(int(entry), (MARK, "GPUD_JOB_ID", "GPUD_RESTART_COUNT"))
            if marks.get(MARK) == self.mark and procs.same_process(int(entry), None):
                copies.setdefault(marks["GPUD_JOB_ID"], set()).add(marks["GPUD_RESTART_COUNT"])
        return copies

    def _run(self) -> None:
        while not self._stop.is_set():
            for job, copies in self.alive().items():
                self.seen.setdefault(job, set()).update(copies)
                if len(copies) > 1:
                    self.overlaps.append((job, tuple(sorted(copies))))
            self.samples += 1
            time.sleep(0.02)


def _cluster(tmp_path: Path) -> LiveCluster:
    return LiveCluster(tmp_path, policy=POLICY_FENCED, node_timeout_s=LEASE_S, heartbeat_s=0.3)


def _probe(cluster: LiveCluster, **fields) -> str:
    return cluster.submit(command=STUBBORN, env={MARK: str(cluster.root)}, cpus=0.1, **fields)


def _node_view(cluster: LiveCluster, name: str) -> dict:
    status, body = cluster.api("GET", "/api/v1/nodes")
    return next(node for node in body["nodes"] if node["name"] == name)


def _fenced_and_moved(cluster: LiveCluster, watch: CopyWatch, victim: str, other: str, movers: list[str],
                      failed: list[str]) -> None:
    """What must hold once ``victim`` has been silent past its lease: its jobs moved or failed, its tasks gone."""
    for job_id in movers:
        job = cluster.wait_state(job_id, "RUNNING", timeout=40)
        assert job["nodes"] == [other] and job["restart_count"] == 1
        events = [e["message"] for e in job["events"] if e["kind"] == "node failure"]
        assert events and f"node {victim} is down" in events[0]
    for job_id in failed:
        assert cluster.wait_state(job_id, "NODE_FAIL")["reason"].startswith(f"node {victim} is down")
    # The silent node's own tasks were stopped by the node itself, though no stop order reached it.
    wait_for(lambda: not any(job in watch.alive() and "0" in watch.alive()[job] for job in movers + failed),
             "the silent node's tasks to be gone")


@pytest.mark.timeout(120)
def test_a_stopped_node_daemon_stops_its_own_tasks_and_its_jobs_never_run_twice(tmp_path):
    cluster = _cluster(tmp_path)
    try:
        cluster.start_controller()
        cluster.start_node("n1", gpus=4)
        with CopyWatch(cluster) as watch:
            # Two requeueable jobs and a non-preemptible one on n1; n2 joins once they run there.
            movers = [_probe(cluster, gpus=2), _probe(cluster, gpus=1)]
            failed = [_probe(cluster, gpus=1, priority="build", project="beta")]
            for job_id in movers + failed:
                cluster.wait_state(job_id, "RUNNING")
            cluster.start_node("n2", gpus=4)
            wait_for(lambda: all(len(watch.alive().get(j, ())) == 1 for j in movers + failed), "the probes to run")
            daemon = cluster.nodes["n1"]
            os.kill(daemon.pid, signal.SIGSTOP)
            try:
                wait_for(lambda: cluster.node_state("n1") == "down", "the silent node to be marked down")
                _fenced_and_moved(cluster, watch, "n1", "n2", movers, failed)
            finally:
                os.kill(daemon.pid, signal.SIGCONT)
            # Back: up by itself, with no trace of why it was down.
            wait_for(lambda: _node_view(cluster, "n1")["state"] == "up", "the node to be up again")
            assert _node_view(cluster, "n1")["reason"] == ""
            cluster.wait_cycles(2)  # the cycles with the node back start no second copy
        _no_copy_ran_twice(cluster, watch, movers)
    finally:
        cluster.close()


def _no_copy_ran_twice(cluster: LiveCluster, watch: CopyWatch, movers: list[str]) -> None:
    assert watch.samples > 50
    assert watch.overlaps == [], f"jobs ran twice at once: {sorted(set(watch.overlaps))}"
    assert all(watch.seen[j] == {"0", "1"} for j in movers)
    for job_id in movers:
        assert cluster.job(job_id)["state"] == "RUNNING"


class Netns:
    """A network namespace joined to the host by a veth pair, made by this test and removed after it."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.name, self.host_if, self.ns_if = f"gpudt{tag}", f"gh{tag}", f"gn{tag}"
        octet = 16 + os.getpid() % 200
        self.host_addr, self.ns_addr = f"10.231.{octet}.1", f"10.231.{octet}.2"
        self.made = False

    def _ip(self, *args: str, inside: bool = False) -> None:
        argv = ["ip", "netns", "exec", self.name, "ip", *args] if inside else ["ip", *args]
        subprocess.run(argv, check=True, capture_output=True, text=True, timeout=10)

    def create(self) -> None:
        """Make the namespace and the link; raises CalledProcessError (with ip's words) when it cannot."""
        self._ip("netns", "add", self.name)
        self.made = True
        self._ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        self._ip("link", "set", self.ns_if, "netns", self.name)
        self._ip("addr", "add", f"{self.host_addr}/30", "dev", self.host_if)
        self._ip("link", "set", self.host_if, "up")
        self._ip("addr", "add", f"{self.ns_addr}/30", "dev", self.ns_if, inside=True)
        self._ip("link", "set", self.ns_if, "up", inside=True)
        self._ip("link", "set", "lo", "up", inside=True)

    def cut(self) -> None:
        """Cut the link (from the namespace's side: the host keeps its address, its other nodes stay connected)."""
        self._ip("link", "set", self.ns_if, "down", inside=True)

    def restore(self) -> None:
        """Put the link back."""
        self._ip("link", "set", self.ns_if, "up", inside=True)

    def delete(self) -> None:
        """Remove the link and the namespace."""
        if self.made:
            subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=10)
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=10)


@pytest.fixture
def netns():
    """A fresh namespace and link; the test is skipped, saying why, where the host cannot make one."""
    if os.geteuid() != 0:
        pytest.skip("making a network namespace needs root")
    if shutil.which("ip") is None:
        pytest.skip("the ip command (iproute2) is not installed")
    ns = Netns()
    try:
        ns.create()
    except subprocess.CalledProcessError as exc:
        ns.delete()
        pytest.skip(f"this host cannot make a network namespace with a veth pair: {exc.stderr.strip()}")
    try:
        yield ns
    finally:
        ns.delete()


class NetnsProcess(Process):
    """A daemon run inside a network namespace (``ip netns exec`` execs it, so its pid is the daemon's)."""

    def __init__(self, ns: str, argv: list[str], log: Path) -> None:
        self.log = log
        self._out = open(log, "ab")
        self.popen = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "gpud.cli.gpud_main",
                                       *argv], stdout=self._out, stderr=subprocess.STDOUT)
        self.pid = self.popen.pid


class NetnsCluster(LiveCluster):
    """A LiveCluster whose controller listens on the host's end of the veth link; nodes may run in the namespace."""

    def __init__(self, root: Path, ns: Netns) -> None:
        super().__init__(root, policy=POLICY_FENCED, node_timeout_s=LEASE_S, heartbeat_s=0.3)
        self.ns = ns
        self.url = f"http://{ns.host_addr}:{self.port}"
        self.config.write_text(self.config.read_text().replace(f'"127.0.0.1:{self.port}"',
                                                               f'"{ns.host_addr}:{self.port}"'))

    def start_node_in_netns(self, name: str, gpus: int) -> Process:
        """Start a node daemon inside the namespace; wait until the controller lists it up."""
        config = self.root / f"{name}.toml"
        config.write_text(f'controller_url = "{self.url}"\ncluster_key_file = "{self.state_dir}/cluster.key"\n'
                          f'state_dir = "{self.root / name}"\nname = "{name}"\nreconnect_max_s = 1\n'
                          f'metrics_listen = "off"\ngpu_backend = "fake"\nfake_gpus = {gpus}\n')
        process = NetnsProcess(self.ns.name, ["node", "--config", str(config), "--log-level", "info"],
                               self.root / f"{name}.log")
        self.nodes[name] = process
        wait_for(lambda: self.node_state(name) == "up", f"node {name} to register\n{process.output()}")
        return process


@pytest.mark.timeout(150)
def test_a_node_cut_off_by_a_network_partition_stops_its_own_tasks_and_no_job_runs_twice(tmp_path, netns):
    cluster = NetnsCluster(tmp_path, netns)
    try:
        cluster.start_controller()
        daemon = cluster.start_node_in_netns("n1", gpus=4)
        with CopyWatch(cluster) as watch:
            movers = [_probe(cluster, gpus=2), _probe(cluster, gpus=1)]
            failed = [_probe(cluster, gpus=1, priority="build", project="beta")]
            for job_id in movers + failed:
                cluster.wait_state(job_id, "RUNNING")
            cluster.start_node("n2", gpus=4)
            wait_for(lambda: all(len(watch.alive().get(j, ())) == 1 for j in movers + failed), "the probes to run")
            netns.cut()
            try:
                wait_for(lambda: cluster.node_state("n1") == "down", "the cut-off node to be marked down")
                _fenced_and_moved(cluster, watch, "n1", "n2", movers, failed)
                assert daemon.alive(), "the cut-off daemon runs on"
            finally:
                netns.restore()
            wait_for(lambda: _node_view(cluster, "n1")["state"] == "up", "the node to be up again", timeout=40)
            assert _node_view(cluster, "n1")["reason"] == ""
            cluster.wait_cycles(2)  # the cycles with the node back start no second copy
        _no_copy_ran_twice(cluster, watch, movers)
        assert "lease ran out" in daemon.output()
    finally:
        cluster.close()
