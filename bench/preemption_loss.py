"""GPU-seconds lost to preemption: checkpoint-aware victims (least_lost_work) against youngest_first.

Replays the Alibaba GPU trace v2023 (default workload) in simulated time through the warm scheduling
core on a seeded share of its nodes (--scale, 1% by default: contended), with the Helios (Venus) VC
quotas as projects, as bench/trace.py's replay does; reclaim and preemption evict as the policy
says. The same replay runs twice, once per victim order; nothing else differs.

Checkpoint model (documented, seeded per job from a hash of --seed and the pod's name):
- a share of jobs never checkpoints (--never, 25% by default): an eviction loses all they did in
  that run;
- the others checkpoint every I seconds of running, I log-uniform between --min-interval and
  --max-interval (5 and 60 minutes by default), the first I after each start. An evicted job loses
  the work since its last checkpoint in that run and restarts from it: it then needs only the rest.
  The range is the frequent end of practice: frameworks traditionally checkpoint at epoch boundaries,
  "for modern deep networks, an epoch runs for several hours" (Mohan et al., CheckFreq: Frequent,
  Fine-Grained DNN Checkpointing, FAST '21), and CheckFreq's point is to bring it down to minutes;
  a 5-60 minute interval favours the checkpoint-aware order, never the other.
- The trace's preemptible pods (QoS BE, priority 25, 42% of the pods) are short: half run under 5
  minutes, three in four under 21 (pod deletion minus scheduling). A victim has run at least the
  policy's min_runtime (5 minutes), so most victims have not reached their first checkpoint yet:
  for them, work lost is GPUs x time since start under both orders, and only the GPUs held tell
  the orders apart.
- a job's work lost at an eviction, in GPU-seconds, is its GPUs times the time it ran since that
  checkpoint (since its start when it has none); a job moved by consolidation restarts too and
  counts alike. The checkpoint times travel to the core in the snapshot (JobSpec.checkpointed).

Prints both totals side by side (and each order's evictions, and the work lost by the rule that
evicted: reclaim, preempt, or "moved" by consolidation; by the victim's priority; by victims that
were the only job of their project and priority old enough to be one, where the order had no choice
inside the project; and by victims that never checkpoint); --json prints
{"lost_gpu_seconds": {"least_lost_work": A, "youngest_first": Y}, "ratio": A / Y, "lost_by_rule": ...,
"lost_by_priority": ..., "lost_without_choice": ..., "lost_never_checkpointed": ..., "lost_by_cause": ..., "choices": ...,
"repeats": ..., "divergence": ...}.
It then breaks the work lost down (bench/loss_breakdown.py): by cause (reclaim, preemption,
consolidation move, time limit, node failure); per eviction, how many jobs of the victim's priority
the rule allowed in its place and what the chosen, the best, the worst and the youngest of them
would have lost; how often the same jobs are evicted again; and where the two orders' evictions
first differ, after which they replay different futures.
Both orders replay the very same jobs, nodes, projects and checkpoint intervals (one --seed).
Arrivals come --compress times faster than in the trace (20 by default; run times are the trace's),
so that the GPUs are contended and reclaim and preemption have work to do. --quick replays the
trace's first --quick-jobs jobs (1,000) only.
    python bench/preemption_loss.py [--scale 0.01] [--seed 0] [--never 0.25] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import heapq
import json
import math
import os
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpud.core import Scheduler  # noqa: E402
from gpud.model import JobSpec, Snapshot, TaskPlacement  # noqa: E402
from gpud.policy import LEAST_LOST_WORK, YOUNGEST_FIRST  # noqa: E402
from gpud.trace.alibaba import TracePod, pod_job, read_nodes, read_pods  # noqa: E402
from gpud.trace.projects import project_of, read_helios_quotas, trace_policy  # noqa: E402
from gpud.trace.run import plugin_manager  # noqa: E402
from gpud.trace.scale import scale_nodes  # noqa: E402

from loss_breakdown import Breakdown, Running, allowed, divergence  # noqa: E402

TRACES = os.environ.get("GPUD_TRACES", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "traces"))
ALIBABA = os.path.join(TRACES, "alibaba-gpu-v2023")
NODES = os.path.join(ALIBABA, "csv", "openb_node_list_gpu_node.csv")
PODS = os.path.join(ALIBABA, "csv", "openb_pod_list_default.csv")
QUOTAS = os.path.join(TRACES, "helios-vc-quotas", "venus_cluster_gpu_number.csv")
FINISH, ARRIVE = 0, 1


@dataclass
class Model:
    """The checkpoint model: the share of jobs that never checkpoint, and the range of intervals."""

    never: float
    min_interval_s: float
    max_interval_s: float
    seed: int

    def interval(self, name: str) -> float | None:
        """The job's checkpoint interval in seconds, or None for a job that never checkpoints."""
        digest = hashlib.sha256(f"{self.seed}:ckpt:{name}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2.0 ** 64
        if u < self.never:
            return None
        v = int.from_bytes(digest[8:16], "big") / 2.0 ** 64
        return math.exp(math.log(self.min_interval_s) + v * (math.log(self.max_interval_s)
                                                               - math.log(self.min_interval_s)))


@dataclass
class _Job:
    spec: JobSpec
    interval: float | None
    remaining: float            # seconds of work left (from its last checkpoint)
    started: float | None = None  # when its current run began
    placements: tuple[TaskPlacement | None, ...] = ()
    epoch: int = 0
    told: int = 0               # checkpoints of this run the core knows of
    last_checkpoint: float | None = None

    def checkpoints(self, now: float) -> int:
        """Checkpoints of the current run completed by ``now``."""
        if self.interval is None or self.started is None:
            return 0
        return int((now - self.started) // self.interval)

    def gpus(self) -> float:
        return sum(p.gpu_share * len(p.gpu_index) for p in self.placements if p is not None)


def replay(pods: list[TracePod], nodes, policy, pm, model: Model, seed: int, table) -> dict:
    """One replay; the work lost by evictions, in GPU-seconds, and how many evictions there were."""
    runnable = sorted((p for p in pods if p.duration is not None), key=lambda p: (p.created, p.name))
    jobs: dict[str, _Job] = {}
    events: list[tuple[float, int, int, str, int]] = []
    for seq, pod in enumerate(runnable):
        assert pod.duration is not None
        spec = pod_job(pod, pod.name, project_of(pod.name, table, seed), pod.created, seq)
        jobs[pod.name] = _Job(spec, model.interval(pod.name), float(pod.duration))
        heapq.heappush(events, (pod.created, ARRIVE, seq, pod.name, 0))
    scheduler = Scheduler(Snapshot(tuple(nodes), (), events[0][0] if events else 0.0), policy, pm)
    running: set[str] = set()
    lost = 0.0
    by_rule: dict[str, float] = {}  # the work lost, by the rule that evicted (a move counts as "moved")
    by_priority: dict[str, float] = {}  # the work lost, by the victim's priority
    no_choice = never = 0.0  # lost by victims that were the only ones of their project and priority; that never checkpoint
    evictions = moves = 0
    breakdown = Breakdown()
    sequence: list[tuple[float, str]] = []  # every eviction, (time, job), in order
    gpus_of = {node.name: ([0.0 if i in node.out_of_service else 1.0 for i in range(node.gpus)], node.cpus,
                           node.memory_gib) for node in nodes}
    memory_of = {node.name: node.gpu_memory_gib for node in nodes}
    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, kind, _, name, epoch = heapq.heappop(events)
            job = jobs[name]
            if kind == ARRIVE:
                scheduler.submit(job.spec)
            elif epoch == job.epoch and name in running:
                scheduler.finish(name)
                running.discard(name)
        for name in running:  # the checkpoints made since the last cycle, as the controller would report them
            job = jobs[name]
            done = job.checkpoints(now)
            if done != job.told:
                assert job.started is not None and job.interval is not None
                job.told = done
                job.last_checkpoint = job.started + done * job.interval
                scheduler.finish(name)
                scheduler.submit(dataclasses.replace(job.spec, placements=job.placements, started=job.started,
                                                     checkpointed=job.last_checkpoint))
        plan = scheduler.cycle(now)
        peers = _peers(jobs, running, {e.job for e in plan.evictions}, now, policy.min_runtime_s) if plan.evictions else {}
        before = _before(jobs, running, now, gpus_of, scheduler) if plan.evictions else None
        evicted = {e.job for e in plan.evictions}
        for eviction in plan.evictions:
            job = jobs[eviction.job]
            assert job.started is not None
            saved = job.checkpoints(now) * job.interval if job.interval is not None else 0.0
            this = job.gpus() * (now - job.started - saved)
            if before is not None:
                seen, free, over = before
                free = _less_new_starts(free, plan.binds, running, eviction.for_job, jobs)
                cause = "consolidate" if eviction.rule == "consolidate" else eviction.rule
                preemptor = jobs[eviction.for_job].spec if eviction.for_job in jobs else job.spec
                request = preemptor.request
                victim_node = next(iter(seen[eviction.job].held), "")
                task = (request.whole_gpus, request.gpu_share_on(memory_of.get(victim_node, 80.0)), request.cpus,
                        request.memory_gib)
                usable = {node.name for node in nodes
                          if all(node.labels.get(k) == v for k, v in preemptor.node_selector.items())}
                breakdown.note(now, eviction.job, cause, eviction.moved and cause != "consolidate", this,
                               allowed(seen[eviction.job], cause, preemptor.project, task, usable,
                                       seen.values(), evicted, free, policy.min_runtime_s, now, over,
                                       [seen[e.job] for e in plan.evictions
                                        if e.for_job == eviction.for_job and e.job != eviction.job]))
                sequence.append((now, eviction.job))
            lost += this
            rule = "moved" if eviction.moved else eviction.rule
            by_rule[rule] = by_rule.get(rule, 0.0) + this
            priority = str(job.spec.priority)
            by_priority[priority] = by_priority.get(priority, 0.0) + this
            if not peers.get((job.spec.project, job.spec.priority)):
                no_choice += this
            if job.interval is None:
                never += this
            job.remaining -= saved
            job.epoch += 1
            job.started, job.told, job.placements = None, 0, ()
            running.discard(eviction.job)
            moves += eviction.moved
            evictions += not eviction.moved
        binds: dict[str, list] = {}
        for bind in plan.binds:
            binds.setdefault(bind.job, []).append(bind)
        for name, placed in binds.items():
            job = jobs[name]
            slots: list[TaskPlacement | None] = [None] * job.spec.tasks
            for bind in placed:
                slots[bind.task] = bind.placement
            job.placements = tuple(slots)
            if name not in running:
                job.epoch += 1
                job.started, job.told = now, 0
                running.add(name)
                heapq.heappush(events, (now + job.remaining, FINISH, 0, name, job.epoch))
    return {"lost_gpu_seconds": lost, "evictions": evictions, "moves": moves, "jobs": len(jobs),
            "by_rule": {rule: round(amount, 1) for rule, amount in sorted(by_rule.items())},
            "by_priority": {p: round(amount, 1) for p, amount in sorted(by_priority.items())},
            "no_choice": round(no_choice, 1), "never_checkpointed": round(never, 1),
            "by_cause": breakdown.by_cause(), "choices": breakdown.summary(), "repeats": breakdown.repeats(),
            "sequence": sequence}


def _before(jobs: dict[str, _Job], running: set[str], now: float,
            gpus_of: dict[str, tuple[list[float], float, float]],
            scheduler: Scheduler) -> tuple[dict[str, Running], dict[str, tuple[list[float], float, float]], set[str]]:
    """The running jobs as they stood before this cycle's evictions, each node's free GPUs, and the
    projects holding more GPUs than their fair share (the cycle's fair shares)."""
    seen: dict[str, Running] = {}
    shares_of = {node: list(shares) for node, (shares, _, _) in gpus_of.items()}
    cpu_of = {node: cpu for node, (_, cpu, _) in gpus_of.items()}
    mem_of = {node: mem for node, (_, _, mem) in gpus_of.items()}
    held_by: dict[str, float] = {}
    shares: dict[str, float] = {}
    for name in running:
        job = jobs[name]
        assert job.started is not None
        held: dict[str, dict[int, float]] = {}
        host: dict[str, tuple[float, float]] = {}
        request = job.spec.request
        for placement in job.placements:
            if placement is not None:
                on_node = held.setdefault(placement.node, {})
                for index in placement.gpu_index:
                    on_node[index] = on_node.get(index, 0.0) + placement.gpu_share
                    shares_of[placement.node][index] -= placement.gpu_share
                cpu, mem = host.get(placement.node, (0.0, 0.0))
                host[placement.node] = (cpu + request.cpus, mem + request.memory_gib)
                cpu_of[placement.node] -= request.cpus
                mem_of[placement.node] -= request.memory_gib
        since = job.last_checkpoint if job.told and job.last_checkpoint is not None else job.started
        project = job.spec.project
        seen[name] = Running(name, project, job.spec.priority, job.spec.preemptible, job.started,
                             job.gpus() * (now - since), held, host)
        held_by[project] = held_by.get(project, 0.0) + job.gpus()
        if project not in shares:
            shares[project] = scheduler.state.project_queue(job.spec).fair_share.gpu
    free = {node: (shares_of[node], cpu_of[node], mem_of[node]) for node in shares_of}
    return seen, free, {p for p, gpus in held_by.items() if gpus > shares[p] + 1e-9}


def _less_new_starts(free: dict[str, tuple[list[float], float, float]], binds, running: set[str],
                     served: str | None, jobs: dict[str, _Job]) -> dict[str, tuple[list[float], float, float]]:
    """The free room of ``free`` less what the cycle's other new starts took (the job served left out):
    those placed by allocation before eviction made room took it first."""
    left = {node: (list(shares), cpu, mem) for node, (shares, cpu, mem) in free.items()}
    for bind in binds:
        if bind.job == served or bind.job in running:
            continue
        placement = bind.placement
        shares, cpu, mem = left[placement.node]
        for index in placement.gpu_index:
            shares[index] -= placement.gpu_share
        request = jobs[bind.job].spec.request
        left[placement.node] = (shares, cpu - request.cpus, mem - request.memory_gib)
    return left


def _peers(jobs: dict[str, _Job], running: set[str], evicted: set[str], now: float,
           min_runtime: float) -> dict[tuple[str, int], int]:
    """How many running jobs old enough to be victims each (project, priority) keeps through this cycle's
    evictions: an evicted job none of whose project and priority is left was the only choice the victim
    order had there (reclaim may still choose between projects)."""
    found: dict[tuple[str, int], int] = {}
    for name in running:
        job = jobs[name]
        if name not in evicted and job.started is not None and now - job.started >= min_runtime:
            key = (job.spec.project, job.spec.priority)
            found[key] = found.get(key, 0) + 1
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=0.01, help="share of the trace's nodes (default 0.01)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--never", type=float, default=0.25, help="share of jobs that never checkpoint")
    parser.add_argument("--min-interval", type=float, default=300.0, help="shortest checkpoint interval, s")
    parser.add_argument("--max-interval", type=float, default=3600.0, help="longest checkpoint interval, s")
    parser.add_argument("--compress", type=float, default=20.0,
                        help="arrivals come this many times faster than in the trace (run times unchanged), "
                             "so the replay is contended (default 20)")
    parser.add_argument("--quick", action="store_true", help="the trace's first --quick-jobs jobs only")
    parser.add_argument("--quick-jobs", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    pods = read_pods(PODS)
    if args.quick:
        pods = sorted((p for p in pods if p.duration is not None), key=lambda p: (p.created, p.name))[:args.quick_jobs]
    pods = [dataclasses.replace(p, created=p.created / args.compress) for p in pods]
    nodes = scale_nodes(read_nodes(NODES), args.scale, args.seed)
    table = read_helios_quotas(QUOTAS)
    capacity = float(sum(n.usable_gpus for n in nodes))
    model = Model(args.never, args.min_interval, args.max_interval, args.seed)
    results, walls = {}, {}
    for order in (LEAST_LOST_WORK, YOUNGEST_FIRST):
        began = time.perf_counter()
        policy = dataclasses.replace(trace_policy(table, capacity, "binpack"), victim_order=order)
        results[order] = replay(pods, nodes, policy, plugin_manager(pods), model, args.seed, table)
        walls[order] = round(time.perf_counter() - began, 2)
    a, y = results[LEAST_LOST_WORK]["lost_gpu_seconds"], results[YOUNGEST_FIRST]["lost_gpu_seconds"]
    doc = {"lost_gpu_seconds": {LEAST_LOST_WORK: round(a, 1), YOUNGEST_FIRST: round(y, 1)},
           "ratio": round(a / y, 4) if y else None,
           "evictions": {o: r["evictions"] for o, r in results.items()},
           "moves": {o: r["moves"] for o, r in results.items()},
           "lost_by_rule": {o: r["by_rule"] for o, r in results.items()},
           "lost_by_priority": {o: r["by_priority"] for o, r in results.items()},
           "lost_without_choice": {o: r["no_choice"] for o, r in results.items()},
           "lost_never_checkpointed": {o: r["never_checkpointed"] for o, r in results.items()},
           "lost_by_cause": {o: r["by_cause"] for o, r in results.items()},
           "choices": {o: r["choices"] for o, r in results.items()},
           "repeats": {o: r["repeats"] for o, r in results.items()},
           "divergence": divergence(results[LEAST_LOST_WORK]["sequence"], results[YOUNGEST_FIRST]["sequence"]),
           "jobs": results[LEAST_LOST_WORK]["jobs"], "nodes": len(nodes), "gpus": capacity,
           "model": {"never": args.never, "min_interval_s": args.min_interval, "max_interval_s": args.max_interval,
                     "seed": args.seed},
           "scale": args.scale, "compress": args.compress, "quick": args.quick, "wall_s": walls}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{doc['jobs']} jobs of the Alibaba trace on {len(nodes)} nodes ({capacity:g} GPUs), Helios VC quotas; "
          f"{args.never:.0%} never checkpoint, the rest every {args.min_interval / 60:g}-{args.max_interval / 60:g} min")
    print(f"{'victim order':<18}{'lost GPU-hours':>16}{'evictions':>11}{'moves':>7}{'wall s':>8}")
    for order, result in results.items():
        print(f"{order:<18}{result['lost_gpu_seconds'] / 3600:>16.1f}{result['evictions']:>11}"
              f"{result['moves']:>7}{walls[order]:>8.1f}")
    for order, result in results.items():
        print(f"{order}: lost GPU-hours by rule: "
              + ", ".join(f"{rule} {amount / 3600:.1f}" for rule, amount in result["by_rule"].items()))
    for order, result in results.items():
        print(f"{order}: lost GPU-hours by victim priority: "
              + ", ".join(f"{p} {amount / 3600:.1f}" for p, amount in result["by_priority"].items())
              + f"; by victims that were their project's only one of their priority {result['no_choice'] / 3600:.1f}"
              + f"; by victims that never checkpoint {result['never_checkpointed'] / 3600:.1f}")
    for order in results:
        print(f"{order}: lost GPU-hours by cause: "
              + ", ".join(f"{cause} {amount / 3600:.1f}" for cause, amount in doc["lost_by_cause"][order].items()))
    print("per eviction, the allowed choices of the victim's priority; GPU-hours lost by the evictions that had none,"
          " and by those that had one: the chosen, the best, the worst and the youngest allowed:")
    print(f"{'victim order':<18}{'cause':<13}{'evictions':>10}{'w/ choice':>10}{'mean n':>8}{'no choice':>10}"
          f"{'chosen':>8}{'best':>8}{'worst':>8}{'youngest':>9}")
    for order in results:
        for cause, row in doc["choices"][order].items():
            print(f"{order:<18}{cause:<13}{row['evictions']:>10}{row['with_choice']:>10}{row['mean_allowed']:>8.2f}"
                  f"{row['lost_without_choice'] / 3600:>10.1f}"
                  f"{row['lost_with_choice'] / 3600:>8.1f}{row['best_with_choice'] / 3600:>8.1f}"
                  f"{row['worst_with_choice'] / 3600:>8.1f}{row['youngest_with_choice'] / 3600:>9.1f}")
    for order in results:
        print(f"{order}: repeats: " + ", ".join(f"{k} {v}" for k, v in doc["repeats"][order].items()))
    split = doc["divergence"]
    print(f"the two orders evict alike for {split['identical_evictions_before_divergence']} evictions, then diverge"
          f" at t={split['diverged_at_s']} s; {split['evictions_in_both']} evictions (same job, same time) are in both")
    if y:
        print(f"least_lost_work loses {a / y:.2f} x what youngest_first loses (goal: at most 0.70)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
