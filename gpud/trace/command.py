"""``gpuctl simulate --trace``: fill or replay a trace and print, write JSON or plot the figures."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

EXIT_OK, EXIT_BAD_INPUT = 0, 2
FILL_DEFAULT = "binpack,fragaware"
REPLAY_DEFAULT = "binpack"


def run_trace(args: argparse.Namespace) -> int:
    """Run the trace experiment the arguments describe; returns the exit status."""
    if not args.trace or not args.nodes:
        print("gpuctl simulate: --trace and --nodes go together", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.plot:
        from gpud.trace.plot import have_matplotlib
        if not have_matplotlib():
            print("gpuctl simulate: --plot needs matplotlib (pip install 'gpud[plot]')", file=sys.stderr)
            return EXIT_BAD_INPUT
    try:
        strategies = [s for s in (args.placement or (FILL_DEFAULT if args.fill else REPLAY_DEFAULT)).split(",")
                      if s]
        _check_strategies(strategies)
        if args.fill:
            document, text = _fill(args, strategies)
        else:
            if len(strategies) != 1:
                raise ValueError("a replay takes one --placement")
            document, text = _replay(args, strategies[0])
    except (OSError, ValueError, KeyError) as exc:
        print(f"gpuctl simulate: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.plot:
        from gpud.trace.plot import plot_fill, plot_history, plot_replay
        (plot_fill if args.fill else plot_replay)(args.plot, document)
        if not args.fill and "with_history" in document:
            plot_history(_beside(args.plot, "-history"), document)
    print(json.dumps(document, indent=2) if args.json else text)
    return EXIT_OK


def _beside(path: str, suffix: str) -> str:
    """``path`` with ``suffix`` before its extension: replay.png -> replay-history.png."""
    stem, dot, ext = path.rpartition(".")
    return f"{stem}{suffix}.{ext}" if dot else path + suffix


def _check_strategies(strategies: list[str]) -> None:
    from gpud.plugins import make_plugin_manager, placement_strategies
    known = placement_strategies(make_plugin_manager())
    unknown = [s for s in strategies if s not in known]
    if unknown:
        raise ValueError(f"no placement strategy {', '.join(unknown)}; known: {', '.join(sorted(known))}")


def _fill(args: argparse.Namespace, strategies: list[str]) -> tuple[dict, str]:
    from gpud.trace.alibaba import read_nodes, total_gpus
    from gpud.trace.published import default_published_path, read_published, workload_name
    from gpud.trace.report import fill_json, fill_text
    from gpud.trace.run import fill_many, parse_seeds
    workload = workload_name(args.trace)
    capacity = total_gpus(read_nodes(args.nodes))
    summaries = fill_many(args.trace, args.nodes, strategies, parse_seeds(args.seeds), args.ratio,
                          max(1, args.workers))
    published_path = args.published or default_published_path(args.trace)
    published = read_published(published_path, workload) if published_path else []
    return (fill_json(workload, capacity, args.ratio, summaries, published),
            fill_text(workload, capacity, args.ratio, summaries, published))


def _replay(args: argparse.Namespace, strategy: str) -> tuple[dict, str]:
    import time
    from gpud.trace.alibaba import read_nodes, read_pods
    from gpud.trace.projects import QuotaTable, project_of, read_helios_quotas, trace_policy
    from gpud.trace.replay import replay
    from gpud.policy import FairShare
    from gpud.trace.report import history_text, replay_json, replay_text
    from gpud.trace.run import plugin_manager
    from gpud.trace.scale import scale_nodes
    pods = read_pods(args.trace)
    nodes = scale_nodes(read_nodes(args.nodes), args.scale, args.seed)
    capacity = float(sum(n.usable_gpus for n in nodes))
    table = (read_helios_quotas(args.quotas) if args.quotas
             else QuotaTable("none", "-", (("trace", 1.0),)))
    policy = trace_policy(table, capacity, strategy)
    strength = getattr(args, "history", None)
    half_life = getattr(args, "half_life", 7.0)
    if strength is not None and not (0 <= strength <= 100):
        raise ValueError(f"--history is a strength from 0 to 100 (got {strength:g})")
    if not half_life > 0:
        raise ValueError(f"--half-life is a number of days above 0 (got {half_life:g})")
    started = time.perf_counter()
    result = replay(pods, nodes, policy, plugin_manager(pods), lambda p: project_of(p.name, table, args.seed),
                    half_life_s=half_life * 86400.0)
    meta = {"scale": args.scale, "seed": args.seed, "quotas": f"{table.source} ({table.day})",
            "wall_s": round(time.perf_counter() - started, 2)}
    document = replay_json(result, strategy, len(nodes), meta)
    text = replay_text(result, strategy, len(nodes), meta)
    if strength is None:
        return document, text
    with_history = dataclasses.replace(policy, fair_share=FairShare(history=True, strength=strength))
    began = time.perf_counter()
    other = replay(pods, nodes, with_history, plugin_manager(pods), lambda p: project_of(p.name, table, args.seed),
                   half_life_s=half_life * 86400.0)
    meta_history = {**meta, "history_strength": strength, "half_life_days": half_life,
                    "wall_s": round(time.perf_counter() - began, 2)}
    document["with_history"] = replay_json(other, strategy, len(nodes), meta_history)
    return document, text + "\n\n" + history_text(result, other, strength, half_life)
