"""Slurm's commands (sbatch, squeue, sacct, scancel, sinfo, srun, salloc, scontrol) over gpud's API.

``gpuctl slurm-shims`` writes one small executable per command, each calling
:func:`run`; tools written against Slurm (submitit, sweep scripts) then drive
gpud unchanged. Only what a command needs is imported, so a call stays fast.
"""

from __future__ import annotations

import sys

# Each command and the module (in this package) with its ``main(argv) -> int``.
COMMANDS = {"sbatch": "submit", "salloc": "submit", "srun": "srun", "squeue": "jobs", "sacct": "jobs",
            "scancel": "jobs", "scontrol": "jobs", "sinfo": "jobs"}


def run(command: str, argv: list[str]) -> int:
    """Run Slurm command ``command`` with ``argv``; returns its exit status (1 with a message on failure)."""
    from gpud.client import ClientError
    from gpud.cli.common import UsageError
    # __import__ rather than importlib.import_module: importlib's package imports warnings, a cost of every call.
    module = __import__(f"gpud.cli.slurm.{COMMANDS[command]}", fromlist=[command])
    try:
        return int(getattr(module, command)(argv))
    except (UsageError, ValueError) as exc:
        print(f"{command}: error: {exc}", file=sys.stderr)
        return 1
    except ClientError as exc:
        print(f"{command}: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


def main() -> int:
    """``python -m gpud.cli.slurm COMMAND ARGS...``."""
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(f"usage: python -m gpud.cli.slurm {{{','.join(COMMANDS)}}} ARGS...", file=sys.stderr)
        return 2
    return run(sys.argv[1], sys.argv[2:])
