"""The controller's running parts: store, cluster state, scheduling loop, node links, all started and stopped together."""

from __future__ import annotations

import asyncio
import gc
import getpass
import logging
import os
import sqlite3
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpud import jsontext
from gpud.accounting.charger import Charger
from gpud.controller.auth import Auth, digest, new_token, read_or_create_secret
from gpud.controller.cluster import Cluster
from gpud.controller.config import ControllerConfig
from gpud.controller.idempotency import ANSWERS_KEPT_S, Idempotency
from gpud.controller.nodes import NodeRecord
from gpud.controller.persist import Persister, StoreError
from gpud.controller.rate import SubmitRate
from gpud.controller.state_dir import StateError, open_state, restore_hint
from gpud.core import COMPILED
from gpud.errors import ConfigError
from gpud.jobs import Job
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
MAX_CYCLE_GAP_S = 0.01
CYCLE_GAP_FACTOR = 2.0
GIL_SWITCH_INTERVAL_S = 0.0005
# A cycle as short as the last one was runs on the event loop: handing it to
# a thread costs more than it does. Longer cycles run in their own thread so
# the API keeps answering.
INLINE_CYCLE_S = 0.002


def load_policy_and_plugins(path: str) -> tuple[Policy, Any, dict]:
    """The policy file, the plugin manager it asks for, and its raw tables; a ConfigError names what is wrong."""
    data, source = read_toml(path)
    policy = require_projects(parse_policy(data, source, ANY_PLACEMENT), source)
    pm = make_plugin_manager(policy.plugins.disable, policy.plugins.directory)
    check_placements(policy, placement_strategies(pm), path)
    return policy, pm, data


class Controller:
    """Everything the HTTP handlers call: one instance per running controller."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.policy, self.pm, self.policy_data = load_policy_and_plugins(config.policy)
        self.store_executor = ThreadPoolExecutor(1, thread_name_prefix="gpud-store")
        self.cycle_executor = ThreadPoolExecutor(1, thread_name_prefix="gpud-cycle")
        self.files = open_state(config.state_dir, init=config.init, synchronous=config.synchronous.upper())
        self.store = self.files.store
        self.cluster_id = self.files.cluster_id
        self.persist = Persister(self.store, self.store_executor)
        self.cluster = Cluster(self.policy, self.pm, self.persist)
        self.links: dict[str, Any] = {}
        self.log_requests: dict[str, asyncio.Future] = {}
        self.kick = asyncio.Event()
        self.cluster.wake = self.kick.set
        self.cycle_seconds = Histogram("gpud_scheduling_cycle_seconds", "Time of one scheduling cycle.", "")
        self.api_seconds = Histogram("gpud_api_request_seconds", "API request latency by route.", "route")
        self.cycles = 0
        self.last_cycle_s = 1.0          # the first cycle may be a big one: give it the thread
        self.last_cycle_work_s = 1.0     # the same, with preparing it and applying its plan
        self.started = time.time()
        self.auth: Auth  # set when the state is opened, before the API answers
        self.idempotency = Idempotency(self._stored_answer)
        self.submit_rate = SubmitRate(config.submit_rate, config.submit_burst)
        self.answers_pruned = 0.0
        self.usage_store = UsageStore(self.store.path, synchronous=config.synchronous.upper())
        self.charger = Charger(self.usage_store, self.store_executor, lambda: self.policy, self._placed_jobs,
                               self._pool_of)
        self.cluster.run_ended = self.charger.run_ended

    def _placed_jobs(self) -> list[Job]:
        """The jobs holding a placement on some node now."""
        jobs = self.cluster.jobs
        ids = {job_id for wanted in self.cluster.wanted.values() for job_id, _ in wanted.values()}
        return [jobs[job_id] for job_id in ids if job_id in jobs]

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
        key, created = read_or_create_secret(self.config.key_path, new_token)
        if created:
            log.info("wrote a new cluster key to %s (copy it to every node)", self.config.key_path)
        self.auth = Auth(loaded.tokens, key)
        self.cluster.task_secret = key
        if not loaded.tokens:
            token, _ = read_or_create_secret(self.config.admin_token_path, new_token)
            record = TokenRecord(digest(token), _local_user(), True, time.time(),
                                 allow_root=self.config.admin_allow_root)
            self.persist.token(record)
            self.auth.add(record)
            log.info("wrote the admin token (user %s%s) to %s", record.user,
                     ", its jobs may run as root" if record.allow_root else "", self.config.admin_token_path)
        jobs = [Job.from_record(jsontext.loads(record)) for record in loaded.jobs]
        nodes = [NodeRecord.from_json(record) for record in loaded.nodes.values()]
        # Job ids go on after the highest ever stored (stores written before ids were derived so kept a counter).
        next_seq = max(loaded.last_seq + 1, int(loaded.meta.get("next_seq", "1")))
        await loop.run_in_executor(self.store_executor, self.charger.load)
        self.cluster.restore(jobs, nodes, next_seq)
        gc.freeze()  # the jobs read back live long: see api.commit_new
        await self.persist.flush()
        await self.prune_answers()
        log.info("controller state: %d active jobs, %d nodes, from %s; scheduling core %s", len(jobs), len(nodes),
                 self.store.path, "compiled with mypyc" if COMPILED else "in Python (GPUD_COMPILE=1 compiles it)")

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
        try:
            try:
                await self.charger.charge()
            except Exception as exc:  # noqa: BLE001 - a failed last charge must not keep the jobs unwritten
                log.error("the last usage charge failed: %s", exc)
            try:
                await self.persist.flush()
            except StoreError as exc:  # every acknowledged change is already durable; these were never promised
                log.error("stopping with changes not written: %s", exc)
        finally:
            self.cluster.job_events.close()
            self.store_executor.submit(self.usage_store.close).result()
            self.store_executor.submit(self.store.close).result()
            self.store_executor.shutdown()
            self.files.close()
            self.cycle_executor.shutdown(cancel_futures=True)

    async def commit(self) -> None:
        """Make every change so far durable, then deliver the commands those changes made."""
        commands = self.cluster.take_commands()
        try:
            await self.persist.flush()
        except StoreError:
            self.cluster.put_back_commands(commands)  # sent after the changes that made them are durable
            raise
        for node, messages in commands.items():
            link = self.links.get(node)
            if link is None:
                continue
            try:
                for message in messages:
                    await link.send_str(jsontext.dumps(message))
            except (ConnectionError, RuntimeError) as exc:
                log.warning("could not send commands to node %s: %s", node, exc)

    async def scheduling_loop(self) -> None:
        """Run a cycle when something changed (debounced) and on a timer, until cancelled.

        Cycles are spaced by what the last one cost (see CYCLE_GAP_FACTOR), so a
        burst of submits is scheduled in a few cycles rather than one per submit.
        """
        last = 0.0
        while True:
            await wait_event(self.kick, self.config.interval_s)
            spacing = min(MAX_CYCLE_GAP_S, CYCLE_GAP_FACTOR * self.last_cycle_work_s)
            gap = last + spacing - time.monotonic()
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
        cluster.check_time_limits()
        cluster.settle_preemptions()
        now = time.time()
        scheduler = cluster.core.prepare(
            (node.spec() for node in cluster.nodes.values() if node.state != "down"),
            lambda: (cluster.core_spec(cluster.jobs[i]) for i in sorted(cluster.core.in_core, key=_seq_key)), now,
            usage=self.charger.decayed_usage())
        began = time.perf_counter()
        try:
            if self.last_cycle_s < INLINE_CYCLE_S:
                plan = scheduler.cycle(now)
            else:
                plan = await asyncio.get_running_loop().run_in_executor(self.cycle_executor, scheduler.cycle, now)
        except BaseException:
            cluster.core.running = False
            cluster.core.rebuild()
            raise
        self.last_cycle_s = time.perf_counter() - began
        self.cycle_seconds.observe(self.last_cycle_s)
        self.cycles += 1
        carried, skip = cluster.core.finished(plan)
        if carried is not None:
            cluster.apply_plan(carried, skip)
        else:
            self.kick.set()
        self.last_cycle_work_s = time.perf_counter() - work_began
        await self.commit()

    async def node_watch(self) -> None:
        """Mark silent nodes down, every few seconds, until cancelled."""
        period = max(0.05, min(self.config.node_timeout_s / 4, 5.0))
        while True:
            await asyncio.sleep(period)
            self.cluster.check_nodes(self.config.node_timeout_s)
            try:
                await self.commit()
                await self.prune_answers()
            except (StoreError, sqlite3.Error) as exc:  # marked again: the next commit retries
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
