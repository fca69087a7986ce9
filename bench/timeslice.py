"""Benchmark of GPU time-slicing with CPU-bound stand-in jobs pinned to one core (the core plays the GPU).

Scenarios: strict 25/75, strict 10/20/30/40, and fair 50/50 (limit 1.0)
with one job idle half the time (its fake NVML utilisation is 0 for two
plans, then 100 for two; its stand-in keeps spinning so that the probe
lease an idle job keeps shows in the measurement). For each plan it
compares each job's part of the run time the stand-ins got against the
share the slicer meant to give it, and prints the per-plan error in
percentage points (max and mean over the plans) and the switch overhead
(from freezing one holder to the next one thawed).

    python bench/timeslice.py [--lease-ms 250] [--precision 0.05] [--plans 3] [--meter cpu|wall]
                              [--freezer signal|cgroup] [--json]

Target: at most 1 pp per plan on a quiet machine. ``core busy`` is the
part of the core the stand-ins got; well below 100 % the machine is busy
with other work and the errors say more about it than about gpud.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

from gpud.gpu.fake import FakeBackend, set_process_usage
from gpud.node.slicerun import UsageMonitor
from gpud.node.standins import run_slicer, summary

SCENARIOS = {
    "strict 25/75": ("strict", {"a": (0.25, 0.25), "b": (0.75, 0.75)}),
    "strict 10/20/30/40": ("strict", {"a": (0.1, 0.1), "b": (0.2, 0.2), "c": (0.3, 0.3), "d": (0.4, 0.4)}),
    "fair 50/50, b idle half the time": ("fair", {"a": (0.5, 1.0), "b": (0.5, 1.0)}),
}


def run(name: str, args: argparse.Namespace) -> dict:
    """One scenario: per-plan errors, switch overhead, and (fair) the shares the slicer chose."""
    mode, requests = SCENARIOS[name]
    monitor = None
    each_plan = None
    if mode == "fair":
        state_dir = tempfile.mkdtemp(prefix="gpud-bench-")
        monitor = UsageMonitor(FakeBackend("bench", 1, state_dir), 0.02)

        def each_plan(number, pids):
            idle = (number // 2) % 2 == 1
            set_process_usage(state_dir, pids["a"], 0, 1.0, 100.0)
            set_process_usage(state_dir, pids["b"], 0, 1.0, 0.0 if idle else 100.0)
    plans = args.plans if mode == "strict" else max(args.plans, 8)
    samples, slicer = run_slicer(mode, requests, plans, lease_s=args.lease_ms / 1000.0, precision=args.precision,
                                 warmup=1, monitor=monitor, meter=args.meter, freezer=args.freezer,
                                 each_plan=each_plan)
    switches = [s for record in slicer.history for s in record.switches]
    result = {"scenario": name, "plans": len(samples), **summary(samples),
              "switch_us_mean": statistics.fmean(switches) * 1e6 if switches else 0.0,
              "switch_us_p99": sorted(switches)[int(len(switches) * 0.99) - 1] * 1e6 if switches else 0.0,
              "per_plan_max_pp": [round(max(s.errors_pp().values()), 2) for s in samples],
              "shares": [{k: round(v, 3) for k, v in s.shares.items()} for s in samples],
              "measured": [{k: round(v, 3) for k, v in s.measured().items()} for s in samples]}
    return result


def main(argv: list[str] | None = None) -> int:
    """Run every scenario and print a table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lease-ms", type=float, default=250.0)
    parser.add_argument("--precision", type=float, default=0.05)
    parser.add_argument("--plans", type=int, default=3, help="plans measured per strict scenario (at least 3)")
    parser.add_argument("--meter", choices=("cpu", "wall"), default="cpu",
                        help="what the slicer counts as delivered: run time (cpu) or time held (wall)")
    parser.add_argument("--freezer", choices=("signal", "cgroup"), default="signal")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    args.plans = max(3, args.plans)
    cpu = max(os.sched_getaffinity(0))
    plan_s = args.lease_ms / args.precision / 1000
    print(f"lease {args.lease_ms:g} ms, precision {args.precision:g} (plan {plan_s:g} s), meter {args.meter}, "
          f"freezer {args.freezer}, stand-ins on CPU {cpu}", file=sys.stderr)
    results = [run(name, args) for name in SCENARIOS]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'scenario':36} {'plans':>5} {'max pp':>7} {'mean pp':>8} {'core busy':>9} {'switch us':>10} {'p99 us':>8}")
    for r in results:
        print(f"{r['scenario']:36} {r['plans']:>5} {r['max_pp']:>7.2f} {r['mean_pp']:>8.2f} {r['core_busy']:>9.0%} "
              f"{r['switch_us_mean']:>10.0f} {r['switch_us_p99']:>8.0f}")
    busiest = min(r["core_busy"] for r in results)
    if busiest < 0.9:
        print(f"note: the stand-ins got as little as {busiest:.0%} of their core: the machine is busy with other "
              f"work, which the errors include")
    fair = results[-1]
    idle = [m["a"] for m, s in zip(fair["measured"], fair["shares"]) if s["a"] > 0.5]
    busy = [m["a"] for m, s in zip(fair["measured"], fair["shares"]) if s["a"] <= 0.5]
    if idle and busy:
        print(f"fair: a got {statistics.fmean(busy):.1%} while b worked, {statistics.fmean(idle):.1%} while b idled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
