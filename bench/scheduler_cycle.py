"""Benchmark of one gpud scheduling cycle (`gpud.core.schedule`) on large, seeded workloads.

big: 1,000 nodes x 8 GPUs, 100 projects, 6,000 running tasks, 100,000 pending jobs (--size huge:
2,000 nodes, 12,000 running tasks, 300,000 pending; --quick: 100, 600, 10,000); (a) a full
cycle from a fresh snapshot, (b) steady cycles of the warm scheduler (`gpud.core.Scheduler`, as the
controller runs it) after 100 submissions + 100 completions. contended: every GPU busy, 20 projects far over their fair share and
20 below it with pending work: a cycle that reclaims.
    python bench/scheduler_cycle.py [--repeat 5] [--seed 1] [--quick | --size big|huge] [--users N]
        [--json] [--profile] [--hash] [--turns] [--time-limits] [--reservations N]
        [--victim-order least_lost_work|youngest_first]

With --users N every job belongs to one of N users of its project (u0 ... u{N-1}, drawn at random),
so the user order (fair share between a project's users) sorts each project's jobs; without it every
job has the one user "".

With --time-limits every job has a time limit (running jobs end within a day of now, pending
jobs ask for 1 h, 4 h or 24 h), so reservations and backfill are planned each cycle (gpud.core.
reservations); --reservations N sets how many jobs per pool hold one (0: none, and no estimates
either; default: the policy's default). --victim-order sets the policy's victim_order.

With --hash, each workload's plans (binds, evictions and every pending reason, cycle by cycle) are
hashed, so that two versions of the core, or the Python and the compiled core, can be shown to
decide alike: run it with each on PYTHONPATH (PYTHONPATH=OTHER_CHECKOUT python
bench/scheduler_cycle.py --hash) and compare. Every number is hashed as a float, as the compiled
core holds it. With --turns the core is given a turn that does nothing at every step of its long
loops (gpud.core.turns), as the controller gives one to a cycle in its thread: the hashes must not
change.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import hashlib
import io
import json
import os
import pathlib
import platform
import pstats
import random
import statistics
import sys
import time

import gpud
from gpud.core import COMPILED, Scheduler, schedule
from gpud.model import JobSpec, NodeSpec, Resources, Snapshot, TaskPlacement, TaskRequest
from gpud.plugins import make_plugin_manager
from gpud.policy import LEAST_LOST_WORK, VICTIM_ORDERS, Department, Policy, Project, Reservations

NOW = 1_000_000.0
POOL = "default"
TRAIN, INTERACTIVE, BUILD, INFERENCE = 50, 75, 100, 125
TARGETS = {"fresh": 1.0, "steady": 0.050}
PENDING_LIMITS = (3600.0, 4 * 3600.0, 24 * 3600.0)
TIME_LIMITS = False  # --time-limits: every job gets one
# (nodes, running tasks, pending jobs) of the big workload at each --size.
SIZES = {"quick": (100, 600, 10_000), "big": (1000, 6000, 100_000), "huge": (2000, 12_000, 300_000)}


def limited(job: JobSpec, rng: random.Random) -> JobSpec:
    """The job with a time limit when --time-limits asks for them (a running one ends within a day)."""
    if not TIME_LIMITS:
        return job
    if job.started is not None:
        return dataclasses.replace(job, time_limit=(NOW - job.started) + rng.uniform(60, 86400))
    return dataclasses.replace(job, time_limit=rng.choice(PENDING_LIMITS))


def make_nodes(count: int) -> tuple[NodeSpec, ...]:
    """``count`` identical nodes: 8 GPUs of 80 GiB, 64 CPUs, 512 GiB, in the default pool."""
    return tuple(NodeSpec(f"n{i:04d}", gpus=8, gpu_memory_gib=80.0, cpus=64, memory_gib=512)
                 for i in range(count))


def make_policy(rng: random.Random, depts: int, per_dept: int, gpus: int) -> Policy:
    """Departments x projects with varied GPU quotas summing to about ``gpus`` (some zero),
    weights 1-3 and a few projects with over-quota priority."""
    raw = [0.0 if rng.random() < 0.15 else rng.uniform(0.2, 1.0) for _ in range(depts * per_dept)]
    scale = gpus / sum(raw)
    departments, projects = {}, {}
    for d in range(depts):
        names = [f"p{d:02d}{k}" for k in range(per_dept)]
        quotas = [round(raw[d * per_dept + k] * scale) for k in range(per_dept)]
        departments[f"d{d:02d}"] = Department(f"d{d:02d}", quota={POOL: Resources(gpu=sum(quotas))},
                                              over_quota_weight=rng.choice([1, 2, 3]))
        for name, quota in zip(names, quotas):
            projects[name] = Project(name, quota={POOL: Resources(gpu=quota)}, department=f"d{d:02d}",
                                     over_quota_weight=rng.choice([1, 2, 3]),
                                     over_quota_priority=1 if rng.random() < 0.05 else 0)
    return Policy(departments=departments, projects=projects)


class Filler:
    """Places running tasks consistently (explicit gpu_index, no GPU or node over-committed)."""

    def __init__(self, nodes: tuple[NodeSpec, ...], rng: random.Random) -> None:
        self.nodes, self.rng = nodes, rng
        self.free = [[[1.0] * n.gpus, float(n.cpus), float(n.memory_gib)] for n in nodes]

    def place(self, req: TaskRequest) -> TaskPlacement | None:
        """A placement for one task, scanning from a random node; None when nothing fits."""
        start = self.rng.randrange(len(self.nodes))
        for i in [(start + k) % len(self.nodes) for k in range(len(self.nodes))]:
            share, cpu, mem = self.free[i]
            whole = [g for g, f in enumerate(share) if f >= 1.0]
            if req.is_shared:  # a partly used GPU first, else a whole one
                gpus = ([g for g, f in enumerate(share) if 1.0 > f >= req.gpus] or whole)[:1]
            else:
                gpus = whole[:req.whole_gpus] if len(whole) >= req.whole_gpus else []
            if req.cpus > cpu or req.memory_gib > mem or (req.uses_gpu and not gpus):
                continue
            size = req.gpus if req.is_shared else 1.0
            for g in gpus:
                share[g] -= size
            self.free[i][1:] = [cpu - req.cpus, mem - req.memory_gib]
            return TaskPlacement(self.nodes[i].name, tuple(gpus), size if req.uses_gpu else 0.0)
        return None


def gpu_request(rng: random.Random, gpus: float) -> TaskRequest:
    """A task request for ``gpus`` GPUs (a fraction below 1, 0 for CPU-only) with matching CPUs/memory."""
    if gpus == 0:
        return TaskRequest(0, cpus=rng.randint(1, 16), memory_gib=rng.choice([4, 8, 16, 32, 64]))
    if gpus < 1:
        return TaskRequest(gpus, cpus=rng.choice([2, 4]), memory_gib=rng.choice([16, 32]))
    return TaskRequest(gpus, cpus=min(64, gpus * rng.randint(4, 7)), memory_gib=min(448, gpus * rng.choice([32, 48])))


def pending_job(rng: random.Random, job_id: str, project: str, seq: int, submitted: float) -> JobSpec:
    """One pending job: mostly whole GPUs, some fractions, gangs of 2-8 tasks and CPU-only jobs."""
    kind, tasks = rng.random(), 1
    if kind < 0.60:
        gpus = rng.choice([1, 1, 1, 2, 2, 4, 8])
    elif kind < 0.75:
        gpus = rng.choice([0.25, 0.5])
    elif kind < 0.90:
        gpus, tasks = rng.choice([1, 2, 4, 8]), rng.randint(2, 8)
    else:
        gpus = 0
    priority = rng.choices([TRAIN, INTERACTIVE, BUILD, INFERENCE], [70, 15, 8, 7])[0]
    return limited(JobSpec(job_id, project, gpu_request(rng, gpus), priority=priority, tasks=tasks,
                           submitted=submitted, seq=seq), rng)


def with_users(snapshot: Snapshot, users: int, seed: int) -> Snapshot:
    """The snapshot with each job given one of ``users`` users (u0, u1, ...), drawn at random; as it
    is for 0."""
    if not users:
        return snapshot
    pick = random.Random(seed + 5)
    return dataclasses.replace(snapshot, jobs=tuple(dataclasses.replace(job, user=f"u{pick.randrange(users)}")
                                                    for job in snapshot.jobs))


def big_cluster(seed: int, nodes: int, running_tasks: int, pending: int) -> tuple[Snapshot, Policy]:
    """The issue-target workload: the cluster, 100 projects, placed running tasks and a long queue."""
    rng = random.Random(seed)
    specs = make_nodes(nodes)
    policy = make_policy(rng, 10, 10, nodes * 8)
    names = list(policy.projects)
    appetite = [rng.uniform(0.1, 1.0) for _ in names]
    sizes = [(8, 1), (4, 1), (2, 1), (1, 1), (0.5, 1), (1, 2), (2, 2), (1, 4)]
    shapes = rng.choices(sizes, [1.5, 5, 12, 48, 28, 2, 1, 0.5], k=running_tasks)
    shapes.sort(key=lambda s: -s[0] * s[1])  # largest first, so the filler does not fragment them out
    filler, jobs, count = Filler(specs, rng), [], 0
    for seq, (gpus, tasks) in enumerate(shapes):
        if count >= running_tasks:
            break
        req = gpu_request(rng, gpus)
        placements = tuple(filler.place(req) for _ in range(tasks))
        if None in placements:
            continue
        count += tasks
        started = NOW - (rng.uniform(0, 300) if rng.random() < 0.1 else rng.uniform(300, 86400))
        jobs.append(limited(JobSpec(f"r{seq}", rng.choices(names, appetite)[0], req,
                                    priority=rng.choices([TRAIN, INTERACTIVE, BUILD, INFERENCE], [70, 15, 8, 7])[0],
                                    tasks=tasks, submitted=started - rng.uniform(1, 3600), started=started,
                                    placements=placements, seq=seq), rng))
    base = len(shapes)
    for i in range(pending):
        jobs.append(pending_job(rng, f"q{i}", rng.choices(names, appetite)[0], base + i,
                                NOW - 86400 + i * 0.5))
    return Snapshot(specs, tuple(jobs), NOW), policy


def contended_cluster(seed: int, nodes: int) -> tuple[Snapshot, Policy]:
    """Every GPU busy with old preemptible train jobs of 20 'hog' projects; 20 'starved' projects
    (same quota each: capacity/40) have only pending work, so they are below their fair share."""
    rng = random.Random(seed + 1)
    specs = make_nodes(nodes)
    quota = nodes * 8 / 40
    departments, projects = {}, {}
    for d in range(4):
        departments[f"d{d}"] = Department(f"d{d}", quota={POOL: Resources(gpu=quota * 10)})
        for k in range(10):
            name = f"{'hog' if k < 5 else 'starved'}{d}{k}"
            projects[name] = Project(name, quota={POOL: Resources(gpu=quota)}, department=f"d{d}")
    hogs, starved = [p for p in projects if p[0] == "h"], [p for p in projects if p[0] == "s"]
    jobs, seq = [], 0
    for n, spec in enumerate(specs):
        used = 0
        for g in rng.choice([[1] * 8, [2] * 4, [4, 4], [8], [4, 2, 1, 1], [2, 2, 2, 1, 1]]):
            started = NOW - rng.uniform(3600, 86400)
            placement = TaskPlacement(spec.name, tuple(range(used, used + g)), 1.0)
            jobs.append(limited(JobSpec(f"h{seq}", hogs[n % len(hogs)], TaskRequest(g, cpus=4 * g, memory_gib=32 * g),
                                        priority=TRAIN, submitted=started - 60, started=started,
                                        placements=(placement,), seq=seq), rng))
            used, seq = used + g, seq + 1
    for project in starved:
        wanted = 0.0
        while wanted < 1.5 * quota:
            g = rng.choice([1, 1, 2, 4])
            jobs.append(limited(JobSpec(f"w{seq}", project, TaskRequest(g, cpus=4 * g, memory_gib=32 * g),
                                        priority=rng.choice([TRAIN, TRAIN, INTERACTIVE]),
                                        submitted=NOW - 600 + seq * 0.01, seq=seq), rng))
            wanted, seq = wanted + g, seq + 1
    return Snapshot(specs, tuple(jobs), NOW), Policy(departments=departments, projects=projects)


def canonical(value):
    """``value`` as plain tuples with every number a float, for hashing: a field declared ``float`` holds
    what the caller gave in the Python core (``Resources(gpu=8)`` keeps the int 8) but always a float
    in the compiled one (8.0), so the repr of the same decision is spelled two ways."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (tuple, list)):
        return tuple(canonical(item) for item in value)
    if isinstance(value, dict):
        return tuple((canonical(k), canonical(v)) for k, v in value.items())
    names = _FIELDS.get(type(value))
    if names is None:
        if not dataclasses.is_dataclass(value):
            return repr(value)
        names = _FIELDS[type(value)] = tuple(f.name for f in dataclasses.fields(value))
    return (type(value).__name__, *(canonical(getattr(value, name)) for name in names))


_FIELDS: dict[type, tuple[str, ...]] = {}


def _digest(value) -> str:
    return hashlib.sha256(repr(canonical(value)).encode()).hexdigest()


def plan_digest(plan) -> str:
    """A hash of what a plan decides: its binds, its evictions and why each job still waits (numbers
    as floats, so that the Python and the compiled core hash the same decisions alike)."""
    pending = getattr(plan, "pending_reasons", None)
    if pending is None:  # a core that keeps the reasons as data names them so
        pending = plan.pending
    value: tuple = (plan.binds, plan.evictions, sorted(pending.items()))
    reservations = getattr(plan, "reservations", None)
    if reservations:  # planned starts too, where any (none without time limits)
        value += (sorted(reservations.items()),)
    return _digest(value)


def decisions_digest(plan) -> str:
    """A hash of what a plan does, its binds and evictions, without why jobs still wait."""
    return _digest((plan.binds, plan.evictions))


def plans_digest(cycles: list[dict], key: str = "plan") -> str:
    """One hash of the plans (or, with ``key="decisions"``, of their decisions) of several cycles, in order."""
    return hashlib.sha256("".join(c[key] for c in cycles).encode()).hexdigest()[:16]


def hashed(figures: dict, plan) -> None:
    """Add the plan's hashes to one cycle's figures."""
    figures["plan"], figures["decisions"] = plan_digest(plan), decisions_digest(plan)


def hash_totals(out: dict, cycles: list[dict]) -> None:
    """Add one workload's hashes of its cycles' plans and decisions."""
    out["plan_hash"], out["decisions_hash"] = plans_digest(cycles), plans_digest(cycles, "decisions")


# With --turns, the daemon's turn (gpud.core.turns) is given at every step, a call that does nothing.
TURNS: dict = {}


def _no_turn() -> None:
    pass


def timed(snapshot: Snapshot, policy: Policy, pm, profile: cProfile.Profile | None = None):
    """(figures, plan) of one schedule() call after a gc.collect(): wall and CPU seconds, and what
    the plan did (binds, evictions that stop tasks, moves, jobs left pending); profiled when asked."""
    gc.collect()
    if profile is not None:
        profile.enable()  # only around schedule(): snapshot building is not profiled
    cpu, start = time.process_time(), time.perf_counter()
    plan = schedule(snapshot, policy, pm, **TURNS)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    if profile is not None:
        profile.disable()
    return {"seconds": elapsed, "cpu_s": cpu, "binds": len(plan.binds),
            "evictions": sum(1 for e in plan.evictions if not e.moved),
            "moves": sum(1 for e in plan.evictions if e.moved), "pending": len(plan.pending)}, plan


def measure_big(args, pm, prof: dict) -> dict:
    """Workload 1: figures of fresh cycles and of steady cycles under churn."""
    nodes, running, pending = SIZES[args.size]
    t0 = time.perf_counter()
    snapshot, policy = big_cluster(args.seed, nodes, running, pending)
    snapshot = with_users(snapshot, args.users, args.seed)
    policy = dataclasses.replace(with_reservations(policy, args), victim_order=args.victim_order)
    out = {"nodes": nodes, "gpus": nodes * 8, "projects": len(policy.projects), "jobs": len(snapshot.jobs),
           "running_tasks": sum(j.running_tasks for j in snapshot.jobs), "build_s": time.perf_counter() - t0}
    fresh = [timed(snapshot, policy, pm) for _ in range(args.repeat)]
    out["fresh"] = [figures for figures, _ in fresh]
    if args.hash:
        hashed(out["fresh"][-1], fresh[-1][1])
    if prof:
        timed(snapshot, policy, pm, prof["fresh"])
    scheduler = Scheduler(snapshot, policy, pm, **TURNS)
    scheduler.cycle(None, TURNS.get("turn"))
    rng, out["steady"] = random.Random(args.seed + 7), []
    for cycle in range(args.warmup + args.repeat + (1 if prof else 0)):
        profiled = bool(prof) and cycle == args.warmup + args.repeat
        plans: list = []
        figures = timed_warm(scheduler, rng, cycle, args.churn, prof["steady"] if profiled else None, plans,
                             args.users)
        if not profiled:
            out["steady"].append({**figures, "warmup": cycle < args.warmup})
            if args.hash:
                hashed(out["steady"][-1], plans[0])
    if args.hash:
        hash_totals(out, out["fresh"][-1:] + out["steady"])
    return out


def timed_warm(scheduler: Scheduler, rng: random.Random, cycle: int, count: int,
               profile: cProfile.Profile | None = None, plans: list | None = None, users: int = 0) -> dict:
    """Figures of one warm cycle: ``count`` completions and ``count`` submissions handed to the
    running scheduler, then its cycle 10 s later; the time covers both. The plan is added to
    ``plans`` when given; with ``users``, each submission belongs to one of that many users."""
    jobs = scheduler.jobs()
    running = [j.id for j in jobs if j.is_running]
    done = rng.sample(running, min(count, len(running)))
    names = sorted({j.project for j in jobs})
    seq = max(j.seq for j in jobs) + 1
    now = scheduler.state.now + 10.0
    new = [pending_job(rng, f"s{cycle}-{i}", rng.choice(names), seq + i, now - 10 + i * 0.01)
           for i in range(count)]
    if users:
        new = [dataclasses.replace(job, user=f"u{rng.randrange(users)}") for job in new]
    gc.collect()
    if profile is not None:
        profile.enable()
    cpu, start = time.process_time(), time.perf_counter()
    for job_id in done:
        scheduler.finish(job_id)
    for job in new:
        scheduler.submit(job)
    plan = scheduler.cycle(now, TURNS.get("turn"))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    if profile is not None:
        profile.disable()
    if plans is not None:
        plans.append(plan)
    return {"seconds": elapsed, "cpu_s": cpu, "binds": len(plan.binds),
            "evictions": sum(1 for e in plan.evictions if not e.moved),
            "moves": sum(1 for e in plan.evictions if e.moved), "pending": len(plan.pending)}


def measure_contended(args, pm, prof: dict) -> dict:
    """Workload 2: figures of the reclaim cycle, and how far the starved projects got."""
    snapshot, policy = contended_cluster(args.seed, args.contended_nodes or SIZES[args.size][0])
    policy = dataclasses.replace(with_reservations(policy, args), victim_order=args.victim_order)
    out = {"nodes": len(snapshot.nodes), "projects": len(policy.projects), "jobs": len(snapshot.jobs)}
    cycles = [timed(snapshot, policy, pm) for _ in range(args.repeat)]
    plan, out["cycles"] = cycles[-1][1], [figures for figures, _ in cycles]
    if args.hash:
        hashed(out["cycles"][-1], plan)
        hash_totals(out, out["cycles"][-1:])
    if prof:
        timed(snapshot, policy, pm, prof["reclaim"])
    starved = [q for q in plan.queues if q.kind == "project" and q.name.startswith("starved")]
    out["starved_gpus_after"] = sum(q.allocated.gpu for q in starved)
    out["starved_fair_share"] = sum(q.fair_share.gpu for q in starved)
    if min(c["evictions"] for c in out["cycles"]) == 0:
        raise SystemExit("contended cluster: the cycle evicted nothing, yet 20 projects hold 0 GPUs "
                         "against a fair share of capacity/40 each while 20 others hold twice theirs "
                         "with old preemptible jobs: reclaim did not run (see the pending reasons)")
    return out


def with_reservations(policy: Policy, args) -> Policy:
    """The policy with --reservations applied."""
    if args.reservations is None:
        return policy
    if args.reservations == 0:  # off: neither reservations nor estimates
        return dataclasses.replace(policy, reservations=Reservations(jobs=0, estimate_jobs=0))
    return dataclasses.replace(policy, reservations=Reservations(jobs=args.reservations))


def run(args) -> dict:
    """Run the workloads and return the figures (and cProfile stats texts when --profile)."""
    global TIME_LIMITS
    TIME_LIMITS = args.time_limits
    pm = make_plugin_manager()
    out = {"python": sys.version.split()[0], "implementation": platform.python_implementation(),
           "machine": platform.machine(), "cpu_count": os.cpu_count(), "seed": args.seed,
           "repeat": args.repeat, "size": args.size, "users": args.users,  # a hash of the gpud sources measured:
           "gpud_sources": hashlib.sha1(b"".join(  # others edit them while benchmarks run
               p.read_bytes() for p in sorted(pathlib.Path(gpud.__file__).parent.rglob("*.py")))).hexdigest()[:12],
           "load_average": os.getloadavg()[0], "core": "compiled (mypyc)" if COMPILED else "Python"}
    prof = {k: cProfile.Profile() for k in ("fresh", "steady", "reclaim")} if args.profile else {}
    if args.only in (None, "big"):
        out["big"] = measure_big(args, pm, prof)
    if args.only in (None, "contended"):
        out["contended"] = measure_contended(args, pm, prof)
    for name, profile in prof.items():
        if not profile.getstats():
            continue
        if args.profile_dir:
            os.makedirs(args.profile_dir, exist_ok=True)
            profile.dump_stats(os.path.join(args.profile_dir, f"{name}.prof"))
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(25)
        out.setdefault("profiles", {})[name] = text.getvalue()
    return out


def report(out: dict) -> str:
    """The figures as a readable table."""
    median = lambda cycles: statistics.median(c["seconds"] for c in cycles if not c.get("warmup"))  # noqa: E731
    row = "  {:<18}{:>10}{:>9}{:>8}{:>7}{:>7}{:>9}"
    head = row.format("cycle", "wall s", "cpu s", "binds", "evict", "moves", "pending")
    line = lambda tag, c: row.format(tag, f"{c['seconds']:.4f}", f"{c['cpu_s']:.3f}", c["binds"],  # noqa: E731
                                     c["evictions"], c["moves"], c["pending"])
    lines = [f"Python {out['python']} ({out['implementation']}) on {out['machine']}, os.cpu_count()="
             f"{out['cpu_count']}, load average {out['load_average']:.1f}, seed {out['seed']}, repeat "
             f"{out['repeat']}, gpud sources {out['gpud_sources']}, core {out['core']}" + f", size {out['size']}"
             + (f", {out['users']} users per project" if out["users"] else "")]
    summary = [f"\n  {'measure (median)':<36}{'wall s':>10}{'target':>9}{'ratio':>8}"]
    if "big" in out:
        big = out["big"]
        lines += [f"\nBig cluster: {big['nodes']} nodes / {big['gpus']} GPUs, {big['projects']} projects, "
                  f"{big['running_tasks']} running tasks, {big['jobs']} jobs (built in {big['build_s']:.1f} s)", head]
        lines += [line(f"fresh {i + 1}", c) for i, c in enumerate(big["fresh"])]
        lines += [line(f"steady {i + 1}" + (" warmup" if c["warmup"] else ""), c)
                  for i, c in enumerate(big["steady"])]
        for key, label in (("fresh", "(a) big: full cycle, fresh snapshot"),
                           ("steady", "(b) big: steady, 100+100 churn")):
            m = median(big[key])
            summary.append(f"  {label:<36}{m:>10.4f}{TARGETS[key]:>9.3f}{m / TARGETS[key]:>7.1f}x"
                           + ("  OK" if m < TARGETS[key] else "  MISSED"))
    if "contended" in out:
        con = out["contended"]
        lines += [f"\nContended cluster: {con['nodes']} nodes / {con['nodes'] * 8} GPUs all busy, "
                  f"{con['projects']} projects (20 over fair share, 20 below), {con['jobs']} jobs", head]
        lines += [line(f"reclaim {i + 1}", c) for i, c in enumerate(con["cycles"])]
        summary.append(f"  {'contended: reclaim cycle':<36}{median(con['cycles']):>10.4f}{'-':>9}{'':>8}  "
                       f"evictions {con['cycles'][0]['evictions']}; the starved projects hold "
                       f"{con['starved_gpus_after']:g} of their {con['starved_fair_share']:g} GPUs of fair share")
    lines += summary
    hashes = [f"{name} {out[name]['plan_hash']}" for name in ("big", "contended") if "plan_hash" in out.get(name, {})]
    if hashes:
        lines.append("\n  plan hashes (binds, evictions, pending reasons): " + ", ".join(hashes))
        decisions = [f"{name} {out[name]['decisions_hash']}" for name in ("big", "contended")
                     if "decisions_hash" in out.get(name, {})]
        lines.append("  decision hashes (binds, evictions): " + ", ".join(decisions))
    for name, text in out.get("profiles", {}).items():
        lines.append(f"\n=== cProfile, one {name} cycle (schedule() only), by cumulative time ===\n{text}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, run the workloads, print a table or JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed cycles per measure (default 5)")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the workloads (default 1)")
    parser.add_argument("--quick", action="store_true", help="100 nodes, 600 running tasks, 10,000 pending "
                        "(--size quick)")
    parser.add_argument("--size", choices=SIZES, default="big", help="the big workload's size: quick (100 nodes), "
                        "big (1,000 nodes, 100,000 pending; the default) or huge (2,000 nodes, 300,000 pending)")
    parser.add_argument("--users", type=int, default=0, help="users per project, each job one of them at random "
                        "(default 0: every job has the user \"\")")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steady cycles first (default 1)")
    parser.add_argument("--churn", type=int, default=100, help="submissions and completions per steady cycle")
    parser.add_argument("--contended-nodes", type=int, default=0, help="nodes of the contended cluster "
                        "(default: as the big cluster)")
    parser.add_argument("--time-limits", action="store_true", help="give every job a time limit, so "
                        "reservations and backfill are planned")
    parser.add_argument("--reservations", type=int, help="jobs per pool that hold a reservation (0: none)")
    parser.add_argument("--only", choices=("big", "contended"), help="run one workload only")
    parser.add_argument("--profile", action="store_true", help="profile one extra cycle of each kind")
    parser.add_argument("--profile-dir", help="with --profile, also dump <kind>.prof pstats files here")
    parser.add_argument("--hash", action="store_true", help="hash each workload's plans (binds, evictions, "
                        "pending reasons) to compare two versions of the core")
    parser.add_argument("--turns", action="store_true", help="give the core a turn that does nothing at every "
                        "step of its long loops, as a daemon running the cycle in a thread does (the plans "
                        "must hash the same)")
    parser.add_argument("--victim-order", choices=VICTIM_ORDERS, default=LEAST_LOST_WORK,
                        help="the policy's victim_order (default least_lost_work)")
    args = parser.parse_args(argv)
    if args.quick:
        args.size = "quick"
    if args.turns:
        TURNS.update(turn=_no_turn, every=1)
    if args.users < 0:
        parser.error(f"--users must be 0 or more, not {args.users}")
    out = run(args)
    print(json.dumps(out, indent=2) if args.json else report(out))


if __name__ == "__main__":
    main()
