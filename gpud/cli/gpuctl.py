"""``gpuctl``: the command users and admins type."""

from __future__ import annotations

import argparse
import sys

from gpud import __version__
from gpud.cli import dispatch
from gpud.cli import simulate_cmd


def build_parser() -> argparse.ArgumentParser:
    """The gpuctl argument parser with every sub-command."""
    parser = argparse.ArgumentParser(
        prog="gpuctl", description="Submit, watch and plan GPU jobs on a gpud cluster.")
    parser.add_argument("--version", action="version", version=f"gpuctl {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    simulate_cmd.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the sub-command; returns the exit status."""
    return dispatch(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
