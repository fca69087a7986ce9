"""gpuctl's argparse side: the help layout, two-line errors, one-line usage, and a verb's parser."""

from __future__ import annotations

import argparse
import functools
import os
import sys

from gpud.cli.common import ENVIRONMENT_HELP, EXIT_STATUS_HELP

TYPE_CHECKING = False  # typing is not imported at run time: gpuctl starts faster
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn


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


class TopFormatter(Formatter):
    """gpuctl's own help: every verb beside its help, the longest (``checkpointed``) too.

    argparse measures the verbs at the indent of their section, and lays them
    out two columns further in: without the two, the longest wraps.
    """

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction):
            self._action_max_length += 2


def verb_parser(subparsers, name: str, *, help: str, description: str, examples: str) -> argparse.ArgumentParser:
    """A verb's parser on gpuctl's sub-command parsers: its description, and an epilog of examples."""
    return subparsers.add_parser(
        name, help=help, description=description,
        epilog=f"examples:\n{examples.rstrip()}\n\n{EXIT_STATUS_HELP}\n{ENVIRONMENT_HELP}",
        formatter_class=Formatter)


def add_verb(subparsers, name: str, *, help: str, description: str, examples: str,
             func: Callable[[argparse.Namespace], int], json_flag: bool = False) -> argparse.ArgumentParser:
    """Register one verb with a description, an epilog of examples, and optionally ``--json``; returns its parser,
    to which the verb adds its own arguments."""
    from gpud.cli.options import Verb
    return Verb(name, help=help, description=description, examples=examples, func=func,
                json_flag=json_flag).add_to(subparsers)
