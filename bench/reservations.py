"""Reservations and backfill, and start-time estimates, measured by replaying workloads in simulated time.

Three workloads, each replayed with reservations on (the policy default) and off (``jobs = 0``):

(a) alibaba: the shipped Alibaba GPU trace's default pod list (traces/alibaba-gpu-v2023), one task per pod,
    on a cluster of 8-GPU nodes sized so the offered load is about 1.2 times its GPUs. The trace records how
    long pods ran but no limits; each gets one from a model of requested/actual run time built on the real
    logs in (b): with probability 0.1 a job runs to its limit, otherwise run/limit is uniform in [0.05, 1]
    (median about 0.5, HPC2N's is 0.475); the limit is then rounded up to the next of 5, 15, 30 min, 1, 2, 4,
    8, 12, 24, 48 h, as users ask.
(b) ctc, hpc2n: the Parallel Workloads Archive logs in ../shared/traces/pwa (real users' requested times).
    As that README says, one processor is one GPU-equivalent slot: the cluster is MaxProcs slots as 8-GPU
    nodes (CTC 344, HPC2N 240 GPUs); a job of k processors is a gang of ceil(k / 8) tasks of min(k, 8) GPUs.
    Run times are clipped to the requested time (a job that outruns its limit is stopped).
(c) starvation: 8 nodes of 8 GPUs; a stream of 1-GPU jobs (10-60 min, 1 h limits) offering about 1.1 times
    the GPUs, and every 2 h an 8-GPU gang and a 32-GPU gang (4 x 8), 30 min of 1 h limits.

For each it prints utilisation (GPU-seconds run / GPUs x span) and the longest and 95th percentile wait by job
size (1, 2-8, 9-32, over 32 GPUs), jobs still waiting at the end counting their wait so far. For (c), the
bound B is the longest time limit times one plus the most gangs waiting at once: a gang waits at most for
the running jobs' limits and the gangs ahead of it. It also prints the share of the GPUs' time left idle on
nodes that a holding reservation names (drained for a gang: backfill may use that room only with jobs whose
limits end before the reserved start), the utilisation that reservations cost. What any reservation must
cost in (c) is shown by two more replays of it: Slurm-like EASY backfill (one job per pool holds room; Mu'alem
and Feitelson 2001), and perfect knowledge (every job's limit is its run time, so reservations start at the
real ends and a job backfills wherever it really ends in time); and by the least idle that the drains must
leave, from the states the replay reached: at the first cycle a whole-node gang's held nodes drain, the least
GPU time any choice of its nodes leaves idle before it starts by its promised start, knowing every running
job's real end, where no waiting job's limit fits the gaps (``least_drain_idle``). Start estimates are judged as the share of jobs that
waited whose estimate made at submission was within max(10 min, 25 % of the actual wait) of their start:
gpud's estimate (predicted run times as the controller predicts them, gpud.prediction: the mean of the
user's last two jobs of the same shape, capped at the limit; Tsafrir et al. 2007) and Slurm's run-to-limit method (every job runs to its limit), from the
same plan, in the replays with reservations on.

    python bench/reservations.py [--quick] [--json] [--jobs N] [--seed 1]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import pathlib
import random
import sys
import time
from dataclasses import dataclass, field

from gpud.core import Scheduler
from gpud.model import JobSpec, NodeSpec, Snapshot, TaskRequest
from gpud.plugins import make_plugin_manager
from gpud.policy import Department, Policy, Project, Reservations
from gpud.prediction import RuntimePredictor
from gpud.trace.alibaba import read_pods

ROOT = pathlib.Path(__file__).resolve().parent.parent
ALIBABA = ROOT / "traces" / "alibaba-gpu-v2023" / "csv" / "openb_pod_list_default.csv"
# The archive's logs sit beside the repository, in ../shared/traces/pwa; GPUD_PWA names another folder.
PWA = pathlib.Path(os.environ.get("GPUD_PWA") or ROOT.parent / "shared" / "traces" / "pwa")
PWA_LOGS = {"ctc": ("CTC-SP2-1996-3.1-cln.swf.gz", 338), "hpc2n": ("HPC2N-2002-2.2-cln.swf.gz", 240)}
LIMIT_STEPS = (300, 900, 1800, 3600, 7200, 14400, 28800, 43200, 86400, 172800)
SIZES = ((1, "1"), (8, "2-8"), (32, "9-32"), (math.inf, ">32"))
PM = make_plugin_manager()


@dataclass
class TJob:
    """A job of a replay: when it comes, how long it runs, its limit, its shape and its user."""

    id: str
    submitted: float
    runtime: float
    limit: float
    gpus: float
    tasks: int
    user: str

    @property
    def size(self) -> float:
        return self.gpus * self.tasks


@dataclass
class Replay:
    """What a replay did: each job's start, its estimates at submission, and the time span."""

    starts: dict[str, float] = field(default_factory=dict)
    estimates: dict[str, tuple[float, float]] = field(default_factory=dict)  # (gpud, run to limit)
    end: float = 0.0
    cycles: int = 0
    most_gangs_waiting: int = 0
    idle_reserved_gpu_s: float = 0.0  # GPU-seconds left idle on nodes that a holding reservation names
    drain_bound_gpu_s: float = 0.0  # the least of it that knowing every end could leave (``least_drain_idle``)
    drained: set[str] = field(default_factory=set)  # gangs whose nodes began to drain


def nodes_for(gpus: int) -> tuple[NodeSpec, ...]:
    return tuple(NodeSpec(f"n{i}", gpus=8, cpus=256, memory_gib=4096) for i in range(math.ceil(gpus / 8)))


def policy(reservations: bool | Reservations) -> Policy:
    """One project on the default pool, with the policy's default reservations (True), none (False), or those given."""
    settings = reservations if isinstance(reservations, Reservations) else (
        Reservations() if reservations else Reservations(jobs=0))
    return Policy(departments={"default": Department("default", implicit=True)}, projects={"p": Project("p")},
                  min_runtime_s=0.0, reservations=settings)


def replay(nodes: tuple[NodeSpec, ...], jobs: list[TJob], reservations: bool | Reservations,
           gang_size: float = 8.0) -> Replay:
    """Run the jobs through the scheduler, a cycle at every submission and end, until the last submission
    plus the longest limit (jobs still waiting then count their wait so far)."""
    jobs = sorted(jobs, key=lambda j: j.submitted)
    until = jobs[-1].submitted + max(j.limit for j in jobs)
    scheduler = Scheduler(Snapshot(nodes, (), jobs[0].submitted), policy(reservations), PM)
    out = Replay()
    predictor = RuntimePredictor()
    by_id = {job.id: job for job in jobs}
    ends: dict[str, float] = {}
    used: dict[str, float] = {}  # GPUs in use by node
    size = {node.name: float(node.gpus) for node in nodes}
    on: dict[str, list[tuple[str, float]]] = {}  # (node, GPUs) each running job holds
    reserved: set[str] = set()  # the nodes that holding reservations name, as the last cycle planned
    now, at, seq = jobs[0].submitted, 0, 0
    while True:
        fresh = []
        while at < len(jobs) and jobs[at].submitted <= now:
            job = jobs[at]
            predicted = predictor.predict(job.user, job.gpus, job.tasks, job.limit)
            scheduler.submit(JobSpec(job.id, "p", TaskRequest(gpus=job.gpus, cpus=1.0, memory_gib=1.0),
                                     tasks=job.tasks, submitted=job.submitted, seq=seq, user=job.user,
                                     time_limit=job.limit, predicted_runtime=predicted))
            fresh.append(job.id)
            seq += 1
            at += 1
        for job_id in [j for j, end in ends.items() if end <= now]:
            scheduler.finish(job_id)
            done = by_id[job_id]
            predictor.record(done.user, done.gpus, done.tasks, done.runtime)
            del ends[job_id]
            for node, gpus in on.pop(job_id, []):
                used[node] -= gpus
        plan = scheduler.cycle(now)
        out.cycles += 1
        for bind in plan.binds:
            if bind.job not in out.starts:
                out.starts[bind.job] = now
                ends[bind.job] = now + by_id[bind.job].runtime
            gpus = len(bind.placement.gpu_index) * bind.placement.gpu_share
            used[bind.placement.node] = used.get(bind.placement.node, 0.0) + gpus
            on.setdefault(bind.job, []).append((bind.placement.node, gpus))
        reserved = {node for r in plan.reservations.values() if r.holds for node in r.nodes}
        for job_id, r in plan.reservations.items():
            job = by_id[job_id]
            if (r.holds and job_id not in out.drained and job.size >= gang_size and job.gpus == 8
                    and any(used.get(node, 0.0) < size[node] for node in r.nodes)):
                out.drained.add(job_id)
                waiting = min((j.limit for j in jobs[:at] if j.id not in out.starts), default=math.inf)
                ends_by_node: dict[str, list[float]] = {node: [] for node in size}
                for running, held in on.items():
                    for node, gpus in held:
                        ends_by_node[node] += [ends[running]] * int(round(gpus))
                out.drain_bound_gpu_s += least_drain_idle(ends_by_node, job.tasks, now, r.start, waiting)
        for job_id in fresh:
            found = plan.reservations.get(job_id)
            if found is not None:
                out.estimates[job_id] = (found.estimate, found.start)
        waiting_gangs = sum(1 for j in jobs[:at] if j.id not in out.starts and j.size >= gang_size)
        out.most_gangs_waiting = max(out.most_gangs_waiting, waiting_gangs)
        upcoming = [jobs[at].submitted] if at < len(jobs) else []
        upcoming += [end for end in ends.values() if end > now]
        if not upcoming or min(upcoming) > until:
            out.end = now if not upcoming else until
            return out
        step = min(upcoming) - now
        out.idle_reserved_gpu_s += step * sum(size[node] - used.get(node, 0.0) for node in reserved)
        now = min(upcoming)


def least_drain_idle(ends: dict[str, list[float]], nodes: int, now: float, promised: float,
                     shortest_limit: float) -> float:
    """The least GPU time that ``nodes`` whole 8-GPU nodes must sit idle, from now, for a gang to start on them
    all at once by its promised start, knowing when each running job really ends (``ends``: by node, one entry
    per GPU in use): each GPU waits from its job's end (now, if free) to the gang's start, and no waiting job
    fits such a gap by its limit. 0 when one might (a waiting job's limit is shorter than the promise is away)."""
    if promised - now >= shortest_limit:
        return 0.0
    frees = {node: times + [now] * (8 - len(times)) for node, times in ends.items()}
    best = math.inf
    for start in sorted({max(times) for times in frees.values()}):
        if start > promised:
            break
        costs = sorted(sum(start - t for t in times) for times in frees.values() if max(times) <= start)
        if len(costs) >= nodes:
            best = min(best, sum(costs[:nodes]))
    return 0.0 if best == math.inf else best


def figures(jobs: list[TJob], run: Replay, capacity: int) -> dict:
    """Utilisation, and the longest and 95th percentile wait by job size."""
    first = min(j.submitted for j in jobs)
    used = sum(j.size * max(0.0, min(j.runtime, run.end - run.starts[j.id])) for j in jobs if j.id in run.starts)
    out: dict = {"utilization": round(used / (capacity * max(1.0, run.end - first)), 4), "jobs": len(jobs),
                 "never_started": sum(1 for j in jobs if j.id not in run.starts), "cycles": run.cycles}
    low = 0.0
    for high, name in SIZES:
        waits = sorted(run.starts.get(j.id, run.end) - j.submitted for j in jobs if low < j.size <= high)
        low = high
        if waits:
            out[f"wait_{name}"] = {"jobs": len(waits), "max_s": round(waits[-1], 1),
                                   "p95_s": round(waits[min(len(waits) - 1, int(0.95 * len(waits)))], 1)}
    return out


def estimate_hits(jobs: list[TJob], run: Replay) -> dict:
    """Of the jobs that waited and started, the share whose estimate at submission was within
    max(10 min, 25 % of the wait) of the start: gpud's and run-to-limit's (no estimate is a miss)."""
    hits = [0, 0]
    judged = 0
    for job in jobs:
        start = run.starts.get(job.id)
        if start is None or start - job.submitted <= 1e-6:
            continue
        judged += 1
        wait = start - job.submitted
        for k, guess in enumerate(run.estimates.get(job.id, (None, None))):
            if guess is not None and abs(guess - start) <= max(600.0, 0.25 * wait):
                hits[k] += 1
    return {"judged": judged, "gpud": round(hits[0] / judged, 4) if judged else None,
            "run_to_limit": round(hits[1] / judged, 4) if judged else None, "hits": hits}


def modelled_limit(runtime: float, rng: random.Random) -> float:
    """A user's limit for a job that ran ``runtime`` seconds (the model in the module docstring)."""
    ratio = 1.0 if rng.random() < 0.1 else rng.uniform(0.05, 1.0)
    wanted = runtime / ratio
    return next((float(step) for step in LIMIT_STEPS if step >= wanted), float(math.ceil(wanted)))


def alibaba_jobs(count: int, rng: random.Random) -> tuple[list[TJob], int]:
    """The first ``count`` GPU pods that ran, and the GPUs of a cluster they load about 1.2 times."""
    pods = [p for p in read_pods(str(ALIBABA)) if p.duration and p.gpus > 0 and p.gpus >= 1][:count]
    jobs = [TJob(f"a{i}", p.created, max(1.0, p.duration or 1.0), 0.0, p.gpus, 1, f"u{i % 50}")
            for i, p in enumerate(pods)]
    for job in jobs:
        job.limit = modelled_limit(job.runtime, rng)
    span = max(j.submitted for j in jobs) - min(j.submitted for j in jobs)
    load = sum(j.size * j.runtime for j in jobs) / max(span, 1.0)
    return jobs, max(16, int(math.ceil(load / 1.2 / 8)) * 8)


def pwa_jobs(name: str, count: int) -> tuple[list[TJob], int]:
    """The first ``count`` usable jobs of a PWA log, as gangs of 8-GPU tasks, and the cluster's GPUs."""
    filename, procs = PWA_LOGS[name]
    jobs: list[TJob] = []
    with gzip.open(PWA / filename, "rt") as lines:
        for line in lines:
            if line.startswith(";") or not line.strip():
                continue
            f = line.split()
            submit, run, allocated, requested = float(f[1]), float(f[3]), int(f[4]), float(f[8])
            if run <= 0 or allocated <= 0 or requested <= 0:
                continue
            tasks, gpus = (1, allocated) if allocated <= 8 else (math.ceil(allocated / 8), 8)
            jobs.append(TJob(f"{name}{f[0]}", submit, max(1.0, min(run, requested)), requested, float(gpus), tasks,
                             f"u{f[11]}"))
            if len(jobs) >= count:
                break
    return jobs, math.ceil(procs / 8) * 8


def starvation_jobs(hours: float, rng: random.Random) -> tuple[list[TJob], int]:
    """A stream of 1-GPU jobs over ``hours`` with an 8- and a 32-GPU gang every 2 hours (64 GPUs)."""
    jobs: list[TJob] = []
    t, span = 0.0, hours * 3600
    rate = 1.1 * 64 / 2100.0  # jobs per second: 1.1 x 64 GPUs busy with jobs of 35 min on average
    while t < span:
        t += rng.expovariate(rate)
        jobs.append(TJob(f"s{len(jobs)}", t, rng.uniform(600, 3600), 3600.0, 1.0, 1, f"u{len(jobs) % 7}"))
    for k in range(int(hours // 2)):
        jobs.append(TJob(f"g8-{k}", k * 7200.0 + 300, 1800.0, 3600.0, 8.0, 1, "gang"))
        jobs.append(TJob(f"g32-{k}", k * 7200.0 + 600, 1800.0, 3600.0, 8.0, 4, "gang"))
    return jobs, 64


def run(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    count = args.jobs or (300 if args.quick else 3000)
    out: dict = {"quick": args.quick, "jobs_per_trace": count, "traces": {}}
    pooled = {"judged": 0, "hits": [0, 0]}
    workloads = {"alibaba": alibaba_jobs(count, rng)}
    for name in PWA_LOGS:
        workloads[name] = pwa_jobs(name, count)
    for name, (jobs, gpus) in workloads.items():
        nodes = nodes_for(gpus)
        entry: dict = {"gpus": gpus}
        for label, on in (("with_reservations", True), ("without_reservations", False)):
            began = time.process_time()
            result = replay(nodes, jobs, on)
            entry[label] = {**figures(jobs, result, gpus), "cpu_s": round(time.process_time() - began, 1)}
            if on:
                entry["estimates"] = estimate_hits(jobs, result)
                pooled["judged"] += entry["estimates"]["judged"]
                pooled["hits"] = [a + b for a, b in zip(pooled["hits"], entry["estimates"]["hits"])]
        out["traces"][name] = entry
    judged = pooled["judged"]
    out["estimates"] = {"gpud": round(pooled["hits"][0] / judged, 4) if judged else None,
                        "run_to_limit": round(pooled["hits"][1] / judged, 4) if judged else None, "judged": judged}
    jobs, gpus = starvation_jobs(8.0 if args.quick else 24.0, rng)
    starvation: dict = {"gpus": gpus, "jobs": len(jobs)}
    most_waiting = 0
    # Two references for what reservations must cost in this stream: Slurm-like EASY backfill (one job per
    # pool holds room; Mu'alem and Feitelson 2001), and every limit equal to its run time (perfect
    # knowledge: reservations start at the real ends, and a job backfills wherever it really ends in time).
    exact = [TJob(j.id, j.submitted, j.runtime, j.runtime, j.gpus, j.tasks, j.user) for j in jobs]
    for label, on, stream in (("with_reservations", True, jobs), ("without_reservations", False, jobs),
                              ("easy_one_reservation", Reservations(jobs=1), jobs),
                              ("perfect_knowledge", True, exact)):
        result = replay(nodes_for(gpus), stream, on)
        stats = figures(jobs, result, gpus)
        gang_waits = [result.starts.get(j.id, result.end) - j.submitted for j in jobs if j.size >= 8]
        span = max(1.0, result.end - min(j.submitted for j in jobs))
        starvation[label] = {"gang_wait_max_s": round(max(gang_waits), 1), "utilization": stats["utilization"],
                             "idle_on_reserved_nodes": round(result.idle_reserved_gpu_s / (gpus * span), 4),
                             "least_idle_knowing_ends": round(result.drain_bound_gpu_s / (gpus * span), 4),
                             "gangs_never_started": sum(1 for j in jobs if j.size >= 8 and j.id not in result.starts),
                             **{k: v for k, v in stats.items() if k.startswith("wait_")}}
        if label == "with_reservations":
            most_waiting = result.most_gangs_waiting
    starvation["bound_s"] = 3600.0 * (1 + most_waiting)
    out["starvation"] = starvation
    return out


def report(out: dict) -> str:
    lines = []
    for name, entry in out["traces"].items():
        lines.append(f"{name}: {entry['gpus']} GPUs, {entry['with_reservations']['jobs']} jobs")
        for label in ("with_reservations", "without_reservations"):
            e = entry[label]
            waits = ", ".join(f"{k[5:]} GPUs max {v['max_s']:.0f} s p95 {v['p95_s']:.0f} s"
                              for k, v in e.items() if k.startswith("wait_"))
            lines.append(f"  {label:<22} utilisation {e['utilization']:.3f}; {waits}")
        est = entry["estimates"]
        lines.append(f"  estimates within max(10 min, 25 % of wait), of {est['judged']} jobs that waited: "
                     f"gpud {est['gpud']}, run-to-limit {est['run_to_limit']}")
    s = out["starvation"]
    lines.append(f"starvation: {s['gpus']} GPUs, {s['jobs']} jobs, bound {s['bound_s']:.0f} s")
    for label in ("with_reservations", "without_reservations", "easy_one_reservation", "perfect_knowledge"):
        e = s[label]
        lines.append(f"  {label:<22} longest gang wait {e['gang_wait_max_s']:.0f} s, utilisation "
                     f"{e['utilization']:.3f} (idle on nodes held for a reservation {e['idle_on_reserved_nodes']:.3f}, "
                     f"at least {e['least_idle_knowing_ends']:.3f} knowing every end), "
                     f"gangs never started {e['gangs_never_started']}")
    lines.append(f"estimates, all traces: gpud {out['estimates']['gpud']}, run-to-limit "
                 f"{out['estimates']['run_to_limit']} (of {out['estimates']['judged']} jobs that waited)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 jobs per trace and 8 hours of the stream")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--jobs", type=int, help="jobs per trace (default 3000, 300 with --quick)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if not (PWA / PWA_LOGS["ctc"][0]).exists():
        sys.exit(f"the PWA logs are not in {PWA} (set GPUD_PWA to the folder that holds them)")
    out = run(args)
    print(json.dumps(out, indent=1) if args.json else report(out))


if __name__ == "__main__":
    main()
