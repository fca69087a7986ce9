"""gpuctl's and gpud's argparse classes: help laid out for the terminal, errors in two short lines."""

from __future__ import annotations

import argparse
import functools
import os
import sys

TYPE_CHECKING = False  # typing costs every gpuctl call ~2 ms; NoReturn is needed only by type checkers
if TYPE_CHECKING:
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
