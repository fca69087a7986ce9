"""Reading the policy file (etc/gpud/policy.toml) into a Policy, refusing every mistake by file, table and key."""

from __future__ import annotations

import math
import os
from typing import Any

from gpud.accounting.decay import RESETS
from gpud.errors import ConfigError
from gpud.model import EPS, RESOURCES, Resources
from gpud.policy import (DEFAULT_DEPARTMENT, DEFAULT_POOL, DEFAULT_PRIORITY_CLASSES, DEFAULT_TASK_PIDS_MAX,
                         LEAST_LOST_WORK, TIME_SLICING_MODES, VICTIM_ORDERS, Department,
                         FairShare, Limits, NodePool, PluginSettings, Policy, Project, Reservations,
                         TimeSlicing)
from gpud.tomlcheck import REQUIRED, Table, as_number, choices, describe, fmt, quote, read_toml, spotted, suggestion

DEFAULT_PLACEMENTS = frozenset({"binpack", "spread"})


class _AnyName(frozenset):
    """A set that holds every name: reading a file before the plugins that name strategies are known."""

    def __contains__(self, item: object) -> bool:
        return True


ANY_PLACEMENT: frozenset[str] = _AnyName()
POLICY_KEYS = ("placement", "cpu_placement", "gpu_placement", "over_quota_weights", "min_runtime", "grace_period",
               "task_pids_max", "victim_order", "max_move_lost_hours", "age_weight",
               "default_pool", "priority_classes", "plugins", "departments", "projects", "node_pools",
               "partitions", "time_slicing", "usage_half_life", "usage_reset", "usage_charge_interval", "fair_share",
               "limits", "interactive_class", "reservations")
LIMITS_KEYS = ("user_gpus", "user_running_jobs", "user_pending_jobs")
FAIR_SHARE_KEYS = ("history", "strength", "entry_penalty", "user_order")
PRIORITY_CLASS_KEYS = ("priority", "idle_timeout", "default_time_limit")
RESERVATION_KEYS = ("jobs", "window", "estimate_jobs", "resolution", "default_time_limit", "max_time_limit")
TIME_SLICING_KEYS = ("mode", "lease_ms", "precision", "memory_tolerance", "memory_enforce", "memory_grace")
QUOTA_KEYS = {"gpu": "gpu_quota", "cpu": "cpu_quota", "memory": "memory_quota_gib"}
LIMIT_KEYS = {"gpu": "gpu_limit", "cpu": "cpu_limit", "memory": "memory_limit_gib"}
DEPARTMENT_KEYS = ("name", *QUOTA_KEYS.values(), "over_quota_weight", "over_quota_priority", "over_quota",
                   *LIMIT_KEYS.values())
PROJECT_KEYS = (*DEPARTMENT_KEYS, "department", "users", "priorities", "max_priority", "interactive_class",
                *LIMITS_KEYS, "running_jobs", "pending_jobs")
POOL_KEYS = ("name", "placement", "cpu_placement", "gpu_placement", "reservations")
PLUGIN_KEYS = ("disable", "directory")
MAX_QUEUES = 10_000
MAX_POOLS = 1_000


def load_policy(path: str | os.PathLike, known_placements: frozenset[str] = DEFAULT_PLACEMENTS) -> Policy:
    """Read a policy file; a missing file, a TOML syntax error, a bad setting or no project is a ConfigError."""
    data, source = read_toml(path)
    return require_projects(parse_policy(data, source, known_placements), source)


def require_projects(policy: Policy, source: str) -> Policy:
    """The policy of a policy file, refused when it has no project: every submit would be refused under it."""
    if not policy.projects:
        raise ConfigError(source, "projects", "the policy has no projects, so every submit would be refused; "
                                              "add at least one [[projects]] table with a name")
    return policy


SCENARIO_TABLES = ("policy", "nodes", "jobs", "expect")


def _refuse_scenario_tables(data: dict, source: str) -> None:
    """Name the mix-up when a policy file holds a scenario file's tables."""
    found = [key for key in SCENARIO_TABLES if key in data]
    if not found:
        return
    if found[0] == "policy":
        raise ConfigError(source, "policy", "unknown key: [policy] is a table of a scenario file (gpuctl "
                          "simulate); in a policy file its settings are top-level keys, before any table")
    raise ConfigError(source, found[0], "unknown key: nodes, jobs and expect belong in a scenario file "
                      "(gpuctl simulate), not in a policy file")


def parse_policy(data: dict, source: str, known_placements: frozenset[str] = DEFAULT_PLACEMENTS,
                 *, where: str = "") -> Policy:
    """Build a Policy from the parsed TOML of a policy file (or a scenario's [policy] table).

    ``source`` names the file in messages and ``where`` is the path of the
    table inside it ("" for a policy file, "policy" in a scenario).
    ``known_placements`` are the placement strategies the plugins implement.
    """
    if not where:
        _refuse_scenario_tables(data, source)
    top = Table(data, source, where, POLICY_KEYS)
    placement = _strategy(top, "placement", known_placements) or "binpack"
    cpu_placement = _strategy(top, "cpu_placement", known_placements) or "binpack"
    gpu_placement = _strategy(top, "gpu_placement", known_placements)
    default_pool = top.string("default_pool", DEFAULT_POOL)
    pools = _node_pools(top, known_placements, placement, cpu_placement)
    known_pools = (frozenset(pools) | {default_pool}) if pools else None
    priority_classes = _priority_classes(top)
    departments: dict[str, Department] = {}
    for index, raw in top.tables("departments", MAX_QUEUES):
        table = top.named("departments", index, raw, DEPARTMENT_KEYS, departments)
        departments[table.data["name"]] = Department(**_queue_settings(table, default_pool, known_pools))
    projects: dict[str, Project] = {}
    for index, raw in top.tables("projects", MAX_QUEUES):
        table = top.named("projects", index, raw, PROJECT_KEYS, projects)
        department = table.string("department", DEFAULT_DEPARTMENT)
        if department not in departments and department != DEFAULT_DEPARTMENT:
            known = [*departments, DEFAULT_DEPARTMENT]
            raise table.error("department", f"unknown department {quote(department)}"
                                            f"{suggestion(department, known)} (departments: {choices(known)})")
        projects[table.data["name"]] = Project(**_queue_settings(table, default_pool, known_pools),
                                               department=department, users=table.strings("users"),
                                               priorities=_allowed_classes(table, priority_classes),
                                               max_priority=table.integer("max_priority", None, lo=-1_000_000,
                                                                          hi=1_000_000),
                                               interactive_class=_class_name(table, "interactive_class",
                                                                             priority_classes, None),
                                               user_limits=_user_limits(table),
                                               job_limits=Limits(running_jobs=_count(table, "running_jobs"),
                                                                 pending_jobs=_count(table, "pending_jobs")))
    if DEFAULT_DEPARTMENT not in departments and any(
            p.department == DEFAULT_DEPARTMENT for p in projects.values()):
        departments[DEFAULT_DEPARTMENT] = Department(DEFAULT_DEPARTMENT, implicit=True)
    plugins = top.table("plugins", PLUGIN_KEYS)
    reservations = _reservations(top, Reservations())
    return Policy(
        departments=departments,
        projects=projects,
        pools=pools,
        default_pool=default_pool,
        partitions=_partitions(top, default_pool, known_pools),
        over_quota_weights=top.boolean("over_quota_weights", True),
        priority_classes=priority_classes,
        idle_timeouts=_idle_timeouts(top),
        interactive_class=_class_name(top, "interactive_class", priority_classes, "build") or "build",
        min_runtime_s=top.seconds("min_runtime", 300.0),
        grace_period_s=top.seconds("grace_period", 30.0),
        task_pids_max=top.integer("task_pids_max", DEFAULT_TASK_PIDS_MAX, lo=16, hi=4_194_304),
        victim_order=_victim_order(top),
        max_move_lost_hours=top.number("max_move_lost_hours", 2.0, lo=0),
        age_weight=top.number("age_weight", 0.0, lo=0),
        plugins=PluginSettings(disable=plugins.strings("disable"), directory=plugins.string("directory", None)),
        placement=placement,
        cpu_placement=cpu_placement,
        gpu_placement=gpu_placement,
        time_slicing=_time_slicing(top),
        **_usage_settings(top),
        fair_share=_fair_share(top),
        user_limits=_user_limits(top.table("limits", LIMITS_KEYS)),
        reservations=reservations,
        pool_reservations=_pool_reservations(top, reservations),
        class_time_limits=_class_seconds(top, "default_time_limit"),
    )


def _reservations(top: Table, base: Reservations) -> Reservations:
    """A ``reservations`` table (the policy's, or a node pool's over the policy's ``base``)."""
    table = top.table("reservations", RESERVATION_KEYS)
    default_limit = table.seconds("default_time_limit", base.default_time_limit_s)
    max_limit = table.seconds("max_time_limit", base.max_time_limit_s)
    for key, value in (("default_time_limit", default_limit), ("max_time_limit", max_limit)):
        if value is not None and not value > 0:
            raise table.error(key, "must be longer than 0 seconds")
    return Reservations(jobs=table.integer("jobs", base.jobs, lo=0, hi=100_000),
                        window_s=table.seconds("window", base.window_s),
                        estimate_jobs=table.integer("estimate_jobs", base.estimate_jobs, lo=0, hi=1_000_000),
                        resolution_s=table.seconds("resolution", base.resolution_s), default_time_limit_s=default_limit, max_time_limit_s=max_limit)


def _pool_reservations(top: Table, base: Reservations) -> dict[str, Reservations]:
    """Each node pool's own ``reservations`` table, over the policy's."""
    found: dict[str, Reservations] = {}
    seen: dict[str, None] = {}
    for index, raw in top.tables("node_pools", MAX_POOLS):
        table = top.named("node_pools", index, raw, POOL_KEYS, seen)
        seen[table.data["name"]] = None
        if "reservations" in table.data:
            found[table.data["name"]] = _reservations(table, base)
    return found


def _victim_order(top: Table) -> str:
    order = top.string("victim_order", LEAST_LOST_WORK)
    if order not in VICTIM_ORDERS:
        raise top.error("victim_order", f"victim_order must be one of {choices(VICTIM_ORDERS)}, not {quote(order)}"
                                        f"{suggestion(order, VICTIM_ORDERS)}")
    return order


def _usage_settings(top: Table) -> dict:
    reset = top.string("usage_reset", "none")
    if reset not in RESETS:
        raise top.error("usage_reset", f"unknown reset period {quote(reset)}{suggestion(reset, RESETS)}: "
                                       f"expected one of {choices(RESETS)}")
    interval = top.seconds("usage_charge_interval", 30.0)
    if not 0.1 <= interval <= 3600:
        raise top.error("usage_charge_interval", f"must be 0.1 s to an hour, not {interval:g} s")
    return {"usage_half_life_s": top.seconds("usage_half_life", 7 * 86400.0), "usage_reset": reset,
            "usage_charge_interval_s": interval}


def _count(table: Table, key: str) -> int | None:
    return table.integer(key, None, lo=0, hi=10_000_000)


def _user_limits(table: Table) -> Limits:
    """A user's limits from the ``user_gpus``, ``user_running_jobs`` and ``user_pending_jobs`` keys."""
    return Limits(gpus=table.number("user_gpus", None, lo=0, hi=10_000_000),
                  running_jobs=_count(table, "user_running_jobs"), pending_jobs=_count(table, "user_pending_jobs"))


def _fair_share(top: Table) -> FairShare:
    table = top.table("fair_share", FAIR_SHARE_KEYS)
    return FairShare(history=table.boolean("history", False),
                     strength=table.number("strength", 1.0, lo=0, hi=100),
                     entry_penalty_s=table.seconds("entry_penalty", 600.0),
                     user_order=table.boolean("user_order", True))


def _time_slicing(top: Table) -> TimeSlicing:
    table = top.table("time_slicing", TIME_SLICING_KEYS)
    mode = table.string("mode", "off")
    if mode not in TIME_SLICING_MODES:
        raise table.error("mode", f"unknown time-slicing mode {quote(mode)}{suggestion(mode, TIME_SLICING_MODES)} "
                                  f"(modes: {choices(TIME_SLICING_MODES)})")
    lease_ms = table.number("lease_ms", 250.0, lo=1, hi=60_000)
    precision = table.number("precision", 0.05, above=0, hi=1)
    return TimeSlicing(mode=mode, lease_ms=lease_ms, precision=precision,
                       memory_tolerance=table.number("memory_tolerance", 0.05, lo=0, hi=10),
                       memory_enforce=table.boolean("memory_enforce", True),
                       memory_grace_s=table.number("memory_grace", 10.0, lo=0))


def _strategy(table: Table, key: str, known: frozenset[str]) -> str | None:
    name = table.string(key, None)
    if name is not None and name not in known:
        raise table.error(key, f"unknown placement strategy {quote(name)}{suggestion(name, known)} "
                               f"(known strategies: {choices(known)})")
    return name


def _node_pools(top: Table, known: frozenset[str], placement: str, cpu_placement: str) -> dict[str, NodePool]:
    pools: dict[str, NodePool] = {}
    for index, raw in top.tables("node_pools", MAX_POOLS):
        table = top.named("node_pools", index, raw, POOL_KEYS, pools)
        pool_placement = _strategy(table, "placement", known) or placement
        pools[table.data["name"]] = NodePool(
            name=table.data["name"],
            placement=pool_placement,
            cpu_placement=_strategy(table, "cpu_placement", known) or cpu_placement,
            gpu_placement=_strategy(table, "gpu_placement", known) or pool_placement,
        )
    return pools


def _partitions(top: Table, default_pool: str, known_pools: frozenset[str] | None) -> dict[str, str]:
    """The ``[partitions]`` table: each Slurm partition name a job may give (``#SBATCH -p``) and its pool."""
    table = top.table("partitions", None)
    pools = known_pools if known_pools is not None else frozenset({default_pool})
    out: dict[str, str] = {}
    for name in table.data:
        pool = table.string(name)
        if pool not in pools:
            raise table.error(name, f"unknown node pool {quote(pool)}{suggestion(pool, pools)} "
                                    f"(node pools: {choices(pools)})")
        out[name] = pool
    return out


def _priority_classes(top: Table) -> dict[str, int]:
    table = top.table("priority_classes", None)
    classes = dict(DEFAULT_PRIORITY_CLASSES)
    for name in table.data:
        if not name:
            raise table.error(name, "a priority class needs a non-empty name")
        if isinstance(table.data[name], dict):
            entry = table.table(name, PRIORITY_CLASS_KEYS)
            classes[name] = entry.integer("priority", DEFAULT_PRIORITY_CLASSES.get(name, REQUIRED),
                                          lo=-1_000_000_000, hi=1_000_000_000)
        else:
            classes[name] = table.integer(name, lo=-1_000_000_000, hi=1_000_000_000)
    return classes


def _class_name(table: Table, key: str, classes: dict[str, int], default: str | None) -> str | None:
    """A setting that names one priority class (``interactive_class``), refused when no such class exists."""
    name = table.string(key, default)
    if name is not None and name not in classes:
        raise table.error(key, f"unknown priority class {quote(name)}{suggestion(name, classes)} "
                               f"(classes: {choices(classes)})")
    return name


def _allowed_classes(table: Table, classes: dict[str, int]) -> tuple[str, ...] | None:
    """A project's ``priorities``: the priority classes its users may name (None: every class)."""
    names = table.strings("priorities", None)
    if names is None:
        return None
    for index, name in enumerate(names):
        if name not in classes:
            raise spotted(ConfigError(table.source, f"{table.at('priorities')}[{index + 1}]",
                                      f"unknown priority class {quote(name)}{suggestion(name, classes)} "
                                      f"(classes: {choices(classes)})"), table.data, "priorities")
    return names


def _class_seconds(top: Table, key: str) -> dict[str, float]:
    """``key`` (a duration above 0) of each priority class written as a table that sets it."""
    table = top.table("priority_classes", None)
    found = {}
    for name, value in table.data.items():
        if isinstance(value, dict) and key in value:
            seconds = table.table(name, PRIORITY_CLASS_KEYS).seconds(key)
            if not seconds > 0:
                raise table.table(name, PRIORITY_CLASS_KEYS).error(key, "must be longer than 0 seconds")
            found[name] = seconds
    return found


def _idle_timeouts(top: Table) -> dict[str, float]:
    """``idle_timeout`` of each priority class written as a table: seconds, or "30m", "1.5h", "45s"."""
    table = top.table("priority_classes", None)
    timeouts = {}
    for name, value in table.data.items():
        if isinstance(value, dict) and "idle_timeout" in value:
            entry = table.table(name, PRIORITY_CLASS_KEYS)
            raw = value["idle_timeout"]
            if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
                raise entry.error("idle_timeout", f"expected seconds or a time such as \"30m\", \"1.5h\" or "
                                                  f"\"45s\", got {describe(raw)}")
            seconds = entry.seconds("idle_timeout")
            if not seconds > 0:
                raise entry.error("idle_timeout", "must be longer than 0 seconds")
            timeouts[name] = seconds
    return timeouts


def _queue_settings(table: Table, default_pool: str, known_pools: frozenset[str] | None) -> dict[str, Any]:
    """The QueueSettings fields of a department or project table."""
    quota = _per_pool(table, QUOTA_KEYS, default_pool, known_pools, 0.0)
    limit = _per_pool(table, LIMIT_KEYS, default_pool, known_pools, math.inf)
    for pool, cap in limit.items():
        deserved = quota.get(pool, Resources())
        for resource in RESOURCES:
            if cap.get(resource) < deserved.get(resource) - EPS:
                key = LIMIT_KEYS[resource]
                raise table.error(key, f"{key} ({fmt(cap.get(resource))}) is below {QUOTA_KEYS[resource]} "
                                       f"({fmt(deserved.get(resource))}) in node pool {quote(pool)}")
    return dict(
        name=table.data["name"],
        quota=quota,
        limit=limit,
        over_quota_weight=table.number("over_quota_weight", 1.0, lo=0),
        over_quota_priority=table.integer("over_quota_priority", 0, lo=-1_000_000_000, hi=1_000_000_000),
        over_quota=table.boolean("over_quota", True),
    )


def _per_pool(table: Table, keys: dict[str, str], default_pool: str, known_pools: frozenset[str] | None,
              fill: float) -> dict[str, Resources]:
    """Amounts per pool for the three keys of ``keys``; a resource not given in a pool is ``fill``."""
    amounts = {resource: _amounts(table, key, default_pool, known_pools) for resource, key in keys.items()}
    pools = [pool for per_pool in amounts.values() for pool in per_pool]
    return {pool: Resources(**{resource: amounts[resource].get(pool, fill) for resource in RESOURCES})
            for pool in dict.fromkeys(pools)}


def _amounts(table: Table, key: str, default_pool: str, known_pools: frozenset[str] | None) -> dict[str, float]:
    if key not in table:
        return {}
    value = table.data[key]
    if not isinstance(value, dict):
        expected = "a number or a table of node pool = number"
        try:
            return {default_pool: float(as_number(value, table.source, table.at(key), lo=0, expected=expected))}
        except ConfigError as exc:
            raise spotted(exc, table.data, key) from None
    pools = Table(value, table.source, table.at(key), None)
    amounts = {}
    for pool, amount in value.items():
        if known_pools is not None and pool not in known_pools:
            raise pools.error(pool, f"unknown node pool {quote(pool)}{suggestion(pool, known_pools)} "
                                    f"(node pools: {choices(known_pools)})")
        try:
            amounts[pool] = float(as_number(amount, table.source, pools.at(pool), lo=0))
        except ConfigError as exc:
            raise spotted(exc, value, pool) from None
    return amounts


def check_pool(table: Table, key: str, policy: Policy) -> str | None:
    """The pool named by ``key`` of ``table``; when the policy declares node pools it must be one of them."""
    pool = table.string(key, None)
    if pool is not None and policy.pools and pool not in policy.pools and pool != policy.default_pool:
        known = {*policy.pools, policy.default_pool}
        raise table.error(key, f"unknown node pool {quote(pool)}{suggestion(pool, known)} "
                               f"(node pools: {choices(known)})")
    return pool



def check_placements(policy: Policy, known: frozenset[str], source: str, prefix: str = "") -> None:
    """Refuse a policy that names a placement strategy no registered plugin implements.

    ``prefix`` is the path of the policy table in the file ("policy." in a scenario).
    """
    settings = [(prefix, "placement", policy.placement), (prefix, "cpu_placement", policy.cpu_placement),
                (prefix, "gpu_placement", policy.gpu_placement)]
    for pool in policy.pools.values():
        where = f"{prefix}node_pools (name = {quote(pool.name)})."
        settings += [(where, "placement", pool.placement), (where, "cpu_placement", pool.cpu_placement),
                     (where, "gpu_placement", pool.gpu_placement)]
    for where, key, name in settings:
        if name is not None and name not in known:
            raise ConfigError(source, where + key,
                              f"unknown placement strategy {quote(name)}{suggestion(name, known)} "
                              f"(known strategies: {choices(known)}; is the plugin that provides it "
                              f"installed and enabled?)")
