"""Every hook a gpud plugin may implement, grouped by the phase that calls it.

Hooks answer questions and return values; they never change scheduler state
and never do I/O inside the scheduling core. A hook marked *first result*
stops at the first plugin that returns something other than None; plugins
registered later are asked first, so a third-party plugin overrides a
built-in one by answering the same question.

The scheduler reads the implementations of the order and placement hooks
once, when it builds its state (gpud.core.policy_set): a plugin that is an
object of the core's policy class for the hook (the built-ins are) is
called through its method (``key``, ``candidates``, ``gpu_order``) rather
than its hook, and a strategy object only for the strategies it names.

Every function a plugin marks with ``gpud.hookimpl`` must be one of these
hooks, with argument names taken from its spec: gpud refuses, when the
plugins load, a plugin with an implementation no spec declares (a misspelt
hook would otherwise never be called).
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

    Called when the plugins and the policy are loaded (controller start,
    policy reload, ``gpud check-config``, ``gpuctl simulate``), to check the
    policy's strategy names. Returns an iterable of names (e.g.
    ``["binpack"]``); the policy may use any name some plugin returns.
    Results of all plugins are combined.
    """
    raise NotImplementedError  # pluggy never runs a spec's body: the plugins give it


@hookspec(firstresult=True)
def gpud_node_candidates(strategy: str, request: TaskRequest,
                         index: NodeIndex) -> Iterator[NodeState] | None:
    """Order the nodes one task could go to, best first.

    Called when the scheduler searches a pool for one task's node, during
    allocation, reclaim, preemption and consolidation; not when the pool's
    free totals already show no room, nor (without ``gpud_filter_node``
    plugins) for a request that found no room until something is released.
    ``strategy`` is the pool's strategy name (for GPU tasks the pool's
    ``placement``, for CPU-only tasks its ``cpu_placement``); ``request`` is
    the task's request; ``index`` is the pool's index of nodes by free
    capacity. Return an iterator of candidate nodes (lazily: the scheduler
    stops at the first that fits), or None when the strategy is not this
    plugin's. The scheduler still checks the node selector, the filters and
    that the task fits each candidate. A strategy object
    (``gpud.core.strategies.Strategy``) is asked through its ``candidates``,
    and only for the names in its ``names``. First result.
    """


@hookspec(firstresult=True)
def gpud_gpu_order(strategy: str, request: TaskRequest, node: NodeState) -> list[int] | None:
    """Order the GPUs of one node for a task, best first.

    Called for each candidate node of a GPU task that passed the other
    checks, until one has room (the GPUs decide whether the node fits), and
    for a node consolidation is clearing. ``strategy`` is the pool's
    ``gpu_placement``. Return GPU indices in order of preference (the
    scheduler takes the first ones that have room; an index left out is not
    used), or None when the strategy is not this plugin's; when no plugin
    answers, the lowest free indices are taken. A strategy object is asked
    through its ``gpu_order``, and only for the names in its ``names``.
    First result.
    """


@hookspec
def gpud_filter_node(job: JobSpec, node: NodeState) -> str | None:
    """Veto a node for a job.

    Called for each candidate node the scheduler examines for a job's task,
    after its own checks of the pool, the node selector and the free CPUs
    and memory passed, before the GPUs are chosen; and for a node reclaim,
    preemption or consolidation made room on, before the task goes there. Return a short reason
    (e.g. ``"node is draining"``) to refuse the node, or None to accept it.
    Results of all plugins are combined: any reason refuses the node. While
    any plugin implements it, the scheduler tries pending jobs one by one
    instead of a whole group of alike jobs at once, which is slower on long
    queues.
    """


# --- Ordering ------------------------------------------------------------------------------------

@hookspec(firstresult=True)
def gpud_job_order_key(job: JobSpec) -> Any:
    """Give the sort key of a pending job inside its queue (smaller runs first).

    Called when a job joins the pending backlog (on submission, when the
    scheduler builds its state, when the job is requeued or evicted), when
    it leaves it, and for each job consolidation considers in a cycle. The key is kept
    while the job waits and never asked for again, so it must be a pure
    function of the job: the same job gives an equal key every time, and
    nothing else (the clock, the cluster, the queue) may change it. The
    built-in key is higher priority first, then earlier submission. The
    per-user order inside a project is kept only for a job order that
    declares its keys start with minus the priority
    (``gpud.core.orders.JobOrder.priority_first``), as the built-in does.
    First result.
    """


@hookspec(firstresult=True)
def gpud_queue_order_key(queue: QueueState, job: JobSpec, need: Any) -> Any:
    """Give the sort key of a queue (a project or department in one pool) whose next job is ``job``.

    Called while allocation, reclaim, preemption and consolidation walk the
    pending jobs: for each queue when the walk begins, and again for a
    queue (and its department) after each of its jobs is served.
    ``queue`` is a project queue, or a department queue with the next job
    of its first project; ``need`` is what the job's waiting tasks ask for
    in all (a ``gpud.model.Resources``). The queue with the smallest key is
    served first, at each level of the hierarchy (departments, then
    projects). First result.
    """


@hookspec(firstresult=True)
def gpud_victim_order_key(victim: Victim) -> Any:
    """Give the sort key of a running job that may be evicted (smaller goes first).

    Called when reclaim or preemption lists a queue's evictable jobs: once
    per queue and action, and the list is kept for the cycle's later
    actions while nothing of the queue is placed or released, so the key
    must not change within a cycle. Consolidation, which moves jobs rather
    than stops them, moves the tasks holding the most GPUs first and asks
    this key (for one task of the job) only between tasks that hold as
    many, and between nodes cleared by as many moves; with an order that
    weighs lost work it also tries alone, in this key's order, each task
    whose job checkpointed since it started on a node the largest holders
    clear. The built-in key is lowest priority first, then most recently
    started. First result.
    """


# --- Eviction ------------------------------------------------------------------------------------

@hookspec
def gpud_can_evict(victim: Victim, preemptor: JobSpec, rule: str) -> str | None:
    """Veto the eviction of a running job.

    Called for each candidate victim after the scheduler's own rules allowed
    it (preemptible, ran the minimum run time); consolidation asks for each
    task it might move, with a victim of that one task. ``rule`` is
    ``"reclaim"``, ``"preempt"`` or ``"consolidate"``. Return a short reason
    to protect the victim, or None to allow the eviction. Results of all
    plugins are combined: any reason protects the victim. While any plugin
    implements it, the scheduler tries pending jobs one by one instead of a
    whole group of alike jobs at once.
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
