"""How long a task's SLURM_* variables take to make, for every task of a large gang.

The controller makes them in each task's start order; a gang's tasks share
one layout (hostlist, node ids, tasks per node). Prints the time per task
over all ranks of a gang of --tasks tasks, --per-node to a node.
    python bench/slurm_env.py [--tasks 10000] [--per-node 8]
"""

from __future__ import annotations

import argparse
import time

from gpud.slurm_env import TaskFacts, layout, task_vars


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--per-node", type=int, default=8)
    args = parser.parse_args()
    nodes = tuple(f"node{rank // args.per_node:05d}" for rank in range(args.tasks))
    layout.cache_clear()
    start = time.perf_counter()
    for rank in range(args.tasks):
        task_vars(TaskFacts("1", "train", "ann", "vision", "default", rank, nodes, 4.0, 8, 65536, "/home/ann",
                            "login1", 0))
    elapsed = time.perf_counter() - start
    print(f"{args.tasks} tasks on {len(set(nodes))} nodes: {elapsed:.2f} s in all, "
          f"{elapsed / args.tasks * 1000:.3f} ms per task")


if __name__ == "__main__":
    main()
