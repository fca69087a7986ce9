"""``gpuctl``: the command users and admins type."""

from __future__ import annotations

import sys

from gpud.cli.common import ENVIRONMENT_HELP, EXIT_STATUS_HELP, EXIT_USAGE

TYPE_CHECKING = False  # argparse is imported only when a command line needs it
if TYPE_CHECKING:
    import argparse

# Each verb and the module that registers it, in the order `gpuctl --help` lists them.
VERBS = {
    "submit": "submit_cmd", "run": "run_cmd", "attach": "run_cmd", "forward": "run_cmd", "notebook": "run_cmd",
    "queue": "queue_cmd", "history": "queue_cmd", "show": "job_cmd", "why": "job_cmd",
    "cancel": "job_cmd", "hold": "job_cmd", "release": "job_cmd", "requeue": "job_cmd", "logs": "logs_cmd",
    "nodes": "nodes_cmd", "drain": "nodes_cmd", "resume": "nodes_cmd", "projects": "projects_cmd", "policy": "projects_cmd",
    "usage": "usage_cmd", "report": "usage_cmd",
    "token": "auth_cmd", "whoami": "auth_cmd", "simulate": "simulate_cmd", "slurm-shims": "shims_cmd",
    "checkpointed": "checkpoint_cmd",
}
# The verbs a shell loop calls: each module declares the verb as ``VERB`` (gpud.cli.options.Verb), whose quick
# reader takes a plain command line without argparse.
QUICK = {"submit": "submit_cmd", "queue": "queue_cmd"}

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
    only its parsers are built (each parser argparse builds costs a call about
    half a millisecond), so a plain call stays fast; without one, every verb
    is there for the help and for naming the verbs a mistyped one is not.
    """
    import importlib

    from gpud import __version__
    from gpud.cli.parsing import Parser, TopFormatter
    parser = Parser(
        prog="gpuctl", description="Submit, watch and plan GPU jobs on a gpud cluster.", epilog=EPILOG,
        formatter_class=TopFormatter)
    parser.add_argument("--version", action="version", version=f"gpuctl {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    modules = [VERBS[verb]] if verb in VERBS else list(dict.fromkeys(VERBS.values()))
    for name in modules:
        importlib.import_module(f"gpud.cli.{name}").add_parsers(subparsers)
    return parser


def command_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The parser of the command ``argv`` names: gpuctl's own, a verb's, or a verb's sub-verb's."""
    import argparse
    words = (arg for arg in argv if not arg.startswith("-"))
    current = parser
    while True:
        verbs = next((a for a in current._actions if isinstance(a, argparse._SubParsersAction)), None)
        word = next(words, None) if verbs is not None else None
        if verbs is None or word not in verbs.choices:
            return current
        current = verbs.choices[word]


def unknown_arguments(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """What is wrong with arguments the command does not take, naming the closest option it has."""
    unknown = [arg for arg in extras if arg.startswith("-")]
    if not unknown:
        return f"unexpected argument{'s' if len(extras) > 1 else ''}: {' '.join(extras)}"
    import difflib
    name = unknown[0].split("=", 1)[0]
    spelled = {option: action for action in parser._actions for option in action.option_strings}
    close = difflib.get_close_matches(name, [o for o in spelled if o.startswith("--")], n=1, cutoff=0.6)
    hint = f" (did you mean {'/'.join(spelled[close[0]].option_strings)}?)" if close else ""
    return f"unknown option {name}{hint}"


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the sub-command; returns the exit status.

    Everything after the first ``--`` is the command of ``gpuctl submit``,
    passed on untouched, so its own options never reach gpuctl's parser.
    """
    argv, command = split_command(list(sys.argv[1:] if argv is None else argv))
    verb = next((arg for arg in argv if not arg.startswith("-")), None)
    if verb is not None and any(arg in ("-h", "--help") for arg in argv[:argv.index(verb)]):
        verb = None  # `gpuctl -h submit` is gpuctl's own help, which lists every verb
    args = quick_parse(argv)
    if args is not None and (command is None or getattr(args, "takes_command", False)):
        if command is not None:
            args.command_argv = command
        return _run(args)
    parser = build_parser(verb)
    args, extras = parser.parse_known_args(argv)
    if extras:
        owner = command_parser(parser, argv)
        owner.error(unknown_arguments(owner, extras))
    if not hasattr(args, "func"):
        getattr(args, "help_of", parser).print_help()
        return EXIT_USAGE
    if command is not None:
        if not getattr(args, "takes_command", False):
            parser.error("only `gpuctl submit` and `gpuctl run` take a command after -- "
                         "(and `gpuctl notebook` Jupyter's options)")
        args.command_argv = command
    return _run(args)


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """gpuctl's own words, and the command after the first ``--`` (None without one)."""
    if "--" not in argv:
        return argv, None
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def quick_parse(argv: list[str]):
    """The namespace of a plain command line of a verb in QUICK (``argv`` cut before ``--``), read without
    argparse; None for any other, which argparse reads."""
    if not argv or argv[0] not in QUICK:
        return None
    # __import__ rather than importlib.import_module: importlib's package imports warnings, a cost of every call.
    return __import__(f"gpud.cli.{QUICK[argv[0]]}", fromlist=["VERB"]).VERB.quick_parse(argv[1:])


def _run(args) -> int:
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
