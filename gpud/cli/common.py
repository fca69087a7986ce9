"""What every gpuctl verb that talks to the controller shares: the client, errors as exit codes, --json."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable

TYPE_CHECKING = False  # typing is not imported at run time: gpuctl starts faster
if TYPE_CHECKING:
    from typing import NoReturn

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3

EXIT_STATUS_HELP = """\
exit status: 0 ok, 1 the controller refused the request (4xx), 2 usage error,
3 cannot reach the controller or it failed (5xx)."""

ENVIRONMENT_HELP = """\
environment: GPUD_URL (default http://127.0.0.1:6830), GPUD_TOKEN, GPUD_TIMEOUT
(seconds, default 30), GPUD_RETRY (seconds reads and submits wait for a
controller that refuses connections, default 10, 0: none); otherwise url and
token or token_file in $XDG_CONFIG_HOME/gpud/client.toml."""


class Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help layout, told the terminal's width so that it does not import shutil to ask (~2 ms a call)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None):
        super().__init__(prog, indent_increment, max_help_position, width if width is not None else _columns() - 2)

    def add_argument(self, action: argparse.Action) -> None:
        """As argparse's, but a sub-command's name counts with the indent it is shown at, so none wraps."""
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction):
            names = [len(self._format_action_invocation(sub)) for sub in action._get_subactions()]
            shown = max(names, default=0) + self._current_indent + self._indent_increment
            self._action_max_length = max(self._action_max_length, shown)


@functools.cache
def _columns() -> int:
    """The terminal's width as shutil.get_terminal_size finds it: $COLUMNS, then stdout's terminal, then 80."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]  # None: caught
    except (AttributeError, ValueError, OSError):
        return 80


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are two short lines: the error, then the usage in one line."""

    def error(self, message: str) -> NoReturn:
        """Print the error and a one-line usage to stderr; exit 2."""
        self.exit(2, f"{self.prog}: error: {message}\n{short_usage(self)}\n")


def short_usage(parser: argparse.ArgumentParser) -> str:
    """The command's usage in one line: its positionals and required options, "[options]" for the rest,
    and where the whole help is."""
    words = [parser.prog]
    optional = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            words.append("COMMAND")
        elif not action.option_strings:
            name = action.metavar if isinstance(action.metavar, str) else action.dest
            words.append({"?": f"[{name}]", "*": f"[{name} ...]", "+": f"{name} [{name} ...]"}.get(
                str(action.nargs), name))
        elif action.required:
            words.append(f"{action.option_strings[-1]} {action.metavar or action.dest.upper()}")
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            optional = True
    if optional:
        words.insert(1, "[options]")
    if parser.get_default("takes_command"):
        words.append("[-- COMMAND ...]")
    return f"usage: {' '.join(words)}; see `{parser.prog} --help`"


class UsageError(Exception):
    """A command line or input file gpuctl refuses before asking the controller (exit 2)."""


def add_verb(subparsers, name: str, *, help: str, description: str, examples: str,
             func: Callable[[argparse.Namespace], int], json_flag: bool = False) -> argparse.ArgumentParser:
    """Register one verb with a description, an epilog of examples, and optionally ``--json``."""
    parser = subparsers.add_parser(
        name, help=help, description=description,
        epilog=f"examples:\n{examples.rstrip()}\n\n{EXIT_STATUS_HELP}\n{ENVIRONMENT_HELP}",
        formatter_class=Formatter)
    if json_flag:
        parser.add_argument("--json", action="store_true", help="print the controller's JSON answer")
    parser.set_defaults(func=_guarded(parser.prog.removeprefix("gpuctl "), func))  # "policy reload", as typed
    return parser


def _guarded(verb: str, func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        from gpud.client import ClientError
        try:
            return func(args)
        except UsageError as exc:
            print(f"gpuctl {verb}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except ClientError as exc:
            print(f"gpuctl {verb}: {exc}", file=sys.stderr)
            return exc.exit_code
        except BrokenPipeError:  # `gpuctl queue | head` closes the pipe early; that is not an error
            sys.stderr.close()
            return EXIT_OK
    return run


def client():
    """A client for the controller named by GPUD_URL/GPUD_TOKEN or the client config file."""
    from gpud.client import Client
    return Client.from_environment()


def print_json(doc: object) -> None:
    """Print a JSON document, indented, as the API sent it."""
    import json
    print(json.dumps(doc, indent=2, sort_keys=False))


def _naming(job_id: str, error: Exception) -> str:
    """The error's message with the job it is about named once: prefixed with "job ID: " unless the
    controller says its message names a job."""
    return str(error) if getattr(error, "job", None) is not None else f"job {job_id}: {error}"


def for_each(verb: str, ids: list[str], action: Callable[[str], object]) -> int:
    """Run ``action`` on every id, go on past failures (each printed), return the worst exit status."""
    from gpud.client import ClientError
    status = EXIT_OK
    for job_id in ids:
        try:
            action(job_id)
        except ClientError as exc:
            if exc.exit_code == EXIT_UNREACHABLE:
                raise  # the next ids would fail the same way
            print(f"gpuctl {verb}: {_naming(job_id, exc)}", file=sys.stderr)
            status = max(status, exc.exit_code)
    return status
