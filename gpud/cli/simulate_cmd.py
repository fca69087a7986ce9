"""``gpuctl simulate``: run the real scheduler on a scenario file and show what it decided."""

from __future__ import annotations

import argparse
import json
import sys

from gpud.cli.render import table
from gpud.core.queues import format_amount
from gpud.errors import ConfigError
from gpud.plugins import make_plugin_manager, placement_strategies
from gpud.policy_file import ANY_PLACEMENT, check_placements
from gpud.scenario import load_scenario
from gpud.simulate import Simulation, eviction_rows, job_rows, queue_rows, simulate

EXIT_OK, EXIT_EXPECT_FAILED, EXIT_BAD_FILE = 0, 1, 2

DESCRIPTION = """\
Run the scheduler, with the real policies and plugins, on a scenario file
(a policy plus nodes and jobs; the format is in docs/scenarios.md) and print what runs
where, what was evicted or moved and why, each queue's allocation, quota and
fair share, and why each pending job waits.

Exit status: 0 when the scenario's [expect] table holds (or it has none),
1 when an expectation fails (each failure is printed), 2 when the file is
not a valid scenario (the message names the table and key).
"""

EXAMPLES = """\
examples:
  gpuctl simulate examples/quickstart.toml
  gpuctl simulate --json my-cluster.toml | jq '.queues'
  gpuctl simulate --cycles 3 reclaim.toml
"""


def add_parser(subparsers) -> None:
    """Register ``simulate`` on a gpuctl sub-command parser."""
    parser = subparsers.add_parser(
        "simulate", help="try a policy on a scenario file, in memory",
        description=DESCRIPTION, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", help="scenario file (TOML)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    parser.add_argument("--cycles", type=int, metavar="N",
                        help="scheduling cycles to run (overrides the file's 'cycles')")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load, simulate, print; returns the exit status."""
    try:
        scenario = load_scenario(args.file, ANY_PLACEMENT)
        if args.cycles is not None:
            if args.cycles < 1:
                raise ConfigError(args.file, "--cycles", f"must be at least 1 (got {args.cycles})")
            scenario = scenario.__class__(scenario.source, scenario.policy, scenario.snapshot, args.cycles,
                                          scenario.stable_cycles, scenario.expect)
        pm = make_plugin_manager(scenario.policy.plugins.disable, scenario.policy.plugins.directory)
        check_placements(scenario.policy, placement_strategies(pm), scenario.source, "policy.")
    except ConfigError as exc:
        print(f"gpuctl simulate: {exc}", file=sys.stderr)
        return EXIT_BAD_FILE
    sim = simulate(scenario, pm)
    if args.json:
        print(json.dumps(to_json(sim, scenario.expect is not None), indent=2))
    else:
        print(to_text(sim, scenario.expect is not None))
    return EXIT_EXPECT_FAILED if sim.failures else EXIT_OK


def to_json(sim: Simulation, has_expect: bool) -> dict:
    """The simulation as one JSON-ready document."""
    return {
        "cycles": len(sim.plans),
        "jobs": job_rows(sim),
        "queues": queue_rows(sim),
        "evictions": eviction_rows(sim),
        "preempted": sorted(sim.preempted),
        "expect": {"checked": has_expect, "ok": not sim.failures, "failures": sim.failures},
    }


def to_text(sim: Simulation, has_expect: bool) -> str:
    """The simulation as tables for people."""
    jobs = job_rows(sim)
    out = [f"After {len(sim.plans)} cycle(s):", "",
           table(["JOB", "PROJECT", "PRIO", "STATE", "TASKS", "NODES", "GPUS"],
                 [[j["job"], j["project"], j["priority"], j["state"], f"{j['tasks_running']}/{j['tasks']}",
                   ",".join(n for n in j["nodes"] if n) or "-",
                   ";".join(",".join(map(str, g)) for g in j["gpu_index"] if g) or "-"] for j in jobs]),
           "", "Queues:",
           table(["QUEUE", "KIND", "POOL", "GPUS", "QUOTA", "FAIR SHARE", "DEMAND"],
                 [[q["queue"], q["kind"], q["pool"], format_amount(q["allocated_gpus"]),
                   format_amount(q["quota_gpus"]), f"{q['fair_share_gpus']:.2f}",
                   format_amount(q["demand_gpus"])] for q in queue_rows(sim)])]
    evictions = eviction_rows(sim)
    if evictions:
        out += ["", "Evictions:"]
        out += [f"  cycle {e['cycle']}: job {e['job']} {'moved' if e['moved'] else 'stopped'} "
                f"(tasks {','.join(map(str, e['tasks']))}): {e['reason']}" for e in evictions]
    waiting = [j for j in jobs if j["reason"]]
    if waiting:
        out += ["", "Pending:"]
        out += [f"  {j['job']}: {j['reason']}" for j in waiting]
    if has_expect:
        out.append("")
        if sim.failures:
            out.append("Expectations FAILED:")
            out += [f"  {f}" for f in sim.failures]
        else:
            out.append("Expectations hold.")
    return "\n".join(out)
