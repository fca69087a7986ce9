"""Benchmark of gpud's placement and scheduling on the Alibaba GPU trace v2023, against the FGD paper.

fill    the paper's method, per workload (default, gpushare100, multigpu50): pods in a seeded
        random order (--seeds, 42-51 by default; run 52-61 too: fragaware's and fgd's weights were
        chosen on 42-51), never finishing, until requests reach 130% of the 6,212 GPUs; the GPU allocation ratio at each arrived-load level for gpud's placements,
        side by side with the six published policies (mean over seeds 42-51), and a PASS/FAIL
        line per placement against the best published policy at 80%, 90% and 130%;
replay  the trace in simulated time through the warm scheduler on a seeded 1% of the nodes,
        with Helios (Venus) VC quotas as projects: utilisation, waits, completion times,
        evictions, deviation from fair share.
Every figure comes from gpud's real placement plugins and scheduling core; wall times are printed.
    python bench/trace.py [--workloads default,gpushare100,multigpu50] [--placements binpack,spread,fgd,fragaware]
                          [--seeds 42-51] [--workers 2] [--scale 0.01] [--no-replay] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpud.trace.alibaba import read_nodes, read_pods, total_gpus  # noqa: E402
from gpud.trace.projects import project_of, read_helios_quotas, trace_policy  # noqa: E402
from gpud.trace.published import read_published  # noqa: E402
from gpud.trace.replay import replay  # noqa: E402
from gpud.trace.report import fill_json, fill_text, replay_json, replay_text  # noqa: E402
from gpud.trace.run import fill_many, parse_seeds, plugin_manager  # noqa: E402
from gpud.trace.scale import scale_nodes  # noqa: E402
from gpud.trace.verdict import verdict_json, verdict_text, versus_published  # noqa: E402

# The trace files ship in the checkout (traces/); GPUD_TRACES points at another copy with the same layout.
TRACES = os.environ.get("GPUD_TRACES", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "traces"))
ALIBABA = os.path.join(TRACES, "alibaba-gpu-v2023")
NODES = os.path.join(ALIBABA, "csv", "openb_node_list_gpu_node.csv")
PUBLISHED = os.path.join(ALIBABA, "published", "fgd_atc23_expected_results_summary.csv")
QUOTAS = os.path.join(TRACES, "helios-vc-quotas", "venus_cluster_gpu_number.csv")


def pods_path(workload: str) -> str:
    """The pod list of one workload of the trace."""
    return os.path.join(ALIBABA, "csv", f"openb_pod_list_{workload}.csv")


def run_fill(workloads, placements, seeds, workers) -> list[dict]:
    """Fill runs per workload; prints each comparison table as it completes."""
    capacity = total_gpus(read_nodes(NODES))
    docs = []
    for workload in workloads:
        started = time.perf_counter()
        summaries = fill_many(pods_path(workload), NODES, placements, seeds, 1.3, workers)
        published = read_published(PUBLISHED, workload)
        print(fill_text(workload, capacity, 1.3, summaries, published), file=sys.stderr)
        verdicts = versus_published(summaries, published)
        print(verdict_text(verdicts), file=sys.stderr)
        print(f"  ({time.perf_counter() - started:.1f}s for {len(placements)} placements x "
              f"{len(seeds)} seeds, {workers} process(es))\n", file=sys.stderr)
        doc = fill_json(workload, capacity, 1.3, summaries, published)
        doc["versus_published"] = verdict_json(verdicts)
        for entry in doc["placements"]:
            entry.pop("curve_first_seed")
        docs.append(doc)
    return docs


def run_replay(placements, scale: float, seed: int) -> list[dict]:
    """One replay per placement of the default workload on the scaled cluster."""
    pods = read_pods(pods_path("default"))
    nodes = scale_nodes(read_nodes(NODES), scale, seed)
    table = read_helios_quotas(QUOTAS)
    capacity = float(sum(n.usable_gpus for n in nodes))
    docs = []
    for placement in placements:
        started = time.perf_counter()
        result = replay(pods, nodes, trace_policy(table, capacity, placement), plugin_manager(pods),
                        lambda p: project_of(p.name, table, seed))
        meta = {"scale": scale, "seed": seed, "quotas": f"venus ({table.day})",
                "wall_s": round(time.perf_counter() - started, 2)}
        print(replay_text(result, placement, len(nodes), meta) + "\n", file=sys.stderr)
        doc = replay_json(result, placement, len(nodes), meta)
        doc.pop("allocation_ratio_series")
        doc.pop("project_share_series")
        docs.append(doc)
    return docs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="default,gpushare100,multigpu50")
    parser.add_argument("--placements", default="binpack,spread,fgd,fragaware")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scale", type=float, default=0.01)
    parser.add_argument("--replay-placements", default="binpack,fragaware")
    parser.add_argument("--no-replay", action="store_true")
    parser.add_argument("--quick", action="store_true", help="default workload, seeds 42-43, no replay")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    args = parser.parse_args()
    if not os.path.exists(NODES):
        print(f"bench/trace.py: no trace at {ALIBABA} (set GPUD_TRACES)", file=sys.stderr)
        return 2
    workloads = ["default"] if args.quick else [w for w in args.workloads.split(",") if w]
    seeds = parse_seeds("42-43" if args.quick else args.seeds)
    placements = [p for p in args.placements.split(",") if p]
    started = time.perf_counter()
    report = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                          "platform": platform.platform()},
              "fill": run_fill(workloads, placements, seeds, args.workers)}
    if not (args.no_replay or args.quick):
        report["replay"] = run_replay([p for p in args.replay_placements.split(",") if p], args.scale, 0)
    report["wall_s"] = round(time.perf_counter() - started, 1)
    print(f"Total wall time: {report['wall_s']}s", file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
