"""Command-line entry points: ``gpud`` for daemons and admins, ``gpuctl`` for users."""

from __future__ import annotations

TYPE_CHECKING = False  # argparse is imported by the commands that build a parser, not by gpuctl's quick path
if TYPE_CHECKING:
    import argparse


def dispatch(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse ``argv`` and run the chosen sub-command; with none, print the help and return 2."""
    import argparse
    import sys
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extras = parser.parse_known_args(argv)
    if extras:  # said by the sub-command's parser, whose usage is the one that helps
        verbs = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        word = next((a for a in argv if not a.startswith("-")), None)
        owner = verbs.choices.get(word, parser) if verbs is not None and word is not None else parser
        owner.error(f"unrecognized arguments: {' '.join(extras)}")
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    return args.func(args)
