"""COMPLETING end to end: a preempted job whose old copy traps SIGTERM for its 20 s grace period starts again
only once that copy has ended, measured from the copies' own timestamps.

Real processes: a controller and two node daemons with one fake GPU each.
The victim runs on one node; a reclaim stops it there while the other
node's GPU is about to free up. Each copy of the victim writes a
timestamp when it starts, when it gets SIGTERM, and every 50 ms; the new
copy's first timestamp must come after the old copy's last one.
"""

from __future__ import annotations

import os
import subprocess
import sys

from daemons import LiveCluster, wait_for

GRACE_S = 20
POLICY = f"""\
grace_period = {GRACE_S}
min_runtime = 0

[[projects]]
name = "alpha"
gpu_quota = 1

[[projects]]
name = "beta"
gpu_quota = 1
"""
# Each copy appends "<event> <time>" lines to copy-<restart count>.log; SIGTERM is noted, not obeyed. Written
# with os.write, which takes no lock: the handler may run in the middle of a beat's write.
COPY = ("import os, signal, time\n"
        "fd = os.open(f\"copy-{os.environ['GPUD_RESTART_COUNT']}.log\", os.O_WRONLY | os.O_CREAT | os.O_APPEND)\n"
        "note = lambda kind: os.write(fd, f'{kind} {time.time()}\\n'.encode())\n"
        "signal.signal(signal.SIGTERM, lambda *a: note('term'))\n"
        "note('start')\n"
        "while True:\n"
        "    note('beat')\n"
        "    time.sleep(0.05)\n")


def events(path) -> list[tuple[str, float]]:
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        kind, _, when = line.partition(" ")
        try:
            found.append((kind, float(when)))
        except ValueError:
            pass  # a line cut short by the SIGKILL
    return found


def gpuctl(cluster: LiveCluster, *args: str) -> str:
    env = {**os.environ, "GPUD_URL": cluster.url, "GPUD_TOKEN": cluster.admin_token, "GPUD_TIMEOUT": "10",
           "XDG_CONFIG_HOME": str(cluster.root / "no-config")}
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", *args], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_preempted_job_runs_again_only_after_its_old_copy_has_used_its_grace_and_ended(tmp_path):
    cluster = LiveCluster(tmp_path, policy=POLICY, heartbeat_s=0.3)
    try:
        cluster.start_controller()
        cluster.start_node("n1", gpus=1)
        cluster.start_node("n2", gpus=1)
        release = cluster.workdir / "go"
        holder = cluster.submit(command=["sh", "-c", f"while [ ! -e {release} ]; do sleep 0.1; done"], gpus=1,
                                cpus=0.25, priority="build")
        cluster.wait_state(holder, "RUNNING")
        victim = cluster.submit(command=[sys.executable, "-c", COPY], gpus=1, cpus=0.25)
        old_node = cluster.wait_state(victim, "RUNNING")["nodes"][0]
        old_log, new_log = cluster.workdir / "copy-0.log", cluster.workdir / "copy-1.log"
        wait_for(lambda: ("beat" in {kind for kind, _ in events(old_log)}), "the first copy to run")
        cluster.submit(command=["sleep", "300"], gpus=1, cpus=0.25, project="beta")  # reclaims the victim's GPU
        wait_for(lambda: cluster.job(victim)["restart_count"] == 1, "the victim to be preempted", timeout=60)
        wait_for(lambda: "term" in {kind for kind, _ in events(old_log)}, "the old copy to get its stop signal")
        release.write_text("")  # the holder ends: the other node's GPU is free for the requeued victim
        cluster.wait_state(holder, "COMPLETED", timeout=60)

        waiting = cluster.job(victim)
        assert waiting["state"] == "PENDING", waiting
        assert waiting["reason"].startswith(f"waits for its previous run to end: task 0 on node {old_node}")
        status, why = cluster.api("GET", f"/api/v1/jobs/{victim}/why")
        assert [b["rule"] for b in why["blockers"]] == ["completing"], why
        assert [(s["node"], s["task"]) for s in why["blockers"][0]["stopping"]] == [(old_node, 0)]
        assert "waits for its previous run to end" in gpuctl(cluster, "queue", "--project", "alpha")

        wait_for(lambda: events(new_log), "the new copy to start", timeout=GRACE_S + 60)
        old, new = events(old_log), events(new_log)
        term = next(when for kind, when in old if kind == "term")
        old_end = max(when for _, when in old)
        new_start = min(when for _, when in new)
        overlap = max(0.0, old_end - new_start)
        print(f"grace kept {old_end - term:.2f} s; new copy started {new_start - old_end:.2f} s after the old "
              f"one's last beat; overlap {overlap:.3f} s")
        assert overlap == 0.0
        assert old_end - term >= GRACE_S - 1, "the old copy had its grace period (it traps SIGTERM)"
        assert cluster.job(victim)["state"] == "RUNNING"
    finally:
        cluster.close()
