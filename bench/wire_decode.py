"""How long reading each wire message takes: microseconds per decode of a typical job request, start
order, stop order and task report (gpud.wire), best of five runs.

A heartbeat decodes only the task reports that changed since the last one
(gpud.controller.node_schema.task_reports), a submit one job request, a
node one start order per task.
    python bench/wire_decode.py [--count 20000]
"""

from __future__ import annotations

import argparse
import timeit

from gpud.wire import JobRequest, TaskReport, TaskStart, TaskStop

JOB = {"project": "vision", "workdir": "/home/ann/run", "command": ["python", "train.py", "--epochs", "90"],
       "gpus": 8, "tasks": 4, "cpus": 16, "memory_gib": 128, "priority": "train", "time_limit_s": 86400,
       "env": {"WANDB_PROJECT": "resnet", "NCCL_DEBUG": "WARN"}, "output": "logs/%j.%t.out"}
SPEC = {"user": "ann", "workdir": "/home/ann/run", "command": ["python", "train.py"], "job_name": "train",
        "project": "vision", "job_uid": "ab" * 16, "env": {f"SLURM_VAR_{i}": "x" * 20 for i in range(30)},
        "gpu_uuids": [f"GPU-{i}" for i in range(8)], "gpu_indices": list(range(8)), "gpu_share": 1.0,
        "cpus": 16.0, "memory_gib": 128.0, "time_limit_s": 86400.0, "grace_s": 30.0, "num_tasks": 4,
        "master_addr": "10.0.0.1", "master_port": 29512, "rank": 1, "local_rank": 0, "world_size": 4}
START = {"type": "start", "job": "42", "task": 1, "attempt": 0, "spec": SPEC}
STOP = {"type": "stop", "job": "42", "task": 1, "attempt": 0, "job_uid": "ab" * 16, "reason": "preempted",
        "cause": "stopped", "grace_s": 30.0}
REPORT = {"job": "42", "task": 1, "attempt": 0, "job_uid": "ab" * 16, "state": "exited", "pid": 1234,
          "exit_code": 0, "term_signal": None, "cause": "exited", "reason": "", "started": 1.7e9,
          "ended": 1.7e9 + 60, "max_rss_bytes": 1 << 30, "cpu_s": 120.5}


def main() -> None:
    """Print microseconds per decode of each message."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20000)
    count = parser.parse_args().count
    for name, read, data in (("job request", JobRequest.decode, JOB), ("start order", TaskStart.decode, START),
                             ("stop order", TaskStop.decode, STOP), ("task report", TaskReport.decode, REPORT)):
        best = min(timeit.repeat(lambda: read(data), number=count, repeat=5))
        print(f"{name:12s} {best / count * 1e6:7.1f} us")


if __name__ == "__main__":
    main()
