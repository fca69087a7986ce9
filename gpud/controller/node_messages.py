"""The node side of the controller's state machine: registrations, heartbeats, task reports, silent nodes.

Like the rest of the cluster it does no I/O: it marks changes on the
persister and leaves commands for the nodes in the outbox. What a node's
news does to a job (ended, requeued, unblocked) is the job service's move.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from gpud.controller.completing import Completing
from gpud.controller.core_sync import CoreSync
from gpud.controller.event_log import EventLog
from gpud.controller.job_service import JobService
from gpud.controller.nodes import DOWN, UP, NodeRecord, incarnation_key
from gpud.controller.node_commands import ack_command, stop_command
from gpud.controller.outbox import Outbox
from gpud.controller.persist import Persister
from gpud.controller.task_exits import Outcome, exit_text, outcome, reported_cause
from gpud.controller.task_runs import TaskRuns
from gpud.jobs import Job, TaskRun, job_uid
from gpud.lifecycle import COMPLETED, FAILED, RUN_EXITED, RUN_RUNNING, TIMEOUT
from gpud.policy import Policy
from gpud.submission import Capacity

log = logging.getLogger("gpud.controller")
# After a silent node's lease and grace period, how long more its jobs wait before they run elsewhere: the
# node's supervisors need a moment to notice the lease ran out and to kill what ignored the stop signal.
FENCE_MARGIN_S = 2.0


class NodeMessages:
    """The nodes, and what the cluster does when they speak (or fall silent); see the module docstring."""

    def __init__(self, nodes: dict[str, NodeRecord], jobs: dict[str, Job], job_service: JobService,
                 runs: TaskRuns, events: EventLog, outbox: Outbox, core: CoreSync, persist: Persister,
                 clock: Callable[[], float], policy: Callable[[], Policy], completing: Completing,
                 fenced: dict[str, tuple[float, str]], wake: Callable[[], None]) -> None:
        self.nodes = nodes
        self.jobs = jobs
        self.job_service = job_service
        self.runs = runs
        self.events = events
        self.outbox = outbox
        self.core = core
        self.persist = persist
        self.clock = clock
        self.policy = policy
        self.completing = completing
        self.fenced = fenced
        self.wake = wake
        self._largest: Capacity | None = None  # the largest node's resources, until a node changes
        self._sizes: dict[str, NodeSize] = {}  # each node's labels and sizes, as ``_largest`` folds them

    def restore(self, nodes: list[NodeRecord], now: float) -> None:
        """Take back the nodes the store held: each waits to register again, what it was stopping still counts."""
        for node in nodes:
            node.last_seen = now
            self.nodes[node.name] = node
            for key in node.stopping:
                self.completing.add(node.name, key, now)
        self.nodes_changed()

    def nodes_changed(self, name: str | None = None) -> None:
        """Node ``name`` was added or its resources changed (every node, when None): the largest node is
        worked out again when asked."""
        if name is None:
            self._sizes = {node.name: node_size(node) for node in self.nodes.values()}
        else:
            self._sizes[name] = node_size(self.nodes[name])
        self._largest = None

    def largest_node(self) -> Capacity:
        """The largest resources any node has (None everywhere when no node ever registered).

        Worked out once per change of the nodes, not per submit, from each
        node's sizes as kept when it changed: a fleet of 2,000 nodes took
        10 ms to walk whole, in one stretch of the event loop.
        """
        if self._largest is None:
            self._largest = capacity_of(self._sizes.values())
        return self._largest

    def register(self, node: NodeRecord, tasks: list[dict], checkpoints: list[str] | None = None) -> None:
        """A node (re)registered with its inventory and its tasks: reconcile both ways.

        ``checkpoints`` are the job uids of the checkpoint directories the
        node holds: each one of a job this controller does not have (ended,
        or never its own) is purged, so a purge sent while the node was away,
        or lost with a node daemon's restart, is sent again.
        """
        now = self.clock()
        known = self.nodes.get(node.name)
        if known is not None:
            node.drain, node.drain_reason, node.stopping = known.drain, known.drain_reason, known.stopping
            if known.state == DOWN:
                self.events.record("node up", f"registered again after {now - known.last_seen:.0f} s of silence",
                                   node=node.name)
        node.reason = node.drain_reason if node.drain else ""
        node.state, node.last_seen, node.registered = UP, now, now
        if known is None or known.inventory() != node.inventory():
            self.core.rebuild()
        self.nodes[node.name] = node
        self.nodes_changed(node.name)
        self.runs.connected.add(node.name)
        self.events.record("registered", f"node registered: {len(node.gpus)} GPUs, {node.cpus:g} CPUs",
                           node=node.name)
        self.persist.node(node.name, node.to_json)
        self.reconcile(node.name, tasks, fresh=True)
        if checkpoints:
            live = {job_uid(job) for job in self.jobs.values()}
            for uid in checkpoints:
                if uid not in live:
                    self.outbox.put(node.name, {"type": "purge", "job": "", "job_uid": uid})
        self.wake()

    def heartbeat(self, name: str, gpus: list | None, tasks: list[dict]) -> None:
        """A node is alive: note it, take its GPU health, and reconcile its task list."""
        node = self.nodes.get(name)
        if node is None:
            return
        now = self.clock()
        if node.state == DOWN:
            self._node_up(node, now)
        node.last_seen = now
        if gpus is not None and gpus != node.gpus:
            node.gpus = gpus
            self.nodes_changed(name)
            self.core.rebuild()
            self.persist.node(name, node.to_json)
            self.wake()
        self.reconcile(name, tasks, fresh=False)

    def reconcile(self, name: str, tasks: list[dict], *, fresh: bool) -> None:
        """Make the node's tasks what the controller wants: report each, repair what is missing."""
        node = self.nodes[name]
        now = self.clock()
        reported = set()
        for report in tasks:
            key = self._report_key(report)
            reported.add(key)
            if fresh and key in node.stopping and report.get("state") != "exited":
                # The stop may have gone out while the node was away: a node that registers hears it again.
                self.outbox.put(name, stop_command(str(report.get("job")), int(report.get("task", -1)),
                                                   int(report.get("attempt", -1)), "stopped",
                                                   self.policy().grace_period_s, str(report.get("job_uid") or "")))
            self.task_report(name, report)
        for key in [k for k in node.stopping if k not in reported]:
            del node.stopping[key]
            self.persist.node(name, node.to_json)
            self.stopping_ended(name, key)
        for key, (job_id, task) in list(self.runs.wanted[name].items()):
            if key in reported or key in self.runs.unsent[name] or key not in self.runs.wanted[name]:
                continue  # the last: a task of a job that an earlier one of this walk requeued or ended
            job = self.jobs[job_id]
            run = job.runs[task]
            if run.state == RUN_RUNNING:
                self.job_service.lost(job, f"node {name} no longer runs task {task}")
            elif fresh or now - self.runs.sent_at.get(key, 0.0) > self.runs.resend_start_after_s:
                self.runs.unsent[name][key] = now
        self.runs.send_starts(name)

    def _report_key(self, report: dict) -> str:
        """The incarnation key of a reported task; a task of another job given the same id (its job uid
        differs, e.g. after a restore from a backup) gets a key of its own, so it is never taken for this one."""
        job_id = str(report.get("job"))
        uid = report.get("job_uid")
        job = self.jobs.get(job_id)
        if isinstance(uid, str) and uid and job is not None and uid != job_uid(job):
            job_id = f"{job_id}@{uid}"
        try:
            return incarnation_key(job_id, int(report.get("task", -1)), int(report.get("attempt", -1)))
        except (TypeError, ValueError):
            return incarnation_key(job_id, -1, -1)

    def task_report(self, name: str, report: dict) -> bool:
        """One task's state from its node: running, or exited with its code.

        Returns whether the caller must commit now: the report left commands
        that may go out only once its changes are durable. A task that has
        started needs no answer and no durability before one (after a crash
        the node reports it again): its change is written within a moment,
        with the next batch rather than in a transaction of its own.
        """
        try:
            job_id, task, attempt = str(report["job"]), int(report["task"]), int(report["attempt"])
            state = report["state"]
        except (KeyError, TypeError, ValueError):
            log.warning("node %s sent a malformed task report: %r", name, report)
            return False
        reported_uid = report.get("job_uid")
        uid = reported_uid if isinstance(reported_uid, str) else ""
        key = self._report_key(report)
        node = self.nodes[name]
        exited = state == "exited"
        job = self.jobs.get(job_id)
        if job is not None and uid and uid != job_uid(job):
            job = None  # another job that had this id: not ours to account, to be stopped
        if exited:
            _add_usage(job, report)
        if key in node.stopping:
            if exited:
                del node.stopping[key]
                self.persist.node(name, node.to_json)
                self.outbox.put(name, ack_command(job_id, task, attempt, uid))
                self.stopping_ended(name, key)
                self.runs.send_starts(name)
            return exited
        run = job.runs[task] if job is not None and 0 <= task < job.tasks else None
        if job is None or run is None or run.attempt != attempt or run.placement is None or run.placement.node != name:
            if exited:
                self.outbox.put(name, ack_command(job_id, task, attempt, uid))
            else:
                node.stopping[key] = []
                # A copy of an active job the controller did not know of (a node back from silence): the job
                # starts nowhere else until this copy has ended.
                self.completing.add(name, key, self.clock())
                self.outbox.put(name, stop_command(job_id, task, attempt, "not wanted",
                                                   self.policy().grace_period_s, uid))
            return True
        if run.state == RUN_EXITED:
            self.outbox.put(name, ack_command(job_id, task, attempt, uid))
            return True
        if not exited:
            _add_gpu_sample(job, report)
            if run.state != RUN_RUNNING or run.pid != report.get("pid"):
                if run.state != RUN_RUNNING:
                    run.move_to(RUN_RUNNING)
                run.pid = report.get("pid")
                self.runs.unsent[name].pop(key, None)
                self.persist.job(job)
                self.persist.flush_soon()
            return False
        run.move_to(RUN_EXITED)
        run.exit_code, run.term_signal = report.get("exit_code"), report.get("term_signal")
        run.reason, run.cause = str(report.get("reason") or ""), reported_cause(report)
        self.runs.wanted[name].pop(key, None)
        self.runs.unsent[name].pop(key, None)
        self.outbox.put(name, ack_command(job_id, task, attempt, uid))
        self._task_exited(job, task, run, self._exit_time(report.get("ended"), run))
        return True

    def _exit_time(self, reported: object, run: TaskRun) -> float:
        """When the task ended: the node's time (it may tell us late, after our restart), kept within its run."""
        now = self.clock()
        if isinstance(reported, bool) or not isinstance(reported, (int, float)) or reported != reported:
            return now
        return min(now, max(float(reported), run.since if run.since is not None else float(reported)))

    def _task_exited(self, job: Job, task: int, run: TaskRun, ended: float) -> None:
        self.persist.job(job)
        self.runs.account(job, run, until=ended)
        detail, fate = exit_text(run), outcome(run)
        if fate is Outcome.NODE_FAULT:
            self.job_service.lost(job, f"node {run.placement.node if run.placement else '?'}: task {task} {detail}")
        elif fate is Outcome.TIMEOUT:
            self.job_service.finish(job, TIMEOUT, f"task {task} reached the time limit", exit_from=run, ended=ended)
        elif fate is Outcome.FAILED:
            self.job_service.finish(job, FAILED, f"task {task} {detail}", exit_from=run, ended=ended)
        elif all(r.state == RUN_EXITED for r in job.runs if r.placement is not None):
            self.job_service.finish(job, COMPLETED, "", exit_from=run, ended=ended)
        else:
            self.events.record("task exited", f"task {task} {detail}", job=job.id)

    def disconnected(self, name: str) -> None:
        """The node's connection closed; it is marked down only when the timeout passes."""
        self.runs.connected.discard(name)

    def check_nodes(self, timeout_s: float) -> None:
        """Mark nodes silent for ``timeout_s`` (their lease) down; their jobs are requeued or failed, whole gangs
        together, and a requeued job waits until the node's lease and grace period are over before it runs again.

        Also lets jobs whose wait is over be scheduled.
        """
        now = self.clock()
        for node in self.nodes.values():
            if node.state != DOWN and now - node.last_seen > timeout_s:
                fenced_at = node.last_seen + timeout_s + self.policy().grace_period_s + FENCE_MARGIN_S
                self._node_down(node, f"no heartbeat for {now - node.last_seen:.0f} s", fenced_at)
        for job_id, (until, _) in list(self.fenced.items()):
            if until <= now:
                del self.fenced[job_id]
                self.job_service.unblock(job_id)

    def stopping_ended(self, name: str, key: str) -> None:
        """Incarnation ``key`` that node ``name`` was stopping is gone: once its job has nothing left stopping,
        the job may be scheduled again, and its starts held back meanwhile go out."""
        job_id = self.completing.ended(name, key)
        if job_id is not None:
            self.job_service.unblock(job_id)

    def _node_up(self, node: NodeRecord, now: float) -> None:
        """A down node speaks again: it takes work, and the reason it was down is gone."""
        self.events.record("node up", f"heartbeats again after {now - node.last_seen:.0f} s of silence",
                           node=node.name)
        node.state, node.reason = UP, node.drain_reason if node.drain else ""
        self.runs.connected.add(node.name)
        self.nodes_changed(node.name)
        self.persist.node(node.name, node.to_json)
        self.core.rebuild()
        self.wake()

    def _node_down(self, node: NodeRecord, reason: str, fenced_at: float | None = None) -> None:
        node.state, node.reason = DOWN, reason
        self.runs.connected.discard(node.name)
        self.events.record("node down", reason, node=node.name)
        for job_id in {job_id for job_id, _ in self.runs.wanted[node.name].values()}:
            job = self.jobs.get(job_id)
            if job is not None:
                if fenced_at is not None:
                    # Its tasks on the node may still be stopping (the node's own lease stops them): it must
                    # not start anywhere before that is surely over.
                    until, _ = self.fenced.get(job_id, (0.0, ""))
                    self.fenced[job_id] = (max(until, fenced_at), node.name)
                self.job_service.lost(job, f"node {node.name} is down ({reason})", dead_node=node.name)
        self.runs.forget_node(node.name)
        for job_id, key in self.completing.on_node(node.name):
            # What the silent node was stopping is certainly over only once its own lease has stopped it.
            if fenced_at is not None and job_id in self.jobs:
                until, _ = self.fenced.get(job_id, (0.0, ""))
                self.fenced[job_id] = (max(until, fenced_at), node.name)
            self.stopping_ended(node.name, key)
        node.stopping.clear()
        self.persist.node(node.name, node.to_json)
        self.core.rebuild()
        self.wake()

    def drain(self, node: NodeRecord, reason: str, by: str) -> None:
        """No new work on the node; running jobs finish."""
        node.drain, node.drain_reason = True, reason
        if node.state != DOWN:
            node.reason = reason
        self.events.record("drained", f"drained by {by}: {reason}", node=node.name)
        self.persist.node(node.name, node.to_json)
        self.core.rebuild()

    def resume(self, node: NodeRecord, by: str) -> None:
        """The node takes work again."""
        node.drain, node.drain_reason = False, ""
        if node.state != DOWN:
            node.reason = ""
        self.events.record("resumed", f"resumed by {by}", node=node.name)
        self.persist.node(node.name, node.to_json)
        self.core.rebuild()
        self.wake()


def _add_usage(job: Job | None, report: dict) -> None:
    """Add what an exited task used (its cgroup's peak memory and CPU time, when it had one) to its job."""
    if job is None:
        return
    rss, cpu = report.get("max_rss_bytes"), report.get("cpu_s")
    if isinstance(rss, int) and not isinstance(rss, bool):
        job.max_rss_bytes = max(job.max_rss_bytes or 0, rss)
    if isinstance(cpu, (int, float)) and not isinstance(cpu, bool):
        job.cpu_s = (job.cpu_s or 0.0) + float(cpu)


def _add_gpu_sample(job: Job, report: dict) -> None:
    """Add a running task's GPU sample (mean utilisation of its GPUs, most memory on one) to its job."""
    util, memory = report.get("gpu_util"), report.get("gpu_memory_gib")
    if isinstance(util, (int, float)) and not isinstance(util, bool) and 0 <= util <= 100:
        job.gpu_util_sum += float(util)
        job.gpu_util_samples += 1
    if isinstance(memory, (int, float)) and not isinstance(memory, bool) and 0 <= memory < 1e6:
        job.gpu_memory_peak_gib = max(job.gpu_memory_peak_gib or 0.0, float(memory))


# A node's labels (sorted), GPUs, largest GPU memory, CPUs and memory, as the largest node is worked out.
NodeSize = tuple[tuple[tuple[str, str], ...], int, float, float, float]


def node_size(node: NodeRecord) -> NodeSize:
    """The node's labels and sizes."""
    return (tuple(sorted(node.labels.items())), len(node.gpus), max((g.memory_gib for g in node.gpus), default=0.0),
            node.cpus, node.memory_gib)


def capacity_of(sizes: Iterable[NodeSize]) -> Capacity:
    """The largest resources of nodes of these sizes, overall and for each distinct set of labels."""
    largest: dict[tuple, tuple[int, float, float, float]] = {}
    for labels, gpus, gpu_memory, cpus, memory in sizes:
        old = largest.get(labels)
        largest[labels] = ((gpus, gpu_memory, cpus, memory) if old is None else
                           (max(old[0], gpus), max(old[1], gpu_memory), max(old[2], cpus), max(old[3], memory)))
    if not largest:
        return Capacity()
    sizes_by_labels = sorted(largest.items())
    return Capacity(max_gpus=max(size[0] for size in largest.values()),
                    max_gpu_memory_gib=max(size[1] for size in largest.values()),
                    max_cpus=max(size[2] for size in largest.values()),
                    max_memory_gib=max(size[3] for size in largest.values()),
                    labels=tuple(labels for labels, _ in sizes_by_labels),
                    sized=tuple((labels, *size) for labels, size in sizes_by_labels))
