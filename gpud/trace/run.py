"""Running fill and replay experiments from trace files, over several placements and seeds."""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Sequence

from gpud.trace.alibaba import read_nodes, read_pods, trace_plugin
from gpud.trace.fill import LEVELS, FillResult, run_fill


@dataclass
class FillSummary:
    """One placement's fill runs averaged over seeds."""

    strategy: str
    seeds: list[int]
    alloc_pct: dict[int, float]
    unallocated_gpus: dict[int, float]
    wall_s: float
    runs: list[FillResult] = field(default_factory=list)


def plugin_manager(pods, disable: Sequence[str] = ()):
    """The plugin manager a trace run uses: gpud's plugins plus a fragmentation-aware plugin that
    knows the trace's typical requests."""
    from gpud.plugins import make_plugin_manager
    pm = make_plugin_manager(disable)
    pm.register(trace_plugin(pods), name="trace-profile")
    return pm


def _one(args: tuple) -> FillResult:
    trace, nodes_path, strategy, seed, ratio = args
    pods = read_pods(trace)
    return run_fill(pods, read_nodes(nodes_path), strategy, seed, plugin_manager(pods), ratio)


def fill_many(trace: str, nodes_path: str, strategies: Sequence[str], seeds: Sequence[int],
              ratio: float = 1.3, workers: int = 1) -> list[FillSummary]:
    """Fill runs for every placement and seed, averaged per placement (levels of ``LEVELS``).

    With ``workers`` > 1 the runs are spread over that many processes; each
    run is independent and seeded, so the figures do not depend on it.
    """
    out = []
    for strategy in strategies:
        started = time.perf_counter()
        tasks = [(trace, nodes_path, strategy, seed, ratio) for seed in seeds]
        if workers > 1:
            with ProcessPoolExecutor(workers) as pool:
                runs = list(pool.map(_one, tasks))
        else:
            pods, nodes = read_pods(trace), read_nodes(nodes_path)
            pm = plugin_manager(pods)
            runs = [run_fill(pods, nodes, strategy, seed, pm, ratio) for seed in seeds]
        out.append(FillSummary(strategy, list(seeds),
                               {lv: statistics.fmean(r.alloc_pct[lv] for r in runs) for lv in LEVELS},
                               {lv: statistics.fmean(r.unallocated_gpus[lv] for r in runs) for lv in LEVELS},
                               time.perf_counter() - started, runs))
    return out


def parse_seeds(text: str) -> list[int]:
    """Seeds from ``42-51`` or ``42,43,50`` (ranges inclusive)."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            low, high = part.split("-", 1)
            seeds.extend(range(int(low), int(high) + 1))
        elif part:
            seeds.append(int(part))
    if not seeds:
        raise ValueError(f"no seeds in {text!r}")
    return seeds
