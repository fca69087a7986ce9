"""Trace experiment results as tables for people and as JSON documents."""

from __future__ import annotations

from typing import Sequence

from gpud.cli.render import table
from gpud.trace.fill import LEVELS
from gpud.trace.published import PublishedRow
from gpud.trace.replay import ReplayResult
from gpud.trace.run import FillSummary


def fill_json(workload: str, capacity: int, ratio: float, summaries: Sequence[FillSummary],
              published: Sequence[PublishedRow]) -> dict:
    """Fill results (per placement, averaged over seeds) and the published rows, as one document."""
    return {
        "mode": "fill", "workload": workload, "gpus": capacity, "ratio": ratio,
        "levels": list(LEVELS),
        "placements": [{"placement": s.strategy, "seeds": s.seeds, "wall_s": round(s.wall_s, 2),
                        "alloc_pct": {str(k): round(v, 3) for k, v in s.alloc_pct.items()},
                        "unallocated_gpus": {str(k): round(v, 2) for k, v in s.unallocated_gpus.items()},
                        "per_seed_alloc_pct_130": [round(r.alloc_pct[max(LEVELS)], 3) for r in s.runs],
                        "curve_first_seed": s.runs[0].curve if s.runs else []}
                       for s in summaries],
        "published": [{"policy": p.policy, "alloc_pct": {str(k): v for k, v in sorted(p.alloc_pct.items())}}
                      for p in published],
    }


def fill_text(workload: str, capacity: int, ratio: float, summaries: Sequence[FillSummary],
              published: Sequence[PublishedRow]) -> str:
    """Fill results beside the published ones: allocation ratio at each arrived-load level."""
    seeds = summaries[0].seeds if summaries else []
    top = max(LEVELS)
    header = ["POLICY", "SOURCE", *[f"{lv}%" for lv in LEVELS], f"UNALLOC@{top}"]
    rows = [[s.strategy, "gpud", *[f"{s.alloc_pct[lv]:.2f}" for lv in LEVELS],
             f"{s.unallocated_gpus[top]:.1f}"] for s in summaries]
    rows += [[p.policy, "FGD paper", *[f"{p.alloc_pct[lv]:.2f}" if lv in p.alloc_pct else "-" for lv in LEVELS],
              f"{capacity * (1 - p.alloc_pct[top] / 100):.1f}" if top in p.alloc_pct else "-"] for p in published]
    lines = [f"Fill: workload {workload}, {capacity} GPUs, pods in random order until requests reach "
             f"{ratio:.0%} of capacity, mean of {len(seeds)} seed(s) "
             f"{_seed_text(seeds)}",
             "GPU allocation ratio (%) when the arrived requests reach each share of capacity:", "",
             table(header, rows)]
    walls = ", ".join(f"{s.strategy} {s.wall_s:.1f}s" for s in summaries)
    lines += ["", f"Wall time: {walls}"]
    return "\n".join(lines)


def _seed_text(seeds: Sequence[int]) -> str:
    if seeds and list(seeds) == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 1:
        return f"({seeds[0]}-{seeds[-1]})"
    return "(" + ", ".join(map(str, seeds)) + ")"


def replay_json(result: ReplayResult, placement: str, nodes: int, meta: dict) -> dict:
    """A replay's figures as one document (series sampled hourly in trace time)."""
    return {
        "mode": "replay", "placement": placement, "nodes": nodes, "gpus": result.capacity_gpus, **meta,
        "jobs": result.jobs, "cycles": result.cycles, "started": result.started,
        "finished": result.finished, "never_started": result.never_started,
        "evictions": result.evictions, "moves": result.moves,
        "utilisation_pct": round(result.utilisation_pct, 3),
        "utilisation_last_30_days_pct": round(result.utilisation_recent_pct, 3),
        "queueing_delay_s": _rounded(result.wait_s), "completion_time_s": _rounded(result.jct_s),
        "production_queueing_delay_s": _rounded(result.production_wait_s),
        "projects": result.fairness,
        "entitlement": {"deviation_pct": round(result.entitlement_deviation_pct, 3),
                        "projects": {name: {k: round(v, 3) for k, v in figures.items()}
                                     for name, figures in result.delivered.items()}},
        "entitlement_series": {name: [[round(t, 1), round(d, 3), round(e, 3)] for t, d, e in points]
                               for name, points in result.entitlement_series.items()},
        "allocation_ratio_series": [[round(t, 1), round(v, 3)] for t, v in result.series],
        "project_share_series": {name: [[round(t, 1), round(a, 4), round(f, 4)] for t, a, f in points]
                                 for name, points in result.shares.items()},
    }


def _rounded(stats: dict) -> dict:
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in stats.items()}


def replay_text(result: ReplayResult, placement: str, nodes: int, meta: dict) -> str:
    """A replay's figures for people."""
    w, j, p = result.wait_s, result.jct_s, result.production_wait_s
    lines = [f"Replay: {result.jobs} pods that ran in production, on {nodes} nodes / "
             f"{result.capacity_gpus:g} GPUs, placement {placement}, {result.cycles} cycles",
             f"  {', '.join(f'{k} {v}' for k, v in meta.items())}",
             f"GPU utilisation (allocated / capacity, time-weighted): {result.utilisation_pct:.2f}% over the "
             f"whole trace, {result.utilisation_recent_pct:.2f}% over its last 30 days",
             f"Queueing delay (s): mean {w['mean']:.0f}, median {w['median']:.0f}, p99 {w['p99']:.0f} "
             f"(production: mean {p['mean']:.0f}, median {p['median']:.0f}, p99 {p['p99']:.0f})",
             f"Job completion time (s): mean {j['mean']:.0f}, median {j['median']:.0f}, p99 {j['p99']:.0f}",
             f"Started {result.started}, finished {result.finished}, never started {result.never_started}; "
             f"evictions {result.evictions}, moves {result.moves}", "",
             "Per project: GPU quota and mean absolute deviation of allocation from fair share:",
             table(["PROJECT", "QUOTA GPUS", "MAD GPUS", "MAD / QUOTA"],
                   [[name, f"{v['quota_gpus']:.2f}", f"{v['mad_gpus']:.3f}",
                     f"{v['mad_gpus'] / v['quota_gpus']:.2f}" if v["quota_gpus"] else "-"]
                    for name, v in result.fairness.items()])]
    lines += ["", f"Delivered GPU-hours against entitlement (fair share without history, integrated): "
                  f"deviation {result.entitlement_deviation_pct:.2f}% (sum of |delivered - entitled| "
                  f"over sum of entitled)"]
    return "\n".join(lines)


def history_text(without: ReplayResult, with_history: ReplayResult, strength: float, half_life_days: float) -> str:
    """Each project's delivered GPU-hours against its entitlement, replayed without and with history."""
    names = sorted(set(without.delivered) | set(with_history.delivered),
                   key=lambda n: -without.delivered.get(n, {}).get("entitled_gpu_hours", 0.0))
    rows = []
    for name in names:
        off = without.delivered.get(name, {})
        on = with_history.delivered.get(name, {})
        rows.append([name, f"{off.get('entitled_gpu_hours', 0.0):.1f}", f"{off.get('delivered_gpu_hours', 0.0):.1f}",
                     f"{on.get('entitled_gpu_hours', 0.0):.1f}", f"{on.get('delivered_gpu_hours', 0.0):.1f}"])
    return "\n".join([
        f"Fair share with history (strength {strength:g}, half-life {half_life_days:g} days) against without:",
        f"  deviation of delivered from entitled GPU-hours: without history "
        f"{without.entitlement_deviation_pct:.2f}%, with history {with_history.entitlement_deviation_pct:.2f}%",
        table(["PROJECT", "ENTITLED (OFF)", "DELIVERED (OFF)", "ENTITLED (ON)", "DELIVERED (ON)"], rows)])
