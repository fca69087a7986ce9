"""``gpuctl nodes``, ``drain`` and ``resume``: the GPU hosts, their use, and taking them out of service."""

from __future__ import annotations

import argparse
import time

from gpud.cli import render
from gpud.cli.common import client, print_json
from gpud.cli.parsing import add_verb
from gpud.cli.units import format_number, format_size_gib

NODES_DESCRIPTION = """\
Show every node (as sinfo does): its pool and state, GPUs used (a shared GPU
counts its used fraction) and idle (whole GPUs with nothing on them, then the
room left on shared ones: `6 +0.8 shared`), CPUs and memory in use of the
node's total, GPU model, and why a node is down, drained or draining, or runs
tasks without cgroups ("limits: not enforced"). A summary per pool follows.

States: up; unknown (known from before the controller started, its daemon
not reconnected yet; down after node_timeout_s of silence); down (silent, its
jobs requeued or failed); draining (drained, jobs still running); drained.
Only up nodes take new work.
"""

NODES_EXAMPLES = """\
  gpuctl nodes
  gpuctl nodes --pool h100
  gpuctl nodes --json | jq '.nodes[] | select(.state != "up")'
"""


def add_parsers(subparsers) -> None:
    """Register ``nodes``, ``drain`` and ``resume`` on the gpuctl sub-command parser."""
    nodes = add_verb(subparsers, "nodes", help="GPU hosts: GPUs used and idle, state", func=run_nodes,
                     description=NODES_DESCRIPTION, examples=NODES_EXAMPLES, json_flag=True)
    nodes.add_argument("--pool", help="only this node pool")
    drain = add_verb(subparsers, "drain", help="stop placing work on a node (admin)", func=run_drain,
                     description="Drain a node: no new work goes there; running jobs finish. Admins only.",
                     examples='  gpuctl drain n17 --reason "GPU 3 ECC errors"\n')
    drain.add_argument("node", help="node name")
    drain.add_argument("--reason", required=True, help="why, for other people (shown by `gpuctl nodes`)")
    resume = add_verb(subparsers, "resume", help="put a drained node back in service (admin)", func=run_resume,
                      description="Resume a drained node: it takes new work again. Admins only.",
                      examples="  gpuctl resume n17\n")
    resume.add_argument("node", help="node name")


def run_nodes(args: argparse.Namespace) -> int:
    """Print the node table and the pool summary."""
    answer = client().get("nodes")
    if args.pool:
        answer = {**answer, "nodes": [n for n in answer.get("nodes", []) if n.get("pool") == args.pool]}
    if args.json:
        print_json(answer)
    else:
        print(nodes_text(answer.get("nodes", []), time.time()))
    return 0


def nodes_text(nodes: list[dict], now: float) -> str:
    """The node table, then one line per pool with its totals."""
    rows = []
    for node in nodes:
        gpus = node.get("gpus") or []
        models = sorted({g.get("model") for g in gpus if g.get("model")})
        unhealthy = sum(1 for g in gpus if g.get("healthy") is False)
        seen = node.get("last_seen")
        rows.append([node.get("name"), node.get("pool"), node.get("state"),
                     f"{format_number(node.get('gpus_used', 0))}/{len(gpus)}",
                     idle_cell(*idle_gpus(node)), ",".join(models) or "-",
                     _in_use(node.get("cpus_used"), node.get("cpus"), format_number),
                     _in_use(node.get("memory_used_gib"), node.get("memory_gib"), format_size_gib),
                     "-" if seen is None else f"{max(0, int(now - seen))}s ago",
                     _reason(node, unhealthy)])
    out = [render.table(["NODE", "POOL", "STATE", "GPUS USED", "IDLE", "MODEL", "CPUS USED", "MEMORY USED", "SEEN",
                         "REASON"], rows)]
    if nodes:
        out += ["", pools_table(nodes)]
    return "\n".join(out)


def pools_table(nodes: list[dict]) -> str:
    """One row per pool: nodes (and how many are up), GPUs, used, idle, and GPUs on nodes not up."""
    pools: dict[str, list[float]] = {}
    for node in nodes:
        total = pools.setdefault(node.get("pool") or "-", [0, 0, 0, 0, 0, 0, 0])
        whole, sliver = idle_gpus(node)
        gpus = len(node.get("gpus") or [])
        total[0] += 1
        total[1] += node.get("state") == "up"
        total[2] += gpus
        total[3] += node.get("gpus_used") or 0
        total[4] += whole
        total[5] += gpus if node.get("state") != "up" else 0
        total[6] += sliver
    return render.table(["POOL", "NODES", "UP", "GPUS", "USED", "IDLE", "OUT OF SERVICE"],
                        [[pool, int(t[0]), int(t[1]), int(t[2]), format_number(t[3]), idle_cell(int(t[4]), t[6]),
                          int(t[5])] for pool, t in sorted(pools.items())])


def _in_use(used: float | None, total: float | None, fmt) -> str:
    """``used/total`` (``12/64``, ``96G/512G``), or the total alone from a controller that does not count use."""
    if used is None:
        return fmt(total)
    return f"{fmt(used) if used else '0'}/{fmt(total)}"


def idle_gpus(node: dict) -> tuple[int, float]:
    """A node's idle GPUs: how many are whole (nothing on them), and the idle share left on shared ones.

    Only whole GPUs can take a job asking for 1 or more; 6.8 idle on a node
    with two shared GPUs is 6 whole plus 0.8 in slivers.
    """
    gpus = node.get("gpus") or []
    used = [min(1.0, max(0.0, g.get("used") or 0.0)) for g in gpus]
    return sum(1 for u in used if u <= 1e-9), round(sum(1.0 - u for u in used if u > 1e-9), 6)


def idle_cell(whole: int, sliver: float) -> str:
    """``6``, or ``6 +0.8 shared`` when shared GPUs have room left."""
    return f"{whole} +{format_number(sliver)} shared" if sliver > 1e-9 else str(whole)


def _reason(node: dict, unhealthy: int) -> str:
    parts = [node["reason"]] if node.get("reason") else []
    limits = node.get("limits")
    if isinstance(limits, dict) and not limits.get("enforced"):
        parts.append("limits: not enforced")
    if unhealthy:
        parts.append(f"{unhealthy} GPU{'s' if unhealthy > 1 else ''} unhealthy")
    return "; ".join(parts)


def run_drain(args: argparse.Namespace) -> int:
    """Drain one node."""
    from urllib.parse import quote
    client().post(f"nodes/{quote(args.node, safe='')}/drain", {"reason": args.reason})
    print(f"draining {args.node}: running jobs finish, no new work starts there")
    return 0


def run_resume(args: argparse.Namespace) -> int:
    """Resume one node."""
    from urllib.parse import quote
    client().post(f"nodes/{quote(args.node, safe='')}/resume")
    print(f"resumed {args.node}")
    return 0
