"""bench/preemption_loss.py's breakdown: which jobs it counts as allowed in a victim's place, and its sums.

The breakdown is what says whether the victim order had a choice at all; a job counted as allowed
that the core could not have evicted in the victim's stead (another priority, another project for a
preemption, no room for the job served) would make the order look worse than it is.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_path = Path(__file__).resolve().parents[2] / "bench" / "loss_breakdown.py"
_spec = importlib.util.spec_from_file_location("loss_breakdown", _path)
assert _spec is not None and _spec.loader is not None
breakdown = importlib.util.module_from_spec(_spec)
sys.modules["loss_breakdown"] = breakdown  # dataclasses look their module up by name
_spec.loader.exec_module(breakdown)

Running = breakdown.Running
NOW = 10_000.0


def job(name: str, project: str = "p", priority: int = 25, gpu: int = 0, share: float = 1.0, node: str = "n1",
        started: float = 0.0, lost: float = 100.0, cpus: float = 1.0) -> Running:
    return Running(name, project, priority, priority < 100, started, lost, {node: {gpu: share}}, {node: (cpus, 1.0)})


def free(gpus: int = 2, cpu: float = 4.0, mem: float = 64.0, node: str = "n1", used: dict[int, float] | None = None):
    shares = [1.0] * gpus
    for index, taken in (used or {}).items():
        shares[index] -= taken
    return {node: (shares, cpu, mem)}


def choices(victim: Running, others: list[Running], cause: str = "preempt", task=(1, 1.0, 1.0, 1.0), room=None,
            over: set[str] | None = None, companions: list[Running] | None = None) -> list[str]:
    everyone = [victim, *others]
    room = room if room is not None else free(used={0: 1.0, 1: 1.0})
    evicted = {victim.name} | {c.name for c in companions or []}
    found = breakdown.allowed(victim, cause, "p", task, set(room), everyone, evicted, room, 300.0, NOW,
                              over or set(), companions or [])
    return sorted(r.name for r in found)


def test_a_job_of_the_same_priority_and_project_freeing_a_gpu_is_allowed():
    assert choices(job("v", gpu=0), [job("a", gpu=1)]) == ["a", "v"]


def test_other_priorities_projects_and_young_jobs_are_not():
    others = [job("high", gpu=1, priority=50), job("theirs", gpu=1, project="q"),
              job("young", gpu=1, started=NOW - 10.0)]
    assert choices(job("v", gpu=0), others) == ["v"]


def test_reclaim_takes_only_from_other_projects_over_their_share():
    others = [job("mine", gpu=1), job("over", gpu=1, project="q"), job("within", gpu=1, project="r")]
    assert choices(job("v", gpu=0, project="q"), others, cause="reclaim", over={"q"}) == ["over", "v"]


def test_a_job_too_small_for_the_task_or_short_of_cpus_is_not_allowed():
    small = job("small", gpu=1, share=0.5)  # beside another half: frees no whole GPU for the task
    assert choices(job("v", gpu=0, cpus=2.0), [small], room=free(cpu=0.0, used={0: 1.0, 1: 1.0})) == ["v"]
    few_cpus = job("few", gpu=1, share=0.5, cpus=0.5)  # alone on its GPU, but with half the CPUs the task needs
    room = free(cpu=0.0, used={0: 1.0, 1: 0.5})
    assert choices(job("v", gpu=0, cpus=2.0), [few_cpus], room=room, task=(0, 0.75, 1.0, 1.0)) == ["v"]


def test_the_other_victims_of_the_same_job_count_as_gone():
    """A half and a quarter of GPU 1 went for a task of three quarters: the other quarter, beside the
    half, would have freed as much. Were the half not counted gone, the quarter alone would have made
    no room, and every job freeing as many GPUs would count (the estimate for gangs)."""
    room = free(used={0: 1.0, 1: 1.0})
    half, quarter, other = job("half", gpu=1, share=0.5), job("q1", gpu=1, share=0.25), job("q2", gpu=1, share=0.25)
    task = (0, 0.75, 1.0, 1.0)
    assert choices(quarter, [half, other], room=room, task=task, companions=[half]) == ["q1", "q2"]
    assert choices(quarter, [half, other], room=room, task=task) == ["half", "q1", "q2"]


def test_sums_by_cause_name_every_cause_and_the_choice_made():
    book = breakdown.Breakdown()
    victim, better, worse = job("v", lost=50.0), job("b", lost=10.0, started=5.0), job("w", lost=90.0, started=1.0)
    book.note(NOW, "v", "reclaim", False, 50.0, [victim, better, worse])
    book.note(NOW, "x", "consolidate", False, 7.0, [])
    causes = book.by_cause()
    assert causes["reclaim"] == 50.0 and causes["consolidate"] == 7.0
    assert causes["time_limit"] == 0.0 and causes["node_failure"] == 0.0 and causes["preempt"] == 0.0
    row = book.summary()["reclaim"]
    assert (row["with_choice"], row["lost_with_choice"], row["best_with_choice"], row["worst_with_choice"]) == (
        1, 50.0, 10.0, 90.0)
    assert row["youngest_with_choice"] == 10.0  # b started last
    assert book.summary()["consolidate"]["lost_without_choice"] == 7.0


def test_divergence_finds_the_first_different_eviction():
    first = [(1.0, "a"), (2.0, "b"), (3.0, "c")]
    second = [(1.0, "a"), (2.0, "x"), (3.0, "c")]
    found = breakdown.divergence(first, second)
    assert found["identical_evictions_before_divergence"] == 1
    assert found["diverged_at_s"] == 2.0
    assert found["evictions_in_both"] == 2
    assert breakdown.divergence(first, first)["diverged_at_s"] is None
