"""The commands the controller sends nodes: start a task (with everything it needs to run), stop, purge, ack."""

from __future__ import annotations

from typing import Mapping

from gpud import slurm_env
from gpud.controller.nodes import NodeRecord
from gpud.jobs import Job, TaskRun, job_uid
from gpud.policy import TimeSlicing
from gpud.task_defaults import DEFAULT_TASK_PIDS_MAX
from gpud.wire.task import MemorySliceSpec, TaskSpec, TaskStart, TaskStop, TimeSlicingSpec

MASTER_PORT_BASE = 29500
MASTER_PORT_SPAN = 2000


def start_command(job: Job, task: int, run: TaskRun, node: NodeRecord, nodes: Mapping[str, NodeRecord],
                grace_s: float, slicing: TimeSlicing | None = None, pids_max: int | None = None,
                checkpoint_token: str = "") -> dict:
    """A ``start`` message for one task incarnation (docs/api.md, node WebSocket).

    A task that shares its GPU also gets its memory slice and, when the
    policy's ``slicing`` mode is strict or fair, its compute share. ``pids_max`` caps the processes and
    threads the task may have at once (the node's own default when None).
    """
    placement = run.placement
    assert placement is not None, "a start command is for a placed task"
    first = next((r.placement for r in job.runs if r.placement is not None), placement)
    master = nodes.get(first.node)
    local_rank = sum(1 for r in job.runs[:task] if r.placement is not None and r.placement.node == placement.node)
    time_limit = job.time_limit_s
    if time_limit is not None and job.started is not None and run.since is not None:
        time_limit = max(1.0, time_limit - (run.since - job.started))
    memory_slice, time_slicing = sharing_spec(job, placement, node, slicing or TimeSlicing())
    spec = TaskSpec(
        user=job.user, allow_root=job.allow_root, workdir=job.workdir, interactive=job.interactive,
        command=tuple(job.command) if job.command is not None else None, script=job.script,
        env=slurm_env.merged_env(job.env, slurm_task_vars(job, task, node), job.array_id is not None),
        job_name=job.name, project=job.project, job_uid=job_uid(job),
        gpu_uuids=tuple(node.uuids(placement.gpu_index)), gpu_indices=tuple(placement.gpu_index),
        gpu_share=placement.gpu_share, cpus=job.cpus, memory_gib=job.memory_gib,
        time_limit_s=time_limit, stop_signal=job.stop_signal, grace_s=grace_s,
        output=job.output, error=job.error, num_tasks=job.tasks, restart_count=job.restart_count,
        warn_signal=job.warn_signal, warn_lead_s=job.warn_lead_s, warn_batch_only=job.warn_batch_only,
        last_checkpoint=job.last_checkpoint, checkpoint_token=checkpoint_token,
        master_addr=(master.address if master is not None and master.address else first.node),
        master_port=MASTER_PORT_BASE + job.seq % MASTER_PORT_SPAN,
        # An elastic gang runs with the tasks it has: ranks 0..n-1 among them, WORLD_SIZE n (it restarts on a resize).
        rank=sum(1 for r in job.runs[:task] if r.placement is not None), local_rank=local_rank,
        world_size=sum(1 for r in job.runs if r.placement is not None),
        pids_max=pids_max if pids_max is not None else DEFAULT_TASK_PIDS_MAX,
        memory_slice=memory_slice, time_slicing=time_slicing)
    return TaskStart(job=job.id, task=task, attempt=run.attempt, spec=spec).to_json()


def slurm_task_vars(job: Job, task: int, node: NodeRecord) -> dict[str, str]:
    """The ``SLURM_*`` variables of one placed task of ``job`` (running on ``node``), as sbatch and srun set them.

    The submit directory and host are the client's (the sbatch command puts
    them in the job's environment); a job submitted without them gets its
    workdir and the node of its first task.
    """
    placed = [(i, r.placement) for i, r in enumerate(job.runs) if r.placement is not None]
    nodes = tuple(p.node for _, p in placed)
    here = [p for _, p in placed if p.node == node.name]
    facts = slurm_env.TaskFacts(
        job_id=job.id, job_name=job.name, user=job.user, account=job.project, partition=node.pool,
        procid=next(rank for rank, (i, _) in enumerate(placed) if i == task), nodes=nodes,
        cpus_per_task=job.cpus, gpus_on_node=len({g for p in here for g in p.gpu_index}),
        mem_per_node_mib=round(job.memory_gib * 1024 * len(here)),
        submit_dir=job.env.get("SLURM_SUBMIT_DIR") or job.workdir,
        submit_host=job.env.get("SLURM_SUBMIT_HOST") or nodes[0], restart_count=job.restart_count)
    return slurm_env.task_vars(facts)


def sharing_spec(job: Job, placement, node: NodeRecord,
                 slicing: TimeSlicing) -> tuple[MemorySliceSpec | None, TimeSlicingSpec | None]:
    """The memory slice and the time-slicing of a task sharing one GPU (None for whole GPUs)."""
    share = placement.gpu_share
    if len(placement.gpu_index) != 1 or share >= 1.0:
        return None, None
    gpu_memory = next((g.memory_gib for g in node.gpus if g.index == placement.gpu_index[0]), None)
    limit_gib = job.gpu_memory_gib if job.gpu_memory_gib is not None else (
        share * gpu_memory if gpu_memory else None)
    memory_slice = time_slicing = None
    if limit_gib:
        memory_slice = MemorySliceSpec(limit_mib=round(limit_gib * 1024.0, 1), fraction=round(share, 6),
                                       tolerance=slicing.memory_tolerance, grace_s=slicing.memory_grace_s,
                                       enforce=slicing.memory_enforce)
    if slicing.sliced:
        request, limit = slicing.compute(job.gpus, job.gpu_memory_gib, job.gpu_compute_request,
                                         job.gpu_compute_limit)
        request = min(request, share)
        time_slicing = TimeSlicingSpec(mode=slicing.mode, lease_ms=slicing.lease_ms,
                                       precision=slicing.precision, request=request,
                                       limit=max(request, limit))
    return memory_slice, time_slicing


def stop_command(job_id: str, task: int, attempt: int, reason: str, grace_s: float, job_uid: str = "", *,
                 signal: str | None = None, leader_only: bool = False, hasten: bool = False) -> dict:
    """A ``stop`` message: the stop signal to the task's process group, SIGKILL after ``grace_s``.

    ``job_uid`` names which job of that id (nodes key tasks by it); "" leaves it to the node. ``signal``
    is sent in place of the task's stop signal (a victim's ``--signal``), to its first process alone
    with ``leader_only``. A stop said again keeps the grace of the first, unless ``hasten`` (the job itself
    told that it may stop now, e.g. by reporting its checkpoint) lets it end the grace sooner.
    """
    return TaskStop(job=job_id, task=task, attempt=attempt, job_uid=job_uid, reason=reason, grace_s=grace_s,
                    signal=signal, leader_only=leader_only, hasten=hasten).to_json()


def ack_command(job_id: str, task: int, attempt: int, job_uid: str = "") -> dict:
    """An ``ack`` message: the controller has recorded the task's exit, the node may forget it."""
    command: dict = {"type": "ack", "job": job_id, "task": task, "attempt": attempt}
    if job_uid:
        command["job_uid"] = job_uid
    return command


def purge_command(job: Job) -> dict:
    """A ``purge`` message: the job has ended for good, so the node deletes its checkpoint directory."""
    return {"type": "purge", "job": job.id, "job_uid": job_uid(job)}
