"""``gpuctl simulate``: run the real scheduler on a scenario file and show what it decided."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from gpud.cli.render import table

if TYPE_CHECKING:
    from gpud.simulate import Simulation

# The scheduler is imported only when a simulation runs, so other gpuctl verbs start fast.
EXIT_OK, EXIT_EXPECT_FAILED, EXIT_BAD_FILE, EXIT_UNREACHABLE = 0, 1, 2, 3
STATE_KEYS = ("policy", "nodes", "jobs")

DESCRIPTION = """\
Run the scheduler, with the real policies and plugins, on a scenario file
(a policy plus nodes and jobs; the format is in docs/scenarios.md) and print what runs
where, what was evicted or moved and why, each queue's allocation, quota and
fair share, and why each pending job waits.

With --from-controller, start from the live cluster instead: the
controller's current policy, nodes and jobs (admins only), plus the file's
extra [[jobs]] (submitted now unless they say when) and [[nodes]] to see
what would happen to them; a [policy]
table in the file replaces the live policy, to try a change before making it.

With --trace and --nodes, replay a real cluster trace instead (the Alibaba
GPU trace v2023 format, docs/trace.md): in simulated time through the real
scheduler, or with --fill the FGD paper's method (pods in a seeded random
order that never finish, until requests reach 130% of the GPUs), printing the
GPU allocation ratio at each arrived-load level beside the published results.

Exit status: 0 when the scenario's [expect] table holds (or it has none),
1 when an expectation fails (each failure is printed) or the controller
refuses, 2 when the file is not a valid scenario (the message names the table
and key), 3 when the controller cannot be reached.
"""

EXAMPLES = """\
examples:
  gpuctl simulate examples/quickstart.toml
  gpuctl simulate --json my-cluster.toml | jq '.queues'
  gpuctl simulate --cycles 3 reclaim.toml
  gpuctl simulate --from-controller                 # what the next cycle would do now
  gpuctl simulate --from-controller big-job.toml    # would this job start, and whom would it evict?
  gpuctl simulate --trace pods.csv --nodes nodes.csv --fill --seeds 42-51 --plot fill.png
  gpuctl simulate --trace pods.csv --nodes nodes.csv --scale 0.01 --quotas venus.csv --json
"""


def add_parsers(subparsers) -> None:
    """Register ``simulate`` on a gpuctl sub-command parser."""
    parser = subparsers.add_parser(
        "simulate", help="try a policy on a scenario file, in memory",
        description=DESCRIPTION, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", nargs="?", help="scenario file (TOML); optional with --from-controller")
    parser.add_argument("--from-controller", action="store_true",
                        help="start from the live cluster's state (GPUD_URL, GPUD_TOKEN; admin)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    parser.add_argument("--cycles", type=int, metavar="N",
                        help="scheduling cycles to run (overrides the file's 'cycles')")
    trace = parser.add_argument_group("trace replay (docs/trace.md)")
    trace.add_argument("--trace", metavar="FILE", help="pod list of a trace (openb_pod_list_*.csv)")
    trace.add_argument("--nodes", metavar="FILE", help="node list of the trace (openb_node_list_*.csv)")
    trace.add_argument("--fill", action="store_true",
                       help="the FGD paper's fill method instead of a replay in time")
    trace.add_argument("--placement", metavar="NAMES",
                       help="placement strategies, comma-separated (fill default: binpack,fragaware; "
                            "replay: binpack)")
    trace.add_argument("--seeds", metavar="LIST", default="42-51",
                       help="fill seeds, e.g. 42-51 or 42,43 (default 42-51, as the paper)")
    trace.add_argument("--ratio", type=float, default=1.3,
                       help="fill until requests reach this multiple of the GPUs (default 1.3)")
    trace.add_argument("--scale", type=float, default=1.0,
                       help="replay on this fraction of the nodes, a seeded subset (default 1: all)")
    trace.add_argument("--quotas", metavar="FILE",
                       help="Helios VC quota table (*_cluster_gpu_number.csv) for the replay's projects")
    trace.add_argument("--seed", type=int, default=0,
                       help="seed of the replay's node subset and pod-to-project assignment (default 0)")
    trace.add_argument("--published", metavar="FILE",
                       help="published results to compare fill runs with (default: the trace's "
                            "../published/ summary)")
    trace.add_argument("--workers", type=int, default=1, help="processes for fill runs (default 1)")
    trace.add_argument("--history", type=float, metavar="K",
                       help="replay twice, without and with fair-share history at strength K, and compare each "
                            "project's delivered GPU-hours with its entitlement")
    trace.add_argument("--half-life", type=float, metavar="DAYS", default=7.0,
                       help="half-life of the replay's usage decay in days (default 7)")
    trace.add_argument("--plot", metavar="PNG", help="draw the results to a PNG file (needs matplotlib)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load, simulate, print; returns the exit status."""
    if getattr(args, "trace", None) or getattr(args, "nodes", None):
        from gpud.trace.command import run_trace
        return run_trace(args)
    from gpud.errors import ConfigError
    from gpud.plugins import make_plugin_manager, placement_strategies
    from gpud.policy_file import ANY_PLACEMENT, check_placements
    from gpud.scenario import load_scenario, parse_scenario
    from gpud.simulate import simulate
    if args.file is None and not args.from_controller:
        print("gpuctl simulate: give a scenario file, or --from-controller", file=sys.stderr)
        return EXIT_BAD_FILE
    try:
        if args.from_controller:
            from gpud.client import ClientError
            try:
                state = fetch_state()
            except ClientError as exc:
                print(f"gpuctl simulate: {exc}", file=sys.stderr)
                return exc.exit_code
            data, source = merge_state(state, args.file)
            scenario = parse_scenario(data, source, ANY_PLACEMENT)
        else:
            scenario = load_scenario(args.file, ANY_PLACEMENT)
        if args.cycles is not None:
            if args.cycles < 1:
                raise ConfigError(scenario.source, "--cycles", f"must be at least 1 (got {args.cycles})")
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


def fetch_state() -> dict:
    """The live cluster as a scenario document (``GET /api/v1/state``)."""
    from gpud.cli.common import client
    state = client().get("state")
    if not isinstance(state, dict):
        from gpud.client import ApiError
        raise ApiError(502, "GET /api/v1/state did not answer a JSON object")
    return state


def merge_state(state: dict, path: str | None) -> tuple[dict, str]:
    """The live state plus a scenario file's extras, as one scenario document, and its name for messages.

    The file's [[jobs]] and [[nodes]] are added to the live ones, its jobs
    submitted at the live clock unless they say otherwise (so they queue
    behind the live jobs, as a new submission would); its [policy] replaces
    the live policy; its other keys (cycles, expect, ...) are used as they
    are. A live entry and a file entry with the same name are refused by the
    scenario reader, naming the key.
    """
    data = {key: value for key, value in state.items() if key in (*STATE_KEYS, "now")}
    if path is None:
        return data, "controller state"
    from gpud.tomlcheck import read_toml
    extra, source = read_toml(path)
    if "now" in data and isinstance(extra.get("jobs"), list):
        extra["jobs"] = [{"submitted": data["now"], **job} if isinstance(job, dict) else job
                         for job in extra["jobs"]]
    for key, value in extra.items():
        if key in ("jobs", "nodes") and isinstance(value, list):
            data[key] = list(data.get(key, [])) + value
        else:
            data[key] = value
    return data, f"controller state + {source}"


def to_json(sim: Simulation, has_expect: bool) -> dict:
    """The simulation as one JSON-ready document."""
    from gpud.simulate import eviction_rows, job_rows, queue_rows
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
    from gpud.core.queues import format_amount
    from gpud.simulate import eviction_rows, job_rows, queue_rows
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
