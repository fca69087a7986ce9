"""``gpuctl projects`` and ``gpuctl policy reload``: quotas, fair shares, and changing the policy."""

from __future__ import annotations

import argparse
import sys

from gpud.cli import render
from gpud.cli.common import client, print_json
from gpud.cli.parsing import add_verb
from gpud.cli.units import format_number, format_size_gib

RESOURCES = ("gpu", "cpu", "memory")

PROJECTS_DESCRIPTION = """\
Show, per node pool, each department and the projects inside it: the quota
it deserves, its fair share now (quota plus its share of what is idle), what
it holds, what it asks for (running + pending), and its pending and running
jobs. Numbers are GPUs unless --resource says otherwise.
"""

PROJECTS_EXAMPLES = """\
  gpuctl projects
  gpuctl projects --pool h100 --resource cpu
  gpuctl projects --json | jq '.queues[] | select(.name == "vision")'
"""

POLICY_DESCRIPTION = """\
Make the controller read its policy file again. A bad policy is refused with
the file, line and key in the message, and the policy in force is kept.
Admins only.
"""


def add_parsers(subparsers) -> None:
    """Register ``projects`` and ``policy`` on the gpuctl sub-command parser."""
    projects = add_verb(subparsers, "projects", help="quota, fair share and use per project and department",
                        description=PROJECTS_DESCRIPTION, examples=PROJECTS_EXAMPLES, func=run_projects,
                        json_flag=True)
    projects.add_argument("--pool", help="only this node pool")
    projects.add_argument("--resource", choices=RESOURCES, default="gpu", help="which resource to show")
    policy = subparsers.add_parser("policy", help="policy administration (admin)",
                                   description="Policy administration.")
    verbs = policy.add_subparsers(title="commands", metavar="COMMAND")
    add_verb(verbs, "reload", help="read the policy file again", description=POLICY_DESCRIPTION,
             examples="  sudoedit /etc/gpud/policy.toml && gpuctl policy reload\n", func=run_reload)
    policy.set_defaults(help_of=policy)


def run_projects(args: argparse.Namespace) -> int:
    """Print the queue table."""
    answer = client().get("projects")
    queues = answer.get("queues", [])
    if args.pool:
        queues = [q for q in queues if q.get("pool") == args.pool]
        answer = {**answer, "queues": queues}
    if args.json:
        print_json(answer)
    else:
        print(projects_table(queues, args.resource))
    return 0


def projects_table(queues: list[dict], resource: str = "gpu") -> str:
    """Departments, each followed by its projects (indented), grouped by pool."""
    departments = [q for q in queues if q.get("kind") == "department"]
    projects = [q for q in queues if q.get("kind") != "department"]
    ordered = []
    for pool in sorted({str(q.get("pool")) for q in queues}):
        in_pool = [q for q in projects if str(q.get("pool")) == pool]
        for dept in [d for d in departments if str(d.get("pool")) == pool]:
            ordered.append((dept, dept.get("name")))
            ordered += [(p, "  " + str(p.get("name"))) for p in in_pool if p.get("department") == dept.get("name")]
        named = {d.get("name") for d in departments if str(d.get("pool")) == pool}
        ordered += [(p, p.get("name")) for p in in_pool if p.get("department") not in named]
    amount = format_size_gib if resource == "memory" else format_number
    rows = []
    for queue, label in ordered:
        fair = _get(queue.get("fair_share"), resource)
        rows.append([queue.get("pool"), label, queue.get("kind"), amount(_get(queue.get("quota"), resource)),
                     "-" if fair is None else (format_number(round(fair, 2)) if resource != "memory" else amount(fair)),
                     amount(_get(queue.get("allocated"), resource)), amount(_get(queue.get("demand"), resource)),
                     queue.get("pending_jobs", "-"), queue.get("running_jobs", "-")])
    return render.table(["POOL", "QUEUE", "KIND", "QUOTA", "FAIR SHARE", "ALLOCATED", "DEMAND", "PENDING",
                         "RUNNING"], rows)


def _get(resources, resource: str):
    if isinstance(resources, dict):
        return resources.get(resource)
    return resources if resource == "gpu" else None


def run_reload(args: argparse.Namespace) -> int:
    """Ask the controller to reload its policy."""
    answer = client().post("policy/reload") or {}
    print("policy reloaded")
    for removed in answer.get("removed_projects") or []:
        running, pending = removed.get("running", 0), removed.get("pending", 0)
        fates = ([f"its running jobs ({running}) run on until they end"] if running else []) + (
            [f"its pending jobs ({pending}) wait (reason: project {removed['project']} is not in the policy) "
             f"until it is back or they are cancelled"] if pending else [])
        if fates:
            print(f"gpuctl policy reload: warning: project {removed['project']} is no longer in the policy: "
                  f"{'; '.join(fates)}", file=sys.stderr)
    return 0
