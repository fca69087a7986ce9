"""The tables and texts gpuctl prints for people, from API answers."""

import time

from gpud.cli import render
from gpud.cli.job_cmd import describe, show_text, why_text
from gpud.cli.nodes_cmd import nodes_text, pools_table
from gpud.cli.projects_cmd import projects_table
from gpud.cli.queue_cmd import history_table, queue_table

NOW = time.mktime((2024, 5, 1, 12, 0, 0, 0, 0, -1))


def job(**fields):
    base = {"id": "42", "name": "train", "user": "alice", "project": "vision", "state": "PENDING",
            "reason": "", "priority_class": "train", "priority": 50, "gpus": 1, "gpu_memory_gib": None,
            "tasks": 1, "min_tasks": 1, "cpus": 1, "memory_gib": 1, "constraint": {}, "pool": None,
            "workdir": "/home/alice", "command": ["python", "train.py"], "script": None, "env": {},
            "time_limit_s": None, "array_id": None, "array_index": None, "array_limit": None, "depends": [],
            "hold": False, "requeue": True, "stop_signal": "TERM", "output": "gpud-%j.out", "error": None,
            "submitted": NOW - 100, "started": None, "ended": None, "restart_count": 0, "exit_code": None,
            "term_signal": None, "nodes": [], "placements": [None], "gpu_hours": 0.0}
    return {**base, **fields}


def test_table_aligns_columns_and_trims_trailing_space():
    assert render.table(["A", "LONG"], [["xx", None], ["y", 3]]) == "A   LONG\nxx\ny   3"


def test_gpu_cells():
    assert render.gpus(job(gpus=2)) == "2"
    assert render.gpus(job(gpus=0.5)) == "0.5"
    assert render.gpus(job(gpus=8, tasks=4)) == "4x8"
    assert render.gpus(job(gpus=0, gpu_memory_gib=20)) == "20G"
    assert render.gpus(job(gpus=0)) == "0"


def test_node_exit_and_time_cells():
    assert render.nodes(job(nodes=["n1", "n2", "n1"])) == "n1,n2"
    assert render.nodes(job()) == "-"
    assert render.exit_status(job(exit_code=0)) == "0"
    assert render.exit_status(job(exit_code=None, term_signal=9)) == "signal 9"
    assert render.exit_status(job()) == "-"
    assert render.elapsed(job(started=NOW - 3723), NOW) == "1:02:03"
    assert render.elapsed(job(started=NOW - 100, ended=NOW - 40), NOW) == "1:00"
    assert render.elapsed(job(), NOW) == "0:00"
    assert render.when(NOW - 60, NOW) == "11:59:00"
    assert render.when(NOW - 86400 * 2, NOW) == "2024-04-29 12:00"
    assert render.when(None) == "-"
    assert [render.gpu_hours(v) for v in (None, 0, 0.001, 0.006, 12.345)] == ["-", "0", "<0.01", "0.01", "12.35"]


def test_queue_table():
    text = queue_table([job(reason="over quota: 8 of 8 GPUs in use"),
                        job(id="43", name="x" * 40, state="RUNNING", started=NOW - 65, nodes=["n3"], gpus=8,
                            tasks=2)], NOW)
    lines = text.splitlines()
    assert lines[0].split() == ["ID", "NAME", "USER", "PROJECT", "STATE", "TIME", "GPUS", "NODES", "REASON"]
    assert lines[1].split()[:8] == ["42", "train", "alice", "vision", "PENDING", "0:00", "1", "-"]
    assert lines[1].endswith("over quota: 8 of 8 GPUs in use")
    assert lines[2].split() == ["43", "x" * 23 + "~", "alice", "vision", "RUNNING", "1:05", "2x8", "n3"]


def test_history_table():
    done = job(state="COMPLETED", started=NOW - 7200, ended=NOW - 3600, exit_code=0, nodes=["n1"],
               gpu_hours=1.0, max_rss_bytes=180 * 2**20, cpu_s=83.25)
    killed = job(id="44", state="CANCELLED", started=NOW - 60, ended=NOW - 30, term_signal=15, gpu_hours=0.00833)
    lines = history_table([done, killed], NOW).splitlines()
    assert lines[0].split() == ["ID", "NAME", "USER", "PROJECT", "STATE", "STARTED", "ENDED", "ELAPSED", "NODES",
                                "GPU-HOURS", "MAXRSS", "TOTALCPU", "EXIT"]
    day = time.strftime("%Y-%m-%d", time.localtime(NOW))
    assert lines[1].split() == ["42", "train", "alice", "vision", "COMPLETED", f"{day}T10:00:00", f"{day}T11:00:00",
                                "1:00:00", "n1", "1", "180M", "01:23.250", "0"]
    assert lines[2].split()[-5:] == ["0.01", "-", "-", "signal", "15"]
    assert history_table([job(gpu_hours=0.0001)], NOW).splitlines()[1].split()[-4] == "<0.01"


def test_show_text_gives_peak_memory_cpu_time_and_the_limits_that_held():
    ended = job(state="FAILED", started=NOW - 60, ended=NOW - 30, nodes=["n1"], max_rss_bytes=200 * 2**20,
                cpu_s=1.5, limits={"enforced": ["memory", "cpu", "cpuset", "pids", "devices"], "how": "cgroup v1"})
    text = show_text(ended, NOW)
    assert "MaxRSS:      200M" in text and "TotalCPU:    00:01.500" in text
    assert "Limits:      memory, cpu, cpuset, pids, devices (cgroup v1)" in text
    bare = show_text(job(state="RUNNING", started=NOW - 5, nodes=["n1"], limits={"enforced": [], "how": "none"}), NOW)
    assert "Limits:      not enforced" in bare


def test_show_text_lists_what_is_set_and_the_events():
    text = show_text(job(state="RUNNING", started=NOW - 61, nodes=["n1"], tasks=2, min_tasks=1, gpus=4,
                         constraint={"gpu": "h100"}, time_limit_s=5400, depends=["afterok:41"],
                         placements=[{"node": "n1", "gpus": [0, 1, 2, 3], "share": 1.0}, None],
                         events=[{"time": NOW - 61, "kind": "requeued", "message": "its node stopped answering",
                                  "node": "n1"}]), NOW)
    assert "Job:         42" in text
    assert "GPUs:        2x4 (tasks x per task)" in text
    assert "Tasks:       2 (at least 1)" in text
    assert "Constraint:  gpu=h100" in text
    assert "Time limit:  1:30:00" in text
    assert "Depends:     afterok:41" in text
    assert "Elapsed:     1:01" in text
    assert "Exit:" not in text and "Held:" not in text
    assert "Tasks:\n  TASK  NODE  GPUS     SHARE\n  0     n1    0,1,2,3  1\n  1     -     -        -" in text
    assert "11:58:59  requeued: its node stopped answering (on n1)" in text


def test_show_names_the_output_file_and_each_node_once():
    text = show_text(job(state="RUNNING", events=[{"time": NOW - 5, "kind": "started", "message": "started on vm",
                                                   "node": "vm"}]), NOW)
    assert "Output:      /home/alice/gpud-42.out" in text
    assert "started: started on vm\n" in text + "\n" and "(on vm)" not in text
    gang = show_text(job(tasks=4, gpus=1, output="logs/%j.%t.out", error="/dev/null"), NOW)
    assert "Output:      /home/alice/logs/42.%t.out (%t: each task, 0 to 3)" in gang
    assert "Error:       /dev/null" in gang
    assert "Output:      /home/alice/100%-42.0.out" in show_text(job(output="100%%-%j.%t.out"), NOW)


def test_show_text_of_a_script_job():
    text = show_text(job(command=None, script="#!/bin/sh\n#GPUD --gpus 1\nset -e\npython x.py\n"), NOW)
    assert "Script:      set -e ..." in text


def test_why_text():
    text = why_text({"id": "42", "state": "PENDING", "reason": "over quota",
                     "blockers": ["project vision: 8 GPUs allocated, quota 8", {"message": "fragmented", "free": 3}],
                     "would_start": ["idle GPUs in the pool"]})
    assert text == ("job 42 is PENDING: over quota\n\nBlocked by:\n  - project vision: 8 GPUs allocated, quota 8\n"
                    "  - fragmented (free=3)\n\nIt would start if:\n  - idle GPUs in the pool")
    assert why_text({"id": "7", "state": "RUNNING", "reason": "", "blockers": [], "would_start": []}) == \
        "job 7 is RUNNING"


def test_describe_odd_shapes():
    assert describe({"free": 0.5, "nodes": ["a", "b"], "need": {"gpu": 2}}) == "free=0.5, nodes=a,b, need={gpu=2}"
    assert describe(3) == "3"


def node(name, state="up", used=0.0, gpus=8, pool="default", reason="", healthy=True, per_gpu=None, cpus_used=0.0,
         memory_used=0.0):
    per_gpu = per_gpu or [min(1.0, max(0.0, used - i)) for i in range(gpus)]  # whole GPUs first, then a fraction
    return {"name": name, "pool": pool, "state": state, "reason": reason, "labels": {}, "cpus": 64,
            "memory_gib": 512, "cpus_used": cpus_used, "memory_used_gib": memory_used,
            "gpus": [{"index": i, "uuid": f"GPU-{i}", "model": "H100", "memory_gib": 80,
                      "healthy": healthy or i > 0, "used": per_gpu[i]} for i in range(gpus)],
            "gpus_used": sum(per_gpu), "gpus_idle": gpus - sum(per_gpu), "last_seen": NOW - 2}


def test_nodes_text_shows_use_state_and_reason():
    text = nodes_text([node("n1", used=2.5, cpus_used=12, memory_used=96),
                       node("n2", state="drained", reason="ECC errors", healthy=False)], NOW)
    lines = text.splitlines()
    assert lines[0].split() == ["NODE", "POOL", "STATE", "GPUS", "USED", "IDLE", "MODEL", "CPUS", "USED", "MEMORY",
                                "USED", "SEEN", "REASON"]
    assert lines[1].split() == ["n1", "default", "up", "2.5/8", "5", "+0.5", "shared", "H100", "12/64", "96G/512G",
                                "2s", "ago"]
    assert lines[2].split()[6:8] == ["0/64", "0/512G"]
    assert lines[2].endswith("ECC errors; 1 GPU unhealthy")
    assert "drained" in lines[2]


def test_idle_counts_whole_gpus_apart_from_the_room_on_shared_ones():
    mixed = node("n1", per_gpu=[0.5, 0.7, 0, 0, 0, 0, 0, 0])
    row = nodes_text([mixed], NOW).splitlines()[1].split()
    assert row[3:7] == ["1.2/8", "6", "+0.8", "shared"]  # not 6.8 idle: only 6 GPUs can take a whole-GPU job
    assert nodes_text([node("n2", used=3)], NOW).splitlines()[1].split()[3:5] == ["3/8", "5"]
    assert pools_table([mixed, node("n2", used=3)]).splitlines()[1].split() == [
        "default", "2", "2", "16", "4.2", "11", "+0.8", "shared", "0"]


def test_pools_table_totals_per_pool():
    text = pools_table([node("a", used=8), node("b", state="down"), node("c", pool="h100", gpus=4, used=1)])
    assert text.splitlines()[1:] == ["default  2      1   16    8     8     8", "h100     1      1   4     1     3     0"]


def queue(name, kind="project", department="d1", pool="default", gpu=(4, 6.5, 4, 8), pending=2, running=1):
    quota, fair, allocated, demand = gpu
    res = lambda g: {"gpu": g, "cpu": None, "memory": 64}  # noqa: E731
    return {"name": name, "kind": kind, "pool": pool, "department": department if kind == "project" else None,
            "quota": res(quota), "fair_share": res(fair), "allocated": res(allocated), "demand": res(demand),
            "pending_jobs": pending, "running_jobs": running}


def test_projects_table_puts_projects_under_their_department():
    text = projects_table([queue("p2"), queue("d1", kind="department", gpu=(8, 13, 8, 16)), queue("p1"),
                           queue("solo", department="default")])
    assert [line.split()[:3] for line in text.splitlines()] == [
        ["POOL", "QUEUE", "KIND"], ["default", "d1", "department"], ["default", "p2", "project"],
        ["default", "p1", "project"], ["default", "solo", "project"]]
    assert "  p2" in text
    assert text.splitlines()[2].split()[3:] == ["4", "6.5", "4", "8", "2", "1"]
    cpu = projects_table([queue("p1")], "cpu").splitlines()[1].split()
    assert cpu[3:7] == ["-", "-", "-", "-"]
    assert projects_table([queue("p1")], "memory").splitlines()[1].split()[3:6] == ["64G", "64G", "64G"]


def test_show_says_whether_a_shared_gpus_compute_and_memory_are_enforced():
    from gpud.cli.job_cmd import show_text

    job = {"id": "7", "state": "RUNNING", "command": ["python", "x.py"], "gpus": 0.25, "sharing": {
        "compute": {"mode": "fair", "request": 0.25, "limit": 1.0, "enforced": True,
                    "how": "fair time-slicing by the node: leases of 250 ms in plans of 5 s"},
        "memory": {"limit_gib": 20.0, "enforced": False, "how": "advisory: the node only warns past the slice +5%"}}}
    text = show_text(job, now=0.0)
    assert "Compute:" in text and "25%..100% of the GPU, enforced (fair time-slicing" in text
    assert "20 GiB slice, advisory (advisory: the node only warns" in text


def test_queue_folds_an_array_into_one_row_with_its_counts():
    from gpud.cli.queue_cmd import collapse_arrays

    def element(i, state):
        return {"id": f"7_{i}", "array_id": "7", "array_index": i, "state": state, "name": "sweep",
                "reason": "waits" if state == "PENDING" else "", "nodes": ["n1"] if state == "RUNNING" else [],
                "started": NOW - 5 if state == "RUNNING" else None}
    jobs = [{"id": "6", "state": "PENDING"}] + [element(i, "RUNNING" if i < 2 else "PENDING")
                                                for i in (0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 15, 16)]
    rows = collapse_arrays(jobs, {"7": {"states": {"RUNNING": 2, "PENDING": 10, "COMPLETED": 3}}}, NOW)
    assert [r["id"] for r in rows] == ["6", "7_[0-8,12,15-16]"]
    assert rows[1]["state"] == "RUNNING" and rows[1]["nodes"] == ["n1", "n1"] and rows[1]["time_text"] == "0:05"
    assert rows[1]["reason"] == "2 running, 10 pending, 3 completed; 7_2: waits"
