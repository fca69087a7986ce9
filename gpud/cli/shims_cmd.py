"""``gpuctl slurm-shims``: write sbatch, squeue, sacct, scancel, sinfo, srun, salloc and scontrol into a directory."""

from __future__ import annotations

import argparse
import os
import sys

from gpud.cli.common import UsageError
from gpud.cli.parsing import add_verb

COMMANDS = ("sbatch", "squeue", "scancel", "sacct", "sinfo", "srun", "salloc", "scontrol")
MARK = "# written by gpuctl slurm-shims"

DESCRIPTION = """\
Write small executables named after Slurm's commands (sbatch, squeue, scancel,
sacct, sinfo, srun, salloc, scontrol) into DIR, each speaking to gpud's
controller the way gpuctl does (GPUD_URL, GPUD_TOKEN or the client config).
Put DIR first on PATH and tools written for Slurm (submitit, sweep scripts)
run on gpud unchanged. Nothing is written unless you ask: a host with real
Slurm keeps its own commands. A file of the same name that gpuctl did not
write is left alone unless --force is given.
"""

EXAMPLES = """\
  gpuctl slurm-shims                          # into ~/.local/bin
  gpuctl slurm-shims --dir ~/gpud-slurm/bin && export PATH=~/gpud-slurm/bin:$PATH
"""


def add_parsers(subparsers) -> None:
    """Register ``slurm-shims`` on the gpuctl sub-command parser."""
    parser = add_verb(subparsers, "slurm-shims", help="write Slurm command shims (sbatch, squeue, ...) into a directory",
                      description=DESCRIPTION, examples=EXAMPLES, func=run)
    parser.add_argument("--dir", default=None, metavar="DIR", help="where to write them (default ~/.local/bin)")
    parser.add_argument("--force", action="store_true", help="replace files of the same name gpuctl did not write")


def shim_text(command: str, python: str = sys.executable) -> str:
    """The executable for Slurm command ``command``: this Python running gpud's version of it."""
    return (f"#!{python}\n{MARK}\nimport sys\n\nfrom gpud.cli.slurm import run\n\n"
            f"sys.exit(run({command!r}, sys.argv[1:]))\n")


def write_shims(directory: str, force: bool = False) -> list[str]:
    """Write every shim into ``directory`` (made if missing); returns their paths.

    Raises UsageError, writing nothing, when a file there of the same name
    was not written by gpuctl and ``force`` is not given.
    """
    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, name) for name in COMMANDS]
    if not force:
        foreign = [p for p in paths if os.path.exists(p) and not _ours(p)]
        if foreign:
            raise UsageError(f"{', '.join(foreign)} already exist{'s' if len(foreign) == 1 else ''} and were not "
                             f"written by gpuctl; use --force to replace them, or another --dir")
    for path, name in zip(paths, COMMANDS):
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(shim_text(name))
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    return paths


def _ours(path: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return MARK in f.read(4096)
    except OSError:
        return False


def run(args: argparse.Namespace) -> int:
    """Write the shims and say where, and whether that directory is on PATH."""
    directory = os.path.abspath(os.path.expanduser(args.dir or "~/.local/bin"))
    write_shims(directory, args.force)
    print(f"wrote {', '.join(COMMANDS)} into {directory}")
    on_path = [os.path.abspath(p) for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    if directory not in on_path:
        print(f"put it first on PATH to use them: export PATH={directory}:$PATH")
    return 0
