"""The controller's running parts: store, cluster state, scheduling loop, node links, all started and stopped together."""

from __future__ import annotations

import asyncio
import gc
import getpass
import logging
import math
import os
import sqlite3
import socket
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from gpud import jsontext
from gpud.accounting.charger import Charger
from gpud.controller.auth import Auth, digest, new_token, read_or_create_secret
from gpud.controller.cluster import Cluster
from gpud.controller import cycle_turns
from gpud.controller.config import ControllerConfig
from gpud.controller.heap import FullPasses
from gpud.controller.idempotency import ANSWERS_KEPT_S, Idempotency
from gpud.controller.loop_lag import LoopLag
from gpud.controller.nodes import NodeRecord
from gpud.controller.persist import Persister, StoreError, is_store_failure
from gpud.controller.rate import SubmitRate
from gpud.controller.slices import Slices
from gpud.controller.submits import Submits
from gpud.controller.state_dir import StateError, open_state, restore_hint
from gpud.core import COMPILED
from gpud.errors import ConfigError
from gpud.jobs import Job
from gpud.model import JobSpec, NodeSpec, Plan
from gpud.metrics import Histogram
from gpud.plugins import make_plugin_manager, placement_strategies
from gpud.policy import Policy
from gpud.policy_file import ANY_PLACEMENT, check_placements, parse_policy, require_projects
from gpud.tomlcheck import read_toml
from gpud.store.base import TokenRecord
from gpud.store.usage import UsageStore
from gpud.waits import wait_event

log = logging.getLogger("gpud.controller")
# Cycles start at least CYCLE_GAP_FACTOR times the last cycle's work apart
# (so scheduling takes at most a third of the loop), and never more than
# MAX_CYCLE_GAP_S: cheap cycles follow each change quickly, costly ones batch.
# A cycle that builds the scheduler anew (nodes or the policy changed) starts
# at least MIN_BUILD_GAP_S, and CYCLE_GAP_FACTOR times the last such cycle's
# work, after the last one: a build costs what the whole cluster is, so a fleet
# registering node by node is built anew a few times a second, not once per
# cycle, and a new node waits at most that long to be scheduled on.
MIN_BUILD_GAP_S = 0.25
MAX_CYCLE_GAP_S = 0.01
CYCLE_GAP_FACTOR = 2.0
GIL_SWITCH_INTERVAL_S = 0.0005
# A cycle as short as the last one was runs on the event loop: handing it to
# a thread costs more than it does. Longer cycles run in their own thread so
# the API keeps answering.
INLINE_CYCLE_S = 0.002
# ... unless the scheduler is to be built anew or takes in more jobs than this: a burst of submits after idle
# cycles made an inline cycle that held the event loop for seconds.
INLINE_OPS = 32
# A view made from the plan (projects, usage) asked before the first cycle planned waits this long for it: at
# start-up the first cycle comes within a build's spacing, and an empty view would read as "no projects".
FIRST_PLAN_WAIT_S = 5.0


def build_spacing(last_build_work_s: float) -> float:
    """The least time from the start of one cycle that built the scheduler anew to the start of the next such
    cycle, in seconds, given what the last one took: MIN_BUILD_GAP_S, or CYCLE_GAP_FACTOR times as long."""
    return max(MIN_BUILD_GAP_S, CYCLE_GAP_FACTOR * last_build_work_s)


def load_policy_and_plugins(path: str) -> tuple[Policy, Any, dict]:
    """The policy file, the plugin manager it asks for, and its raw tables; a ConfigError names what is wrong."""
    data, source = read_toml(path)
    policy = require_projects(parse_policy(data, source, ANY_PLACEMENT), source)
    pm = make_plugin_manager(policy.plugins.disable, policy.plugins.directory)
    check_placements(policy, placement_strategies(pm), path)
    return policy, pm, data


class Controller:
    """Everything the HTTP handlers call: one instance per running controller."""

    def __init__(self, config: ControllerConfig, clock: Callable[[], float] = time.time) -> None:
        """``clock`` gives the wall-clock time every lifecycle stamp and scheduling cycle reads."""
        self.config = config
        self.clock = clock
        self.policy, self.pm, self.policy_data = load_policy_and_plugins(config.policy)
        self.store_executor = ThreadPoolExecutor(1, thread_name_prefix="gpud-store")
        self.cycle_executor = ThreadPoolExecutor(1, thread_name_prefix="gpud-cycle")
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        if config.store is not None:
            from gpud.controller.pg_state import open_pg_state
            self.files = open_pg_state(config.store, config.state_dir, config.key_path, init=config.init,
                                       holder=self.holder)
        else:
            self.files = open_state(config.state_dir, init=config.init, synchronous=config.synchronous.upper())
        self.store: Any = self.files.store
        # With PostgreSQL a controller leads only while it holds the lease (gpud/controller/leadership.py);
        # until then it is a standby that sends every API call to the leader. With SQLite it always leads.
        self.term: int | None = None
        self.role = "standby" if config.postgres else "leader"
        self.leader_url: str | None = None if config.postgres else config.leader_url
        self.takeover: dict[str, float] = {}
        # A standby's decoded copy of the active jobs, by their stored record: decoding is most of what a
        # takeover costs (about 0.3 ms a job), and a record unchanged since decodes to the same job.
        self.warm: dict[str, Job] = {}
        self.cluster_id = self.files.cluster_id
        self.persist = Persister(self.store, self.store_executor)
        self.cluster = Cluster(self.policy, self.pm, self.persist, clock)
        self.links: dict[str, Any] = {}
        self.log_requests: dict[str, asyncio.Future] = {}
        self.kick = asyncio.Event()
        self.planned = asyncio.Event()  # set once a cycle's plan was carried out: the views have one to show
        self.cluster.wake = self.kick.set
        self.cluster.runs.resend_start_after_s = max(self.cluster.runs.resend_start_after_s, config.node_timeout_s)
        self.cycle_seconds = Histogram("gpud_scheduling_cycle_seconds", "Time of one scheduling cycle.", "")
        self.api_seconds = Histogram("gpud_api_request_seconds", "API request latency by route.", "route")
        self.cycles = 0
        self.builds = 0  # cycles that built the scheduler anew
        self.last_cycle_s = 1.0          # the first cycle may be a big one: give it the thread
        self.last_cycle_work_s = 1.0     # the same, with preparing it and applying its plan
        self.last_build_work_s = 0.0     # the same, of the last cycle that built the scheduler anew
        self.last_build_began = -math.inf  # when that cycle began (time.monotonic())
        self.started = clock()
        self.auth: Auth  # set when the state is opened, before the API answers
        self.idempotency = Idempotency(self._stored_answer)
        self.submit_rate = SubmitRate(config.submit_rate, config.submit_burst)
        self.submits = Submits(self.cluster.job_service, self.cluster.node_messages.largest_node, lambda: self.policy,
                               self.submit_rate, self.persist, self._finished_states, local_node=config.local_node)
        self.answers_pruned = 0.0
        self._commit_waiting = False  # a commit_soon not yet begun: what is marked now goes with it
        self._committing: set[asyncio.Task] = set()
        self._sending = asyncio.Lock()  # held by the commit sending its commands (see commit)
        self._closing: set[asyncio.Future] = set()  # links of nodes that read nothing, being closed
        self.usage_store: UsageStore = self.store.usage(config.synchronous.upper())
        self.charger = Charger(self.usage_store, self.store_executor, lambda: self.policy, self._placed_jobs,
                               self._pool_of)
        self.cluster.runs.run_ended = self.charger.run_ended
        self.full_passes: FullPasses | None = None  # the collector's full passes, timed once the state is open
        self.loop_lag = LoopLag()  # how late the event loop has been lately (/healthz, /metrics)

    def _placed_jobs(self) -> list[Job]:
        """The jobs holding a placement on some node now."""
        jobs = self.cluster.jobs
        ids = {job_id for wanted in self.cluster.runs.wanted.values() for job_id, _ in wanted.values()}
        return [jobs[job_id] for job_id in ids if job_id in jobs]

    async def _finished_states(self, ids: list[str]) -> dict[str, str]:
        """How the store says the jobs it knows of these ended, by id (read in the store's thread)."""
        return await asyncio.get_running_loop().run_in_executor(self.store_executor, self.store.jobs_state, ids)

    def _pool_of(self, node: str) -> str:
        record = self.cluster.nodes.get(node)
        return record.pool if record is not None else self.policy.default_pool

    async def open(self) -> None:
        """Read the store back, the cluster key and the tokens; write the first admin token if there is none."""
        # The scheduling cycle runs in a thread; a short switch interval keeps
        # it from holding the GIL for 5 ms while a request waits to be answered.
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        loop = asyncio.get_running_loop()
        try:
            loaded = await loop.run_in_executor(self.store_executor, self.store.load)
        except sqlite3.DatabaseError as exc:
            raise StateError(f"the store {self.store.path} is damaged ({exc}); "
                             f"{restore_hint(self.config.state_dir, damaged=True)}") from None
        if self.config.postgres:
            key = loaded.meta["cluster_key"]  # made by --init (gpud/controller/pg_state.py)
        else:
            key, created = read_or_create_secret(self.config.key_path, new_token)
            if created:
                log.info("wrote a new cluster key to %s (copy it to every node)", self.config.key_path)
        self.auth = Auth(loaded.tokens, key)
        self.cluster.runs.task_secret = key
        if not loaded.tokens and self.config.postgres and not self.config.init:
            log.warning("the cluster has no token: start one controller with --init to write the admin token")
        elif not loaded.tokens:
            token, _ = read_or_create_secret(self.config.admin_token_path, new_token)
            record = TokenRecord(digest(token), _local_user(), True, time.time(),
                                 allow_root=self.config.admin_allow_root)
            self.persist.token(record)
            self.auth.add(record)
            log.info("wrote the admin token (user %s%s) to %s", record.user,
                     ", its jobs may run as root" if record.allow_root else "", self.config.admin_token_path)
        warm, self.warm = self.warm, {}
        jobs = [warm.get(record) or Job.from_record(jsontext.loads(record)) for record in loaded.jobs]
        if warm:
            self.takeover["warm_jobs"] = float(sum(record in warm for record in loaded.jobs))
        nodes = [NodeRecord.from_json(record) for record in loaded.nodes.values()]
        # Job ids go on after the highest ever stored (stores written before ids were derived so kept a counter).
        next_seq = max(loaded.last_seq + 1, int(loaded.meta.get("next_seq", "1")))
        await loop.run_in_executor(self.store_executor, self.charger.load)
        self.cluster.restore(jobs, nodes, next_seq)
        gc.freeze()  # the jobs read back live long: see Submits.commit_new
        if self.full_passes is None:  # and what lives long from here on, once a full pass grows long
            self.full_passes = FullPasses(loop)
        self.full_passes.install()
        await self.persist.flush()
        await self.prune_answers()
        log.info("controller state: %d active jobs, %d nodes, from %s; scheduling core %s", len(jobs), len(nodes),
                 self.store.path, "compiled with mypyc" if COMPILED else "in Python (GPUD_COMPILE=1 compiles it)")

    def warm_up(self) -> int:
        """A standby's chore (blocking: the store's thread): decode the active jobs whose records changed since
        the last call, so that taking over decodes only what changed after; returns how many were decoded."""
        records = self.store.active_jobs()
        old = self.warm
        self.warm = {record: old.get(record) or Job.from_record(jsontext.loads(record)) for record in records}
        return sum(record not in old for record in records)

    async def _stored_answer(self, user: str, key: str) -> tuple[str, int, str] | None:
        return await asyncio.get_running_loop().run_in_executor(self.store_executor, self.store.answer, user, key)

    async def prune_answers(self) -> None:
        """Forget the answers to idempotent requests older than ANSWERS_KEPT_S, at most once an hour."""
        now = time.time()
        if now - self.answers_pruned < 3600.0:
            return
        self.answers_pruned = now
        await asyncio.get_running_loop().run_in_executor(self.store_executor, self.store.forget_answers,
                                                         now - ANSWERS_KEPT_S)

    async def close(self) -> None:
        """Charge and flush what is left and release the store."""
        await asyncio.gather(*self._committing, return_exceptions=True)  # commits of node messages under way
        try:
            if self.role != "leader":
                return  # a standby, or a leader that stepped down: this process may write nothing
            try:
                await self.charger.charge()
            except Exception as exc:  # noqa: BLE001 - a failed last charge must not keep the jobs unwritten
                log.error("the last usage charge failed: %s", exc)
            try:
                await self.persist.flush()
            except StoreError as exc:  # every acknowledged change is already durable; these were never promised
                log.error("stopping with changes not written: %s", exc)
        finally:
            if self.full_passes is not None:
                self.full_passes.uninstall()
            self.cluster.job_events.close()
            self.store_executor.submit(self.usage_store.close).result()
            self.store_executor.submit(self.store.close).result()
            self.store_executor.shutdown()
            self.files.close()
            self.cycle_executor.shutdown(cancel_futures=True)

    async def commit(self) -> None:
        """Make every change so far durable, then deliver the commands those changes made.

        With PostgreSQL each command carries this leader's term, and none is
        sent once the lease is lost: a node ignores a command of an older term.
        """
        commands = self.cluster.outbox.take()
        try:
            await self.persist.flush()
        except StoreError:
            self.cluster.outbox.put_back(commands)  # sent after the changes that made them are durable
            raise
        if self.role != "leader":
            return
        term = {"term": self.term} if self.term is not None else {}
        # Commits send one after the other, in the order their batches were written: a node hears its
        # commands in the order they were made (a start before the stop of the same task), even though
        # the loop turns while a commit sends thousands of them.
        async with self._sending:
            slices = Slices()
            for node, messages in commands.items():
                link = self.links.get(node)
                if link is None:
                    continue
                try:
                    # A node that reads nothing for a whole lease would hold every node's commands up.
                    async with asyncio.timeout(self.config.node_timeout_s):
                        for message in messages:
                            await link.send_str(jsontext.dumps({**message, **term}))
                            await slices.pause()
                except TimeoutError:
                    log.warning("node %s read no command for %.0f s: closing its connection (what it was to be "
                                "told is told again when it registers)", node, self.config.node_timeout_s)
                    self._closing.add(task := asyncio.ensure_future(link.close()))
                    task.add_done_callback(self._closing.discard)
                except (ConnectionError, RuntimeError) as exc:
                    log.warning("could not send commands to node %s: %s", node, exc)

    def commit_soon(self) -> None:
        """Commit (as :meth:`commit` does) in the background, so that the caller reads on meanwhile.

        For node messages: a node's next message is not held up while a
        batch is written, and the commands it made still go out only once
        their changes are durable. Calls before the commit begins share it.
        """
        if self._commit_waiting:
            return
        self._commit_waiting = True
        task = asyncio.ensure_future(self._commit_in_background())
        self._committing.add(task)
        task.add_done_callback(self._committing.discard)

    async def _commit_in_background(self) -> None:
        self._commit_waiting = False  # from here, what is marked goes with a later commit
        try:
            await self.commit()
        except StoreError as exc:  # the changes are marked again and their commands wait for them
            log.error("%s", exc)

    async def scheduling_loop(self) -> None:
        """Run a cycle when something changed (debounced) and on a timer, until cancelled.

        Cycles are spaced by what the last one cost (see CYCLE_GAP_FACTOR), so a
        burst of submits is scheduled in a few cycles rather than one per submit;
        and those that build the scheduler anew by what the last such one cost, at
        least MIN_BUILD_GAP_S apart, so a burst of node registrations is too.
        """
        last = 0.0
        while True:
            await wait_event(self.kick, self.config.interval_s)
            spacing = min(MAX_CYCLE_GAP_S, CYCLE_GAP_FACTOR * self.last_cycle_work_s)
            gap = last + spacing - time.monotonic()
            if self.cluster.core.builds_anew():
                gap = max(gap, self.last_build_began + build_spacing(self.last_build_work_s) - time.monotonic())
            if self.config.debounce_ms or gap > 0:
                await asyncio.sleep(max(self.config.debounce_ms / 1000, gap))
            self.kick.clear()
            last = time.monotonic()
            try:
                await self.run_cycle()
            except asyncio.CancelledError:
                raise
            except StoreError as exc:  # the plan's changes are marked again; its commands wait for them
                log.error("%s", exc)
                await asyncio.sleep(1.0)
            except Exception:
                log.exception("scheduling cycle failed; the scheduler is rebuilt at the next cycle")
                self.cluster.core.rebuild()
                await asyncio.sleep(1.0)

    async def run_cycle(self) -> None:
        """One scheduling cycle: the core runs in its thread; its plan is carried out here."""
        cluster = self.cluster
        work_began = time.perf_counter()
        cluster.job_service.check_time_limits()
        cluster.plans.settle_preemptions()
        now = self.clock()
        inline = self.last_cycle_s < INLINE_CYCLE_S and not cluster.core.heavy(INLINE_OPS)
        # In its thread, the core gives the loop's thread a turn every so many steps (gpud.controller.cycle_turns).
        loop_first = cycle_turns.LoopFirst()
        turn = None if inline else loop_first.give
        usage = self.charger.decayed_usage()
        ops, anew = cluster.core.begin()
        if anew:
            self.last_build_began = time.monotonic()
            nodes, specs = await self._snapshot()
            ready = cluster.core.build_later(nodes, specs, now, usage, turn, cycle_turns.TURN_EVERY)
        else:
            ready = cluster.core.apply_later(ops, usage)

        def cycle() -> Plan:
            return ready().cycle(now, turn)
        began = time.perf_counter()
        try:
            if inline:
                plan = cycle()
            else:
                loop_first.start()
                try:
                    plan = await asyncio.get_running_loop().run_in_executor(self.cycle_executor, cycle)
                finally:
                    loop_first.stop()
        except BaseException:
            cluster.core.running = False
            cluster.core.rebuild()
            raise
        self.last_cycle_s = time.perf_counter() - began
        self.cycle_seconds.observe(self.last_cycle_s)
        self.cycles += 1
        carried, skip = cluster.core.finished(plan)
        if carried is not None:
            slices = Slices()
            # The loop turns between the steps: skip is the core's own set, which marks the jobs changed meanwhile.
            for _ in cluster.plans.apply_in_steps(carried, skip):
                await slices.pause()
        else:
            self.kick.set()
        if cluster.last_plan is not None:
            self.planned.set()
        self.last_cycle_work_s = time.perf_counter() - work_began
        if anew:
            self.builds += 1
            self.last_build_work_s = self.last_cycle_work_s
        await self.commit()

    async def plan_for_views(self) -> Plan | None:
        """The last cycle's plan, for a view made from it; before the first one, this leader asks for a cycle and
        waits up to FIRST_PLAN_WAIT_S for its plan. None when there is none by then (a standby plans none)."""
        if self.cluster.last_plan is None and self.role == "leader":
            self.kick.set()
            try:
                await asyncio.wait_for(self.planned.wait(), FIRST_PLAN_WAIT_S)
            except asyncio.TimeoutError:
                pass
        return self.cluster.last_plan

    async def _snapshot(self) -> tuple[tuple[NodeSpec, ...], tuple[JobSpec, ...]]:
        """The nodes and jobs the scheduler is built anew from, read a slice at a time (16,000 jobs take about
        a second): what changes meanwhile the core has queued for the next cycle (CoreSync.begin)."""
        cluster = self.cluster
        slices = Slices()
        nodes = []
        for node in list(cluster.nodes.values()):
            if node.state != "down":
                nodes.append(node.spec())
            await slices.pause()
        specs = []
        for job_id in sorted(cluster.core.in_core, key=_seq_key):
            job = cluster.jobs.get(job_id)
            if job is not None and job_id in cluster.core.in_core:  # else it left meanwhile (and was touched)
                specs.append(cluster.job_service.core_spec(job))
            await slices.pause()
        return tuple(nodes), tuple(specs)

    async def node_watch(self) -> None:
        """Mark silent nodes down, every few seconds, until cancelled."""
        period = max(0.05, min(self.config.node_timeout_s / 4, 5.0))
        while True:
            await asyncio.sleep(period)
            self.cluster.node_messages.check_nodes(self.config.node_timeout_s)
            try:
                await self.commit()
                await self.prune_answers()
            except Exception as exc:  # noqa: BLE001 - marked again: the next commit retries
                if not (isinstance(exc, StoreError) or is_store_failure(exc)):
                    raise
                log.error("%s", exc)

    def reload_policy(self) -> Policy:
        """Read the policy file again and use it; a bad file raises ConfigError and the old policy stays."""
        policy, pm, data = load_policy_and_plugins(self.config.policy)
        self.policy, self.pm, self.policy_data = policy, pm, data
        self.cluster.set_policy(policy, pm)
        return policy

    async def read_log(self, node: str, job: str, task: int, path: str, offset: int, limit: int,
                       user: str) -> dict:
        """Ask a node for a piece of a job's log file; raises LookupError when the node is not connected."""
        link = self.links.get(node)
        if link is None:
            raise LookupError(f"node {node} is not connected")
        request = f"log-{id(link)}-{time.monotonic_ns()}"
        future = asyncio.get_running_loop().create_future()
        self.log_requests[request] = future
        try:
            await link.send_str(jsontext.dumps({"type": "read_log", "request": request, "job": job, "task": task,
                                            "path": path, "offset": offset, "limit": limit, "user": user}))
            return await asyncio.wait_for(future, 10.0)
        finally:
            self.log_requests.pop(request, None)


def _seq_key(job_id: str) -> tuple[int, str]:
    head, _, tail = job_id.partition("_")
    return (int(head) if head.isdigit() else 0, tail.zfill(12))


def _local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid{os.getuid()}"


__all__ = ["Controller", "ConfigError", "load_policy_and_plugins"]
