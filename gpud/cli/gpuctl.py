"""``gpuctl``: the command users and admins type."""

from __future__ import annotations

import argparse
import importlib
import sys

from gpud import __version__
from gpud.cli.common import ENVIRONMENT_HELP, EXIT_STATUS_HELP, EXIT_USAGE

# Each verb and the module that registers it, in the order `gpuctl --help` lists them.
VERBS = {
    "submit": "submit_cmd", "queue": "queue_cmd", "history": "queue_cmd", "show": "job_cmd", "why": "job_cmd",
    "cancel": "job_cmd", "hold": "job_cmd", "release": "job_cmd", "logs": "logs_cmd", "nodes": "nodes_cmd",
    "drain": "nodes_cmd", "resume": "nodes_cmd", "projects": "projects_cmd", "policy": "projects_cmd",
    "token": "auth_cmd", "whoami": "auth_cmd", "simulate": "simulate_cmd",
}

EPILOG = f"""\
examples:
  gpuctl submit -p vision --gpus 1 -- python train.py
  gpuctl queue --me
  gpuctl why 42
  gpuctl logs 42 -f

Run `gpuctl COMMAND --help` for a command's options and examples.

{EXIT_STATUS_HELP}
{ENVIRONMENT_HELP}
"""


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The gpuctl argument parser with every sub-command.

    Given the ``verb`` about to run, only that verb's module is imported and
    the other verbs are bare names, so a plain call stays fast.
    """
    parser = argparse.ArgumentParser(
        prog="gpuctl", description="Submit, watch and plan GPU jobs on a gpud cluster.", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"gpuctl {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    modules = [VERBS[verb]] if verb in VERBS else list(dict.fromkeys(VERBS.values()))
    for name in modules:
        importlib.import_module(f"gpud.cli.{name}").add_parsers(subparsers)
    for name in VERBS:
        if name not in subparsers.choices:
            subparsers.add_parser(name)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the sub-command; returns the exit status.

    Everything after the first ``--`` is the command of ``gpuctl submit``,
    passed on untouched, so its own options never reach gpuctl's parser.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    command = None
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    verb = next((arg for arg in argv if not arg.startswith("-")), None)
    parser = build_parser(verb)
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        getattr(args, "help_of", parser).print_help()
        return EXIT_USAGE
    if command is not None:
        if not getattr(args, "takes_command", False):
            parser.error("only `gpuctl submit` takes a command after --")
        args.command_argv = command
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
