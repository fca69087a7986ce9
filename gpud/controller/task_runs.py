"""Where each job's tasks are wanted: starts and stops of task runs on nodes, and the usage they end.

The incarnations each node is to run (``wanted``), those whose start has
not gone out yet (``unsent``), and the nodes connected to hear them. Starts
are held back while an earlier incarnation of the job is still stopping or
its silent node's lease may still run it (gpud.controller.completing).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

from gpud.controller.checkpoints import checkpoint_token
from gpud.controller.completing import Completing
from gpud.controller.node_commands import start_command, stop_command
from gpud.controller.nodes import DOWN, NodeRecord, incarnation_key
from gpud.controller.outbox import Outbox
from gpud.controller.persist import Persister
from gpud.jobs import Job, TaskRun, gpus_of, job_uid
from gpud.lifecycle import RUN_EXITED, RUN_STARTING
from gpud.model import TaskPlacement
from gpud.policy import Policy

# How long a start may go unseen in the node's heartbeats before it is sent again on the same connection.
RESEND_START_AFTER_S = 5.0


class TaskRuns:
    """Places task runs on nodes and stops them, with the commands that say so; see the module docstring."""

    def __init__(self, jobs: dict[str, Job], nodes: dict[str, NodeRecord], outbox: Outbox, completing: Completing,
                 fenced: dict[str, tuple[float, str]], persist: Persister, clock: Callable[[], float],
                 policy: Callable[[], Policy]) -> None:
        self.jobs = jobs
        self.nodes = nodes
        self.outbox = outbox
        self.completing = completing
        self.fenced = fenced
        self.persist = persist
        self.clock = clock
        self.policy = policy
        self.connected: set[str] = set()
        self.wanted: dict[str, dict[str, tuple[str, int]]] = defaultdict(dict)  # node -> key -> (job, task)
        self.unsent: dict[str, dict[str, float]] = defaultdict(dict)  # node -> key -> since (0.0: never sent)
        self.sent_at: dict[str, float] = {}
        # A WebSocket loses no order, so a heartbeat without the task was most likely written before the order
        # arrived and read late by a busy controller: resending then only adds to the work (the controller sets
        # this to the node's lease; a node that reconnects is sent its starts again at once).
        self.resend_start_after_s = RESEND_START_AFTER_S
        self.task_secret = ""  # signs each job's checkpoint credential: the cluster key
        # Told when a task stops holding its placement, and when (usage is charged up to there).
        self.run_ended: Callable[[Job, TaskRun, float], None] = lambda job, run, end: None

    def restore(self, job: Job, now: float) -> None:
        """Want again the placed runs of a job read back from the store; those never seen running go out again."""
        for task, run in enumerate(job.runs):
            if run.placement is not None:
                key = incarnation_key(job.id, task, run.attempt)
                self.wanted[run.placement.node][key] = (job.id, task)
                if run.state == RUN_STARTING:
                    self.unsent[run.placement.node][key] = now

    def place(self, job: Job, task: int, placement: TaskPlacement, now: float) -> None:
        """A new incarnation of the task at ``placement``, to be started there (``send_starts``)."""
        run = job.runs[task]
        run.move_to(RUN_STARTING)
        run.placement, run.attempt, run.pid = placement, job.launches, None
        run.exit_code = run.term_signal = None
        run.since = now
        job.launches += 1
        if len(job.hosts) < job.tasks:
            job.hosts.extend([""] * (job.tasks - len(job.hosts)))
        job.hosts[task] = placement.node
        key = incarnation_key(job.id, task, run.attempt)
        self.wanted[placement.node][key] = (job.id, task)
        self.unsent[placement.node][key] = 0.0

    def stop(self, job: Job, task: int, reason: str, dead_node: str | None = None, *,
             signal: str | None = None, grace_s: float | None = None, leader_only: bool = False) -> None:
        """End the task's run: its node (unless dead, or never told to start it) is told to stop it, and the
        job waits for that stop (gpud.controller.completing); the task is left with a fresh, unplaced run."""
        run = job.runs[task]
        placement = run.placement
        if placement is None:
            return
        self.account(job, run)
        key = incarnation_key(job.id, task, run.attempt)
        self.wanted[placement.node].pop(key, None)
        never_sent = self.unsent[placement.node].pop(key, None) == 0.0
        node = self.nodes.get(placement.node)
        if (node is not None and placement.node != dead_node and node.state != DOWN and not never_sent
                and run.state != RUN_EXITED):
            node.stopping[key] = list(placement.gpu_index)
            self.completing.add(node.name, key, self.clock())
            self.persist.node(node.name, node.to_json)
            grace = self.policy().grace_period_s if grace_s is None else grace_s
            self.outbox.put(node.name, stop_command(job.id, task, run.attempt, reason, grace, job_uid(job),
                                                    signal=signal, leader_only=leader_only))
        job.runs[task] = TaskRun()

    def account(self, job: Job, run: TaskRun, until: float | None = None) -> None:
        """The run stops holding its placement at ``until`` (now by default): its GPU time is added to the job."""
        if run.placement is not None and run.since is not None:
            end = self.clock() if until is None else until
            self.run_ended(job, run, end)
            job.gpu_seconds += max(0.0, end - run.since) * gpus_of(run.placement)
            run.since = None

    def send_starts(self, name: str) -> None:
        """Send node ``name`` (when connected) the starts it has not had, oldest first, except those whose job
        still waits for an earlier copy of itself or whose GPUs are still busy."""
        if name not in self.connected:
            return
        node = self.nodes[name]
        busy = node.busy_gpus()
        unsent = self.unsent[name]
        policy = self.policy()
        for key in sorted(unsent, key=lambda k: unsent[k]):
            job_id, task = self.wanted[name][key]
            if job_id in self.completing or job_id in self.fenced:
                continue  # sent once every earlier incarnation of the job has surely ended (see JobService.unblock)
            job = self.jobs[job_id]
            run = job.runs[task]
            assert run.placement is not None  # a wanted task is placed
            if busy.intersection(run.placement.gpu_index):
                continue
            del unsent[key]
            self.sent_at[key] = self.clock()
            token = checkpoint_token(self.task_secret, job) if self.task_secret else ""
            self.outbox.put(name, start_command(job, task, run, node, self.nodes, policy.grace_period_s,
                                                policy.time_slicing, policy.task_pids_max, token))

    def forget_node(self, name: str) -> None:
        """The node is down: nothing is wanted of it any more (its jobs were requeued or ended)."""
        self.wanted.pop(name, None)
        self.unsent.pop(name, None)
