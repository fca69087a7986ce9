"""Reading a scenario file (SCENARIOS.md): a policy, a cluster state and what must hold after the cycles."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Mapping

from gpud.errors import ConfigError
from gpud.model import EPS, JobSpec, NodeSpec, Snapshot, TaskPlacement, TaskRequest
from gpud.policy import Policy
from gpud.policy_file import DEFAULT_PLACEMENTS, check_pool, parse_policy
from gpud.tomlcheck import (Table, as_int, as_list, as_number, choices, describe, fmt, quote, read_toml,
                            suggestion)

SCENARIO_KEYS = ("now", "until", "cycles", "stable_cycles", "policy", "nodes", "jobs", "usage", "expect")
USAGE_KEYS = ("level", "name", "pool", "gpu_hours")
USAGE_LEVELS = ("department", "project", "user")
NODE_KEYS = ("name", "gpus", "gpu_memory_gib", "cpus", "memory_gib", "pool", "labels")
JOB_KEYS = ("name", "project", "priority", "count", "tasks", "min_tasks", "gpus", "gpu_memory_gib", "cpus",
            "memory_gib", "submitted", "running_on", "started", "gpu_index", "node_selector", "pool", "user",
            "runtime", "time_limit", "predicted_runtime")
EXPECT_KEYS = ("running", "pending", "preempted", "placement", "project_gpus", "fair_share", "running_tasks",
               "gpu_index", "finished", "started", "estimated_start")
MAX_NODES = 20_000
MAX_GPUS_PER_NODE = 1_024
MAX_CPUS_PER_NODE = 10_000
MAX_MEMORY_GIB = 10_000_000
MAX_JOBS = 200_000
MAX_TASKS_PER_JOB = 10_000
MAX_TASKS = 1_000_000
MAX_CYCLES = 1_000
SHARE_TOLERANCE = 1e-9
NOW_AFTER_LATEST_S = 3600.0


@dataclass(frozen=True, slots=True)
class Expectations:
    """What must hold after the last cycle; None means "not checked"."""

    running: frozenset[str] | None = None
    pending: frozenset[str] | None = None
    preempted: frozenset[str] | None = None
    placement: Mapping[str, tuple[str, ...]] | None = None
    project_gpus: Mapping[str, float] | None = None
    fair_share: Mapping[str, float] | None = None
    running_tasks: Mapping[str, int] | None = None
    gpu_index: Mapping[str, tuple[tuple[int, ...], ...]] | None = None
    finished: frozenset[str] | None = None
    started: Mapping[str, float] | None = None
    estimated_start: Mapping[str, float] | None = None


@dataclass(frozen=True, slots=True)
class Scenario:
    """A policy and a cluster state to run ``cycles`` (then ``stable_cycles``) scheduling cycles on.

    With ``until``, the scenario runs in simulated time instead: from the
    snapshot's ``now``, jobs are submitted at their ``submitted`` time, run
    for their ``runtimes`` entry (or to their time limit), and a cycle runs at
    every submission and every end, until the clock passes ``until``.
    """

    source: str
    policy: Policy
    snapshot: Snapshot
    cycles: int
    stable_cycles: int
    expect: Expectations | None
    until: float | None = None
    runtimes: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclass(slots=True)
class _Job:
    """A job being read: its spec, the table it came from, and the node and GPUs of each task."""

    source: str
    where: str
    id: str
    project: str
    request: TaskRequest
    priority: int
    tasks: int
    min_tasks: int | None
    submitted: float
    started: float | None
    node_selector: dict[str, str]
    pool: str | None
    nodes: tuple[str | None, ...] | None
    explicit: tuple[tuple[int, ...] | None, ...] | None
    copied: bool = False
    seq: int = 0
    placements: list[TaskPlacement | None] = dataclasses.field(default_factory=list)
    user: str = ""
    runtime: float | None = None
    time_limit: float | None = None
    predicted_runtime: float | None = None

    def error(self, key: str, message: str) -> ConfigError:
        """A ConfigError about ``key`` of this job's table, naming the job when ``count`` made it."""
        suffix = f" (job {quote(self.id)})" if self.copied else ""
        return ConfigError(self.source, f"{self.where}.{key}", message + suffix)

    def copy_as(self, job_id: str, copied: bool, seq: int) -> _Job:
        """This job under another name and place in the order, with no task placed yet."""
        return _Job(self.source, self.where, job_id, self.project, self.request, self.priority, self.tasks,
                    self.min_tasks, self.submitted, self.started, self.node_selector, self.pool, self.nodes,
                    self.explicit, copied, seq, [None] * self.tasks, user=self.user, runtime=self.runtime,
                    time_limit=self.time_limit, predicted_runtime=self.predicted_runtime)

    def spec(self) -> JobSpec:
        """The finished, immutable job."""
        return JobSpec(id=self.id, project=self.project, request=self.request, priority=self.priority,
                       tasks=self.tasks, min_tasks=self.min_tasks, submitted=self.submitted,
                       started=self.started, placements=tuple(self.placements),
                       node_selector=self.node_selector, pool=self.pool, seq=self.seq, user=self.user,
                       time_limit=self.time_limit, predicted_runtime=self.predicted_runtime)


def load_scenario(path: str | os.PathLike, known_placements: frozenset[str] = DEFAULT_PLACEMENTS) -> Scenario:
    """Read a scenario file; a missing file, a TOML syntax error or an impossible state is a ConfigError."""
    data, source = read_toml(path)
    return parse_scenario(data, source, known_placements)


def parse_scenario(data: dict, source: str, known_placements: frozenset[str] = DEFAULT_PLACEMENTS) -> Scenario:
    """Build a Scenario from the parsed TOML of a scenario file, refusing unknown keys and impossible states."""
    top = Table(data, source, "", SCENARIO_KEYS)
    cycles = top.integer("cycles", 1, lo=1, hi=MAX_CYCLES)
    stable_cycles = top.integer("stable_cycles", 0, lo=0, hi=MAX_CYCLES)
    raw_policy = data.get("policy", {})
    policy = parse_policy(raw_policy, source, known_placements, where="policy")
    if "min_runtime" not in raw_policy:
        policy = dataclasses.replace(policy, min_runtime_s=0.0)
    nodes = _nodes(top, policy)
    jobs = _jobs(top, policy, nodes)
    until = top.number("until", None, lo=0)
    now = _now(top, jobs, until is not None)
    if until is not None and until < now:
        raise top.error("until", f"must not be before now ({fmt(now)}) (got {fmt(until)})")
    _place(jobs, nodes)
    snapshot = Snapshot(tuple(nodes.values()), tuple(job.spec() for job in jobs), now, _usage(top, policy))
    expect = _expectations(top, policy, nodes, {job.id: job for job in jobs})
    runtimes = {job.id: job.runtime for job in jobs if job.runtime is not None}
    return Scenario(source, policy, snapshot, cycles, stable_cycles, expect, until, runtimes)


def _usage(top: Table, policy: Policy) -> dict[tuple[str, str, str], float]:
    """Past usage as decayed GPU-seconds by (level, pool, name), from the ``[[usage]]`` entries' GPU-hours."""
    usage: dict[tuple[str, str, str], float] = {}
    for index, raw in top.tables("usage", MAX_JOBS):
        table = Table(raw, top.source, top.entry("usage", index), USAGE_KEYS)
        level = table.string("level")
        if level not in USAGE_LEVELS:
            raise table.error("level", f"unknown level {quote(level)}{suggestion(level, USAGE_LEVELS)} "
                                       f"(levels: {choices(USAGE_LEVELS)})")
        name = table.string("name")
        known = {"department": policy.departments, "project": policy.projects}.get(level)
        if known is not None and name not in known:
            raise table.error("name", f"unknown {level} {quote(name)}{suggestion(name, known)} "
                                      f"({level}s in [policy]: {choices(known)})")
        if level == "user":
            project, _, user = name.partition("/")
            if not user or project not in policy.projects:
                raise table.error("name", f"a user's usage is named \"<project>/<user>\" with a project of "
                                          f"[policy] (got {quote(name)})")
        pool = check_pool(table, "pool", policy) or policy.default_pool
        key = (level, pool, name)
        usage[key] = usage.get(key, 0.0) + table.number("gpu_hours", lo=0) * 3600.0
    return usage


def _nodes(top: Table, policy: Policy) -> dict[str, NodeSpec]:
    nodes: dict[str, NodeSpec] = {}
    for index, raw in top.tables("nodes", MAX_NODES):
        table = top.named("nodes", index, raw, NODE_KEYS, nodes)
        name = table.data["name"]
        nodes[name] = NodeSpec(
            name=name,
            gpus=table.integer("gpus", 0, lo=0, hi=MAX_GPUS_PER_NODE),
            gpu_memory_gib=table.number("gpu_memory_gib", 80.0, above=0, hi=MAX_MEMORY_GIB),
            cpus=table.number("cpus", 64.0, lo=0, hi=MAX_CPUS_PER_NODE),
            memory_gib=table.number("memory_gib", 512.0, lo=0, hi=MAX_MEMORY_GIB),
            pool=check_pool(table, "pool", policy) or policy.default_pool,
            labels=table.labels("labels"),
        )
    return nodes


def _jobs(top: Table, policy: Policy, nodes: Mapping[str, NodeSpec]) -> list[_Job]:
    jobs: list[_Job] = []
    made_by: dict[str, str] = {}
    total_tasks = 0
    for index, raw in top.tables("jobs", MAX_JOBS):
        table = top.named("jobs", index, raw, JOB_KEYS, ())
        name = table.data["name"]
        count = table.integer("count", None, lo=1, hi=MAX_JOBS)
        template = _job(table, policy, nodes)
        names = [name] if count is None else [f"{name}-{k}" for k in range(1, count + 1)]
        total_tasks += len(names) * template.tasks
        if len(jobs) + len(names) > MAX_JOBS or total_tasks > MAX_TASKS:
            raise table.error("count" if count else "tasks",
                              f"the scenario would hold more than {MAX_JOBS} jobs or {MAX_TASKS} tasks")
        for job_name in names:
            if job_name in made_by:
                raise table.error("name", f"duplicate job name {quote(job_name)}, also made by {made_by[job_name]}")
            made_by[job_name] = table.where
            jobs.append(template.copy_as(job_name, count is not None, len(jobs)))
    return jobs


def _job(table: Table, policy: Policy, nodes: Mapping[str, NodeSpec]) -> _Job:
    """The job a [[jobs]] table describes, before ``count`` copies it."""
    project = table.string("project")
    if project not in policy.projects:
        raise table.error("project", f"unknown project {quote(project)}{suggestion(project, policy.projects)} "
                                     f"(projects in [policy]: {choices(policy.projects)})")
    request = _request(table)
    tasks = table.integer("tasks", 1, lo=1, hi=MAX_TASKS_PER_JOB)
    min_tasks = table.integer("min_tasks", None, lo=1)
    if min_tasks is not None and min_tasks > tasks:
        raise table.error("min_tasks", f"must be at most tasks ({tasks}) (got {min_tasks})")
    submitted = table.number("submitted", 0.0, lo=0)
    job = _Job(table.source, table.where, table.data["name"], project, request, _priority(table, policy),
               tasks, min_tasks, submitted, None, table.labels("node_selector"), check_pool(table, "pool", policy),
               _running_on(table, tasks, nodes), None)
    job.user = table.string("user", "")
    job.runtime = table.number("runtime", None, above=0)
    job.predicted_runtime = table.number("predicted_runtime", None, above=0)
    priority_class = table.data.get("priority") if isinstance(table.data.get("priority"), str) else "train"
    job.time_limit = policy.time_limit_for(job.pool or policy.default_pool, priority_class,
                                           table.number("time_limit", None, above=0))
    started = table.number("started", None, lo=0)
    running = sum(1 for node in job.nodes or () if node is not None)
    if started is not None and not running:
        raise table.error("started", "only a running job has a start time: running_on names no node")
    if started is not None and started < submitted:
        raise table.error("started", f"must not be before submitted ({fmt(submitted)}) (got {fmt(started)})")
    if running:
        minimum = tasks if min_tasks is None else min_tasks
        if running < minimum:
            raise table.error("running_on", f"{running} of {tasks} tasks run, fewer than the gang minimum "
                                            f"({minimum}): a gang runs at least its minimum or not at all")
        job.started = submitted if started is None else started
        for node_name in dict.fromkeys(n for n in job.nodes or () if n is not None):
            _check_fits(table, job, nodes[node_name])
    job.explicit = _gpu_index(table, request, job.nodes, nodes)
    return job


def _request(table: Table) -> TaskRequest:
    if "gpus" in table and "gpu_memory_gib" in table:
        raise table.error("gpu_memory_gib", "give gpus or gpu_memory_gib, not both")
    gpus = table.number("gpus", 0.0, lo=0, hi=MAX_GPUS_PER_NODE)
    if gpus > 1 and not gpus.is_integer():
        raise table.error("gpus", f"must be a fraction of one GPU (below 1) or a whole number of GPUs "
                                  f"(got {fmt(gpus)})")
    return TaskRequest(gpus=gpus, gpu_memory_gib=table.number("gpu_memory_gib", None, above=0, hi=MAX_MEMORY_GIB),
                       cpus=table.number("cpus", 1.0, lo=0, hi=MAX_CPUS_PER_NODE),
                       memory_gib=table.number("memory_gib", 1.0, lo=0, hi=MAX_MEMORY_GIB))


def _priority(table: Table, policy: Policy) -> int:
    value = table.data.get("priority", "train")
    if isinstance(value, str):
        if value not in policy.priority_classes:
            known = ", ".join(f"{name} ({p})" for name, p in policy.priority_classes.items())
            raise table.error("priority", f"unknown priority class {quote(value)}"
                                          f"{suggestion(value, policy.priority_classes)} "
                                          f"(known: {known}; or an integer)")
        return policy.priority_classes[value]
    return as_int(value, table.source, table.at("priority"), lo=-1_000_000_000, hi=1_000_000_000,
                  expected="a priority class name or an integer")


def _running_on(table: Table, tasks: int, nodes: Mapping[str, NodeSpec]) -> tuple[str | None, ...] | None:
    if "running_on" not in table:
        return None
    where = table.at("running_on")
    items = as_list(table.data["running_on"], table.source, where, expected="an array of node names")
    if len(items) != tasks:
        raise table.error("running_on", f"has {len(items)} entries for {tasks} task(s): give one node per task "
                                        f"(\"\" for a task that is pending)")
    for i, item in enumerate(items, 1):
        if not isinstance(item, str):
            raise ConfigError(table.source, f"{where}[{i}]", f"expected a node name, got {describe(item)}")
        if item and item not in nodes:
            raise table.error("running_on", f"node {quote(item)} is not in [[nodes]]{suggestion(item, nodes)}")
    return tuple(item or None for item in items)


def _check_fits(table: Table, job: _Job, node: NodeSpec) -> None:
    """Refuse a running task on a node its pool, selector or GPU memory request rules out."""
    if job.pool is not None and node.pool != job.pool:
        raise table.error("running_on", f"node {quote(node.name)} is in node pool {quote(node.pool)}, "
                                        f"not in the job's pool {quote(job.pool)}")
    for key, value in job.node_selector.items():
        if node.labels.get(key) != value:
            raise table.error("running_on", f"node {quote(node.name)} does not match node_selector "
                                            f"({key} = {quote(value)})")
    if job.request.gpu_memory_gib is not None and job.request.gpu_memory_gib > node.gpu_memory_gib + EPS:
        raise table.error("gpu_memory_gib", f"asks for {fmt(job.request.gpu_memory_gib)} GiB but a GPU of node "
                                            f"{quote(node.name)} has {fmt(node.gpu_memory_gib)} GiB")


def _gpu_index(table: Table, request: TaskRequest, on: tuple[str | None, ...] | None,
               nodes: Mapping[str, NodeSpec]) -> tuple[tuple[int, ...] | None, ...] | None:
    if "gpu_index" not in table:
        return None
    if on is None:
        raise table.error("gpu_index", "only a running job holds GPUs: give running_on too")
    where = table.at("gpu_index")
    items = as_list(table.data["gpu_index"], table.source, where, expected="an array of GPU index arrays")
    if len(items) != len(on):
        raise table.error("gpu_index", f"has {len(items)} entries for {len(on)} task(s): give one array of "
                                       f"GPU indices per task")
    want = (1 if request.is_shared else request.whole_gpus) if request.uses_gpu else 0
    explicit: list[tuple[int, ...] | None] = []
    for i, (item, node_name) in enumerate(zip(items, on), 1):
        at = f"{where}[{i}]"
        raw = as_list(item, table.source, at, expected="an array of GPU indices", limit=MAX_GPUS_PER_NODE)
        indices = tuple(as_int(x, table.source, f"{at}[{k}]", lo=0) for k, x in enumerate(raw, 1))
        if node_name is None:
            if indices:
                raise ConfigError(table.source, at, f"task {i} is pending (\"\" in running_on) and holds no GPU: "
                                                    f"give []")
            explicit.append(None)
            continue
        if len(indices) != want:
            raise ConfigError(table.source, at, f"task {i} holds {want} GPU(s), so give {want} "
                                                f"index(es) (got {len(indices)})")
        if len(set(indices)) != len(indices):
            raise ConfigError(table.source, at, "names a GPU more than once")
        gpus = nodes[node_name].gpus
        for index in indices:
            if index >= gpus:
                raise ConfigError(table.source, at, f"GPU {index} is out of range: node {quote(node_name)} has "
                                                    f"{gpus} GPU(s), numbered from 0")
        explicit.append(indices)
    return tuple(explicit)


def _now(top: Table, jobs: list[_Job], timed: bool) -> float:
    """The clock at the first cycle; in simulated time (``timed``) 0 by default, and jobs may be
    submitted later (the simulation submits them then)."""
    now = top.number("now", None, lo=0)
    if now is None and timed:
        now = 0.0
    if now is None:
        latest = max((max(job.submitted, job.started or 0.0) for job in jobs), default=0.0)
        return latest + NOW_AFTER_LATEST_S
    for job in jobs:
        if job.submitted > now and (not timed or job.started is not None):
            raise job.error("submitted", f"is after now ({fmt(now)}) (got {fmt(job.submitted)})")
        if job.started is not None and job.started > now:
            raise job.error("started", f"is after now ({fmt(now)}) (got {fmt(job.started)})")
    return now


def _place(jobs: list[_Job], nodes: Mapping[str, NodeSpec]) -> None:
    """Give every running task its GPUs: given indices first, then whole GPUs, then shares of one GPU."""
    used = {name: [0.0] * node.gpus for name, node in nodes.items()}
    host = {name: [0.0, 0.0] for name in nodes}
    whole: list[tuple[_Job, int, str]] = []
    shared: list[tuple[_Job, int, float, str]] = []
    for job in jobs:
        for k, name in enumerate(job.nodes or ()):
            if name is None:
                continue
            node = nodes[name]
            _charge_host(job, node, host[name])
            share = job.request.gpu_share_on(node.gpu_memory_gib) if job.request.is_shared else 1.0
            if not job.request.uses_gpu:
                job.placements[k] = TaskPlacement(name, (), 0.0)
            elif job.explicit is not None:
                indices = job.explicit[k]
                assert indices is not None  # given for each running task
                for i in indices:
                    used[name][i] += share
                    if used[name][i] > 1.0 + SHARE_TOLERANCE:
                        raise job.error("gpu_index", f"GPU {i} of node {quote(name)} would be used beyond a "
                                                     f"share of 1 (the tasks on it add up to {used[name][i]:g})")
                job.placements[k] = TaskPlacement(name, indices, share)
            elif job.request.is_shared:
                shared.append((job, k, share, name))
            else:
                whole.append((job, k, name))
    for job, k, name in whole:
        want = job.request.whole_gpus
        free = [i for i, u in enumerate(used[name]) if u <= SHARE_TOLERANCE][:want]
        if len(free) < want:
            raise job.error("running_on", f"node {quote(name)} has {nodes[name].gpus} GPU(s) and {len(free)} "
                                          f"free for task {k + 1}, which needs {want}")
        for i in free:
            used[name][i] = 1.0
        job.placements[k] = TaskPlacement(name, tuple(free), 1.0)
    for job, k, share, name in shared:
        gpus = used[name]
        fits = [i for i, u in enumerate(gpus) if u + share <= 1.0 + SHARE_TOLERANCE]
        if not fits:
            raise job.error("running_on", f"node {quote(name)} has no GPU with a share of {share:g} free "
                                          f"for task {k + 1}")
        i = next((i for i in fits if gpus[i] > SHARE_TOLERANCE), fits[0])
        gpus[i] += share
        job.placements[k] = TaskPlacement(name, (i,), share)


def _charge_host(job: _Job, node: NodeSpec, host: list[float]) -> None:
    host[0] += job.request.cpus
    host[1] += job.request.memory_gib
    if host[0] > node.cpus + EPS:
        raise job.error("running_on", f"node {quote(node.name)} has {fmt(node.cpus)} CPUs but its running "
                                      f"tasks ask for {fmt(host[0])}")
    if host[1] > node.memory_gib + EPS:
        raise job.error("running_on", f"node {quote(node.name)} has {fmt(node.memory_gib)} GiB of memory but "
                                      f"its running tasks ask for {fmt(host[1])}")


def _expectations(top: Table, policy: Policy, nodes: Mapping[str, NodeSpec],
                  jobs: Mapping[str, _Job]) -> Expectations | None:
    if "expect" not in top:
        return None
    table = top.table("expect", EXPECT_KEYS)
    sets = {key: table.names(key, jobs, "job") for key in ("running", "pending", "preempted")}
    both = sorted((sets["running"] or frozenset()) & (sets["pending"] or frozenset()))
    if both:
        raise table.error("pending", f"job {quote(both[0])} is also in running")
    queues = {**policy.projects, **policy.departments}

    def node_list(value: Any, where: str, job: _Job) -> tuple[str, ...]:
        items = _task_list(table, value, where, job, "an array of node names, one per task")
        for item in items:
            if not isinstance(item, str) or (item and item not in nodes):
                shown = quote(item) if isinstance(item, str) else describe(item)
                raise ConfigError(table.source, where, f"node {shown} is not in [[nodes]]")
        return tuple(items)

    def index_list(value: Any, where: str, job: _Job) -> tuple[tuple[int, ...], ...]:
        items = _task_list(table, value, where, job, "an array of GPU index arrays, one per task")
        return tuple(tuple(as_int(x, table.source, f"{where}[{i}]", lo=0, hi=MAX_GPUS_PER_NODE - 1)
                           for x in as_list(item, table.source, f"{where}[{i}]", limit=MAX_GPUS_PER_NODE))
                     for i, item in enumerate(items, 1))

    def amount(value: Any, where: str, _: Any) -> float:
        return float(as_number(value, table.source, where, lo=0))

    def tasks(value: Any, where: str, job: _Job) -> int:
        return as_int(value, table.source, where, lo=0, hi=job.tasks)

    def seconds(value: Any, where: str, _: Any) -> float:
        return float(as_number(value, table.source, where, lo=0))

    return Expectations(
        **sets,
        placement=table.keyed("placement", jobs, "job", node_list),
        project_gpus=table.keyed("project_gpus", policy.projects, "project", amount),
        fair_share=table.keyed("fair_share", queues, "project or department", amount),
        running_tasks=table.keyed("running_tasks", jobs, "job", tasks),
        gpu_index=table.keyed("gpu_index", jobs, "job", index_list),
        finished=table.names("finished", jobs, "job"),
        started=table.keyed("started", jobs, "job", seconds),
        estimated_start=table.keyed("estimated_start", jobs, "job", seconds),
    )


def _task_list(table: Table, value: Any, where: str, job: _Job, expected: str) -> list:
    items = as_list(value, table.source, where, expected=expected, limit=MAX_TASKS_PER_JOB)
    if len(items) != job.tasks:
        raise ConfigError(table.source, where, f"has {len(items)} entries but job {quote(job.id)} has "
                                               f"{job.tasks} task(s)")
    return items
