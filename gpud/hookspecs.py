"""Every hook a gpud plugin may implement, grouped by the phase that calls it.

Hooks answer questions and return values; they never change scheduler state
and never do I/O inside the scheduling core. A hook marked *first result*
stops at the first plugin that returns something other than None; plugins
registered later are asked first, so a third-party plugin overrides a
built-in one by answering the same question.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping

import pluggy

if TYPE_CHECKING:
    from gpud.core.state import NodeIndex, NodeState, QueueState, Victim
    from gpud.model import JobSpec, TaskRequest
    from gpud.node.slicer import Holder

hookspec = pluggy.HookspecMarker("gpud")


# --- Placement -----------------------------------------------------------------------------------

@hookspec
def gpud_placement_strategies() -> Iterable[str]:
    """Name the placement strategies this plugin implements.

    Called once when the policy is checked. Returns an iterable of names
    (e.g. ``["binpack"]``); the policy may use any name some plugin returns.
    Results of all plugins are combined.
    """


@hookspec(firstresult=True)
def gpud_node_candidates(strategy: str, request: TaskRequest,
                         index: NodeIndex) -> Iterator[NodeState] | None:
    """Order the nodes one task could go to, best first.

    Called for every task the scheduler places. ``strategy`` is the pool's
    strategy name (for GPU tasks the pool's ``placement``, for CPU-only tasks
    its ``cpu_placement``); ``request`` is the task's request; ``index`` is the
    pool's index of nodes by free capacity. Return an iterator of candidate
    nodes (lazily: the scheduler stops at the first that fits), or None when
    the strategy is not this plugin's. The scheduler still checks that the
    task fits each candidate. First result.
    """


@hookspec(firstresult=True)
def gpud_gpu_order(strategy: str, request: TaskRequest, node: NodeState) -> list[int] | None:
    """Order the GPUs of one node for a task, best first.

    Called once a node is chosen for a GPU task. ``strategy`` is the pool's
    ``gpu_placement``. Return GPU indices in order of preference (the scheduler
    takes the first ones that have room), or None when the strategy is not
    this plugin's; when no plugin answers, the lowest free indices are taken.
    First result.
    """


@hookspec
def gpud_filter_node(job: JobSpec, node: NodeState) -> str | None:
    """Veto a node for a job.

    Called for each candidate node the scheduler examines for a job's task,
    after its own checks (pool, labels, free capacity) passed. Return a short
    reason (e.g. ``"node is draining"``) to refuse the node, or None to accept
    it. Results of all plugins are combined: any reason refuses the node.
    """


# --- Ordering ------------------------------------------------------------------------------------

@hookspec(firstresult=True)
def gpud_job_order_key(job: JobSpec) -> Any:
    """Give the sort key of a pending job inside its queue (smaller runs first).

    Called once per pending job per cycle. The built-in key is higher
    priority first, then earlier submission. First result.
    """


@hookspec(firstresult=True)
def gpud_queue_order_key(queue: QueueState, job: JobSpec, need: Any) -> Any:
    """Give the sort key of a queue (a project or department in one pool) whose next job is ``job``.

    Called whenever a queue's next job or allocation changes during
    allocation. ``need`` is the job's total pending request (a
    ``gpud.model.Resources``). The queue with the smallest key is served
    first, at each level of the hierarchy (departments, then projects).
    First result.
    """


@hookspec(firstresult=True)
def gpud_victim_order_key(victim: Victim) -> Any:
    """Give the sort key of a running job that may be evicted (smaller goes first).

    Called when reclaim, preemption or consolidation lists candidate victims.
    The built-in key is lowest priority first, then most recently started.
    First result.
    """


# --- Eviction ------------------------------------------------------------------------------------

@hookspec
def gpud_can_evict(victim: Victim, preemptor: JobSpec, rule: str) -> str | None:
    """Veto the eviction of a running job.

    Called for each candidate victim after the scheduler's own rules allowed
    it. ``rule`` is ``"reclaim"``, ``"preempt"`` or ``"consolidate"``. Return
    a short reason to protect the victim, or None to allow the eviction.
    Results of all plugins are combined: any reason protects the victim.
    """


# --- Sharing a GPU (node daemon) -------------------------------------------------------------------

@hookspec(firstresult=True)
def gpud_time_slice_plan(gpu_index: int, mode: str, holders: list[Holder], probe: float) -> Mapping[str, float] | None:
    """Give the share of the next plan each task sharing a GPU should hold it.

    Called by the node daemon before every plan (every ``lease_ms /
    precision``) of a time-sliced GPU. ``gpu_index`` is the GPU on the node;
    ``mode`` is the policy's ``"strict"`` or ``"fair"``; ``holders`` are
    ``gpud.node.slicer.Holder`` values (task key, compute ``request`` and
    ``limit``, ``project``, whether it was ``idle`` in the last plan);
    ``probe`` is the share of one lease, what an idle task keeps so it is
    noticed when it works again. Return a mapping of holder key to a share
    of the plan (each in [0, 1], together at most 1; time left over idles
    the GPU), or None to leave the plan to the next plugin. The node
    interleaves the leases and corrects each share by what earlier plans
    owed. First result.
    """


@hookspec
def gpud_memory_slice_env(gpu_uuid: str, limit_mib: float, fraction: float) -> Mapping[str, str] | None:
    """Give environment variables that have the driver enforce a task's GPU memory slice.

    Called by the node daemon when it starts a task holding a slice of one
    GPU's memory (a fraction or ``gpu_memory_gib`` job). ``gpu_uuid`` is the
    GPU, ``limit_mib`` the slice in MiB, ``fraction`` the slice as a part of
    the GPU. Return variables to add to the task's environment (where CUDA
    MPS runs, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``), or None. Results of all
    plugins are combined; when two set the same variable, the plugin
    registered later wins. The node's memory watchdog keeps watching either
    way.
    """


# --- Lifecycle -----------------------------------------------------------------------------------

@hookspec
def gpud_job_event(event: str, job: JobSpec, detail: dict) -> None:
    """Observe a job lifecycle event, for notifications and accounting.

    Called by the controller (never by the scheduling core) after the event
    is recorded, on a worker thread and in event order, so an implementation
    may block on I/O (a webhook, a database) without delaying scheduling.
    ``event`` is one of ``"submitted"``, ``"started"``, ``"finished"`` (any
    end state, PREEMPTED without requeue included), ``"preempted"`` (the
    eviction); ``detail`` holds ``message``, ``state``, ``user``, ``name``,
    ``nodes``, ``exit_code``, ``term_signal``, ``reason`` and
    ``restart_count``. Return value ignored.
    """
