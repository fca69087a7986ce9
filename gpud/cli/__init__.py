"""Command-line entry points: ``gpud`` for daemons and admins, ``gpuctl`` for users."""

from __future__ import annotations

import argparse


def dispatch(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse ``argv`` and run the chosen sub-command; with none, print the help and return 2."""
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    return args.func(args)
