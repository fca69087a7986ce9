"""``#GPUD`` directive lines at the top of a batch script, read the way sbatch reads ``#SBATCH``."""

# Annotations are evaluated as written (no `from __future__ import annotations`): typing.NamedTuple would
# compile() each field's annotation text, and a process's first compile() builds every type of the ast
# module, over 10 M instructions (a quarter of Python's start-up) in each sbatch or gpuctl submit SCRIPT.
import argparse
import shlex
from typing import NamedTuple

PREFIX = "#GPUD"


class DirectiveError(ValueError):
    """A directive that cannot be read; the message names the script and the line."""


class Directive(NamedTuple):
    """One ``#GPUD`` line: its 1-based line number and its options split as a shell would."""

    line: int
    args: tuple[str, ...]


def read_directives(text: str, source: str = "script", prefix: str = PREFIX) -> list[Directive]:
    """The ``#GPUD`` lines (or lines of another ``prefix``, such as ``#SBATCH``) of a script, in order.

    As with ``#SBATCH``, directives are read from the top of the script
    (after the ``#!`` line) until the first line that is neither blank nor a
    comment; a ``#GPUD`` further down is an ordinary comment. Options on a
    line are split with shell quoting, and ``# ...`` after them is a comment.
    Unbalanced quotes raise DirectiveError naming ``source`` and the line.
    """
    directives = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if number == 1 and line.startswith("#!"):
            continue
        if not line:
            continue
        if not line.startswith("#"):
            break
        head, *rest = line.split(None, 1)
        if head != prefix:
            continue
        try:
            args = shlex.split(rest[0] if rest else "", comments=True)
        except ValueError as exc:
            raise DirectiveError(f"{source}, line {number}: {exc}") from None
        if args:
            directives.append(Directive(number, tuple(args)))
    return directives


class _Refused(Exception):
    pass


def parse_directives(parser: argparse.ArgumentParser, directives: list[Directive],
                     source: str = "script") -> argparse.Namespace:
    """Parse every directive's options with ``parser`` into one namespace.

    Later lines override earlier ones and repeatable options accumulate,
    exactly as if all lines were one command line. Any option the parser
    refuses (unknown, bad value, a stray argument) raises DirectiveError
    naming ``source`` and the line. ``parser`` should have no positionals.
    """
    namespace = argparse.Namespace()
    original_error = parser.error

    def refuse(message: str):
        raise _Refused(message)

    # argparse reports every problem through error(); make it raise, not exit (mypy refuses any method
    # assignment, which is the point here).
    parser.error = refuse  # type: ignore[method-assign]
    try:
        for directive in directives:
            try:
                parser.parse_args(list(directive.args), namespace)
            except _Refused as exc:
                raise DirectiveError(f"{source}, line {directive.line}: {exc}") from None
    finally:
        parser.error = original_error  # type: ignore[method-assign]
    return namespace
