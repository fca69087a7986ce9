"""The ``SLURM_*`` variables Slurm's sbatch and srun give a task, made from what gpud knows of its job.

Pure functions over plain values: the controller calls them where it builds
a task's start order (node lists in hostlist form come from gpud.hostlist,
which the Slurm command shims import alone). A task sees these beside gpud's
own ``GPUD_*``.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence

from gpud.hostlist import expand_hostlist, hostlist

# The variables this module sets; a job's own environment (copied from a shell inside another job, say)
# never overrides them.
TASK_NAMES = frozenset({
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME", "SLURM_JOB_USER", "SLURM_NTASKS", "SLURM_NPROCS",
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_NUM_NODES", "SLURM_NNODES",
    "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURMD_NODENAME", "SLURM_TASKS_PER_NODE", "SLURM_CPUS_PER_TASK",
    "SLURM_GPUS_ON_NODE", "SLURM_MEM_PER_NODE", "SLURM_SUBMIT_DIR", "SLURM_SUBMIT_HOST", "SLURM_JOB_PARTITION",
    "SLURM_RESTART_COUNT", "SLURM_JOB_ACCOUNT", "SLURM_CLUSTER_NAME"})
ARRAY_PREFIX = "SLURM_ARRAY_"
CLUSTER_NAME = "gpud"


@dataclass(frozen=True, slots=True)
class TaskFacts:
    """What one task's Slurm variables are made of.

    ``nodes`` holds the node of every placed task of the job, in rank order
    (a node twice when two tasks share it); ``procid`` is this task's rank
    among them. ``gpus_on_node`` and ``mem_per_node_mib`` count what the
    job holds on this task's node, all its tasks there together.
    """

    job_id: str
    job_name: str
    user: str
    account: str
    partition: str
    procid: int
    nodes: tuple[str, ...]
    cpus_per_task: float
    gpus_on_node: int
    mem_per_node_mib: int
    submit_dir: str
    submit_host: str
    restart_count: int


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a job's tasks are, as Slurm describes it: made once per placement and shared by its tasks."""

    nodelist: str                   # hostlist form
    node_ids: Mapping[str, int]     # each node's place in the node list
    local_ids: tuple[int, ...]      # each rank's rank among the tasks on its node
    tasks_per_node: str             # SLURM_TASKS_PER_NODE form


@functools.lru_cache(maxsize=64)
def layout(nodes: tuple[str, ...]) -> Layout:
    """The layout of tasks on ``nodes`` (the node of each rank), cached: every task of a gang asks for it."""
    nodelist = hostlist(nodes)
    ordered = expand_hostlist(nodelist)
    counts = Counter(nodes)
    seen: Counter[str] = Counter()
    local_ids = []
    for name in nodes:
        local_ids.append(seen[name])
        seen[name] += 1
    return Layout(nodelist, {name: i for i, name in enumerate(ordered)}, tuple(local_ids),
                  _tasks_per_node([counts[name] for name in ordered]))


def task_vars(facts: TaskFacts) -> dict[str, str]:
    """The per-job and per-task ``SLURM_*`` variables of one task, as sbatch and srun name them.

    ``SLURM_PROCID`` is the task's rank (gpud's ``RANK``), ``SLURM_LOCALID``
    its rank among the job's tasks on the same node, ``SLURM_NODEID`` its
    node's place in the job's node list (``SLURM_JOB_NODELIST``, in Slurm's
    hostlist form), which lists the nodes in rank order: as in Slurm's block
    layout, rank 0 runs on the first node, where ``MASTER_ADDR`` points.
    """
    where = layout(facts.nodes)
    node = facts.nodes[facts.procid]
    cpus = str(max(1, math.ceil(facts.cpus_per_task)))
    return {
        "SLURM_JOB_ID": facts.job_id, "SLURM_JOBID": facts.job_id,
        "SLURM_JOB_NAME": facts.job_name, "SLURM_JOB_USER": facts.user,
        "SLURM_JOB_ACCOUNT": facts.account, "SLURM_JOB_PARTITION": facts.partition,
        "SLURM_CLUSTER_NAME": CLUSTER_NAME,
        "SLURM_NTASKS": str(len(facts.nodes)), "SLURM_NPROCS": str(len(facts.nodes)),
        "SLURM_PROCID": str(facts.procid),
        "SLURM_LOCALID": str(where.local_ids[facts.procid]),
        "SLURM_NODEID": str(where.node_ids[node]),
        "SLURM_JOB_NUM_NODES": str(len(where.node_ids)), "SLURM_NNODES": str(len(where.node_ids)),
        "SLURM_JOB_NODELIST": where.nodelist, "SLURM_NODELIST": where.nodelist, "SLURMD_NODENAME": node,
        "SLURM_TASKS_PER_NODE": where.tasks_per_node,
        "SLURM_CPUS_PER_TASK": cpus,
        "SLURM_GPUS_ON_NODE": str(facts.gpus_on_node),
        "SLURM_MEM_PER_NODE": str(facts.mem_per_node_mib),
        "SLURM_SUBMIT_DIR": facts.submit_dir, "SLURM_SUBMIT_HOST": facts.submit_host,
        "SLURM_RESTART_COUNT": str(facts.restart_count),
    }


@dataclass(frozen=True, slots=True)
class ArraySpan:
    """What every element of one array shares: its size, lowest and highest index, and step."""

    count: int
    low: int
    high: int
    step: int


def array_span(indices: Sequence[int]) -> ArraySpan:
    """The span of an array's indices (made once per array, not per element).

    The step is the common difference of the indices when they have one
    (``0-9:3`` gives 3), else 1, as sbatch sets it for a list.
    """
    ordered = sorted(set(indices))
    if not ordered:
        raise ValueError("an array has at least one index")
    steps = {b - a for a, b in zip(ordered, ordered[1:])}
    return ArraySpan(len(ordered), ordered[0], ordered[-1], steps.pop() if len(steps) == 1 else 1)


def array_vars(array_id: str, index: int, span: ArraySpan) -> dict[str, str]:
    """An array element's ``SLURM_ARRAY_*`` variables."""
    return {"SLURM_ARRAY_JOB_ID": array_id, "SLURM_ARRAY_TASK_ID": str(index),
            "SLURM_ARRAY_TASK_COUNT": str(span.count), "SLURM_ARRAY_TASK_MIN": str(span.low),
            "SLURM_ARRAY_TASK_MAX": str(span.high), "SLURM_ARRAY_TASK_STEP": str(span.step)}


def merged_env(job_env: Mapping[str, str], task: Mapping[str, str], is_array: bool) -> dict[str, str]:
    """A job's environment with its task's Slurm variables laid over it.

    Names this module sets always come from ``task``, and a job that is not
    an array element keeps no ``SLURM_ARRAY_*`` (one copied from the shell it
    was submitted from would name another job). An element's own
    ``SLURM_ARRAY_*`` were set in its environment when it was made.
    """
    out = {k: v for k, v in job_env.items()
           if k not in TASK_NAMES and (is_array or not k.startswith(ARRAY_PREFIX))}
    out.update(task)
    return out


def _tasks_per_node(counts: list[int]) -> str:
    """Slurm's SLURM_TASKS_PER_NODE form: 2,2,1 -> ``2(x2),1``."""
    runs: list[list[int]] = []
    for count in counts:
        if runs and runs[-1][0] == count:
            runs[-1][1] += 1
        else:
            runs.append([count, 1])
    return ",".join(str(c) if n == 1 else f"{c}(x{n})" for c, n in runs)
