"""Where bench/preemption_loss.py's lost work comes from: by cause, and how much choice each eviction had.

Causes: reclaim, in-project preemption ("preempt"), consolidation move ("consolidate"); a victim that
reclaim or preemption placed elsewhere in the same cycle ("moved") counts under its rule and is also
counted apart. The replay has no time limits (the trace's pods run their recorded durations) and no
node failures: those causes are printed, always 0, so that the table says so rather than leave it out.

Choice of one eviction: the running jobs of the victim's priority that the rule would have let go
in its place, as the bench sees the cluster before the cycle, less the room the cycle's other new
starts took (allocation places jobs before eviction makes room): preemptible, past the policy's
min_runtime, not evicted in the same cycle, eligible by the rule (preempt: the preemptor's project;
reclaim: another project holding more GPUs than its fair share; consolidate: any project), and
making room for one task of the job served in the victim's stead, beside the other victims evicted
for that job (on a node it may use, its node selector; GPUs by index: whole GPUs free, or a share of
one GPU; CPUs and memory); where the victim so did not (a gang), freeing as many GPUs on one node as
it did. The finer rules (quotas,
departments, the resource a queue is over in, a preemption's fair-share limit, filter plugins) are
left out, so "allowed" is an estimate that may count a job the core could not have chosen; the
victim itself is always among them. For each eviction,
the work lost by the victim, the least and the most any allowed job would have lost, and what the
youngest allowed job would have lost (youngest_first's pick in that very state).

Divergence: the two replays are the same until their first different eviction; from then on they
are different futures (other jobs run, other queues are over their share), and their evictions are
compared only as sets of (time, job).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

CAUSES = ("reclaim", "preempt", "consolidate", "time_limit", "node_failure")


@dataclass(frozen=True)
class Running:
    """A running job as the bench sees it before a cycle."""

    name: str
    project: str
    priority: int
    preemptible: bool
    started: float
    lost: float                      # GPU-seconds it would lose if stopped now
    held: dict[str, dict[int, float]]  # the share of each GPU it holds, by node and GPU index
    host: dict[str, tuple[float, float]]  # the CPUs and memory it holds, by node


@dataclass
class Choice:
    """One eviction and the allowed choices of its priority."""

    time: float
    job: str
    cause: str
    moved: bool
    lost: float
    allowed: int
    best: float
    worst: float
    youngest: float


@dataclass
class Breakdown:
    """The evictions of one replay, with their causes and choices."""

    choices: list[Choice] = field(default_factory=list)

    def by_cause(self) -> dict[str, float]:
        """GPU-seconds lost by cause (every cause of ``CAUSES``, 0 where none), and "moved" apart."""
        found = {cause: 0.0 for cause in CAUSES}
        moved = 0.0
        for c in self.choices:
            found[c.cause] = found.get(c.cause, 0.0) + c.lost
            moved += c.lost if c.moved else 0.0
        found["moved_by_reclaim_or_preempt"] = moved
        return {k: round(v, 1) for k, v in found.items()}

    def summary(self) -> dict[str, dict]:
        """By cause: evictions, those with more than one allowed choice, and the GPU-seconds lost by the
        chosen victims against the best, the worst and the youngest allowed choices, over those with a choice."""
        out: dict[str, dict] = {}
        for cause in ("reclaim", "preempt", "consolidate"):
            mine = [c for c in self.choices if c.cause == cause]
            chose = [c for c in mine if c.allowed > 1]
            out[cause] = {
                "evictions": len(mine), "with_choice": len(chose),
                "mean_allowed": round(sum(c.allowed for c in mine) / len(mine), 2) if mine else 0.0,
                "lost": round(sum(c.lost for c in mine), 1),
                "lost_without_choice": round(sum(c.lost for c in mine if c.allowed <= 1), 1),
                "lost_with_choice": round(sum(c.lost for c in chose), 1),
                "best_with_choice": round(sum(c.best for c in chose), 1),
                "worst_with_choice": round(sum(c.worst for c in chose), 1),
                "youngest_with_choice": round(sum(c.youngest for c in chose), 1),
            }
        return out

    def repeats(self) -> dict[str, float]:
        """How concentrated the loss is: jobs evicted, evicted more than once, the share of the work lost
        by the jobs evicted three times or more, and the share lost by the one costliest eviction."""
        count: dict[str, int] = {}
        lost: dict[str, float] = {}
        for c in self.choices:
            count[c.job] = count.get(c.job, 0) + 1
            lost[c.job] = lost.get(c.job, 0.0) + c.lost
        total = sum(lost.values())
        often = sum(v for k, v in lost.items() if count[k] >= 3)
        return {"jobs_evicted": len(count), "evicted_twice_or_more": sum(1 for n in count.values() if n >= 2),
                "most_evictions_of_one_job": max(count.values(), default=0),
                "share_lost_by_jobs_evicted_3_or_more": round(often / total, 3) if total else 0.0,
                "share_lost_by_the_costliest_eviction": round(max((c.lost for c in self.choices), default=0.0) / total, 3)
                if total else 0.0}

    def note(self, now: float, job: str, cause: str, moved: bool, lost: float, peers: list[Running]) -> None:
        """Record one eviction; ``peers`` are the allowed choices of its priority, the victim among them."""
        lost_of = [p.lost for p in peers] or [lost]
        youngest = max(peers, key=lambda p: (p.started, p.name)).lost if peers else lost
        self.choices.append(Choice(now, job, cause, moved, lost, max(len(peers), 1), min(lost_of),
                                   max(lost_of), youngest))


def allowed(victim: Running, cause: str, preemptor_project: str | None, task: tuple[int, float, float, float],
            usable: set[str], running: Iterable[Running], evicted: set[str],
            free: dict[str, tuple[list[float], float, float]], min_runtime: float, now: float,
            over_share: set[str], companions: list[Running]) -> list[Running]:
    """The running jobs of ``victim``'s priority the rule would have let go in its place (see the module);
    ``task`` is one task of the job served (whole GPUs, or 0 and the share of one GPU; CPUs; memory),
    ``usable`` the nodes it may use, ``free`` each node's free share of each GPU, CPUs and memory,
    ``companions`` the other victims evicted for the same job."""
    whole, share, cpus, memory = task

    def fits(job: Running) -> bool:
        for node, gpus in job.held.items():
            if node not in usable:
                continue
            shares, cpu, mem = free[node]
            after = list(shares)
            for other in [job] + [c for c in companions if c.name != job.name]:
                for index, taken in other.held.get(node, {}).items():
                    after[index] += taken
                held_cpu, held_mem = other.host.get(node, (0.0, 0.0))
                cpu, mem = cpu + held_cpu, mem + held_mem
            if cpus > cpu + 1e-6 or memory > mem + 1e-6:
                continue
            if (whole and sum(1 for f in after if f >= 1.0 - 1e-6) >= whole) or (
                    not whole and max(after, default=0.0) >= share - 1e-6):
                return True
        return False

    def freed(job: Running) -> float:
        return max((sum(gpus.values()) for gpus in job.held.values()), default=0.0)

    alone = fits(victim)
    wanted = freed(victim)
    found = [victim]
    for job in running:
        if job.name == victim.name or job.name in evicted or job.priority != victim.priority:
            continue
        if not job.preemptible or now - job.started < min_runtime:
            continue
        if cause == "preempt" and job.project != preemptor_project:
            continue
        if cause == "reclaim" and (job.project == preemptor_project or job.project not in over_share):
            continue
        if fits(job) if alone else freed(job) + 1e-9 >= wanted:
            found.append(job)
    return found


def divergence(first: list[tuple[float, str]], second: list[tuple[float, str]]) -> dict[str, float | int | None]:
    """Where two replays' evictions, each a list of (time, job) in order, first differ, and how many of
    each are found in the other."""
    same = 0
    for a, b in zip(first, second):
        if a != b:
            break
        same += 1
    at = None
    if same < max(len(first), len(second)):
        at = first[same][0] if same < len(first) else second[same][0]
    shared = len(set(first) & set(second))
    return {"identical_evictions_before_divergence": same, "diverged_at_s": at,
            "evictions_in_both": shared, "evictions": len(first), "evictions_other": len(second)}
