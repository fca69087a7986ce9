"""gpuctl checkpointed: inside a task, record that the job has a complete checkpoint now."""

from __future__ import annotations

import argparse
import os

from gpud.cli.common import UsageError, print_json
from gpud.cli.parsing import add_verb


def add_parsers(subparsers) -> None:
    """Register ``checkpointed``."""
    add_verb(subparsers, "checkpointed", help="record that this job's checkpoint is complete (inside a task)",
             description="Tell the controller that the job running this task has a complete checkpoint now. "
                         "Preemption then counts only the work done since, and a job told to checkpoint "
                         "before a preemption (--signal SIG@LEAD) is stopped at once, losing nothing more. "
                         "Needs no configuration inside a task: it uses the task's own checkpoint credential "
                         "(GPUD_CHECKPOINT_TOKEN, GPUD_JOB_ID and GPUD_URL, which gpud sets), which can do "
                         "nothing else. Programs that cannot run a command touch the file "
                         "$GPUD_CHECKPOINT_DIR/.gpud-checkpointed instead: the node reports each new one.",
             examples="  torch.save(state, f\"{os.environ['GPUD_CHECKPOINT_DIR']}/model.pt\") && gpuctl checkpointed\n"
                      "  gpuctl checkpointed --job 42    # outside a task, as the job's owner",
             func=run_checkpointed, json_flag=True).add_argument(
        "--job", metavar="ID", help="the job (default: the task's own, GPUD_JOB_ID)")


def run_checkpointed(args: argparse.Namespace) -> int:
    """Record the checkpoint; prints when it was recorded."""
    from gpud.client import Client, configured_ca, load_settings
    job = args.job or os.environ.get("GPUD_JOB_ID")
    if not job:
        raise UsageError("not inside a gpud task (no GPUD_JOB_ID): name the job with --job")
    token = os.environ.get("GPUD_CHECKPOINT_TOKEN") if not args.job else None
    settings = load_settings(os.environ)
    client = Client(settings.url, token or settings.token, ca=configured_ca(os.environ))
    answer = client.post(f"jobs/{job}/checkpoints")
    if args.json:
        print_json(answer)
    else:
        stopped = " (the job was told to stop: it stops now)" if answer.get("stopped_now") else ""
        print(f"checkpoint {answer.get('checkpoints')} of job {job} recorded{stopped}")
    return 0
