"""``#GPUD`` directive lines at the top of a batch script, read the way sbatch reads ``#SBATCH``."""

from __future__ import annotations

TYPE_CHECKING = False  # neither typing nor argparse is imported at run time: sbatch starts faster
if TYPE_CHECKING:
    import argparse

PREFIX = "#GPUD"
_SHELL_SPECIAL = frozenset("\"'\\")  # quoting: a line with any of them is split by shlex


class DirectiveError(ValueError):
    """A directive that cannot be read; the message names the script and the line."""


class Directive(tuple):
    """One ``#GPUD`` line: its 1-based line number and its options split as a shell would; a pair, as a named
    tuple (typing.NamedTuple costs sbatch an import of typing and re)."""

    __slots__ = ()

    def __new__(cls, line: int, args: tuple[str, ...]) -> Directive:
        return tuple.__new__(cls, (line, args))

    @property
    def line(self) -> int:
        return self[0]

    @property
    def args(self) -> tuple[str, ...]:
        return self[1]

    def __repr__(self) -> str:
        return f"Directive(line={self[0]!r}, args={self[1]!r})"


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
            args = split_words(rest[0] if rest else "")
        except ValueError as exc:
            raise DirectiveError(f"{source}, line {number}: {exc}") from None
        if args:
            directives.append(Directive(number, tuple(args)))
    return directives


def split_words(text: str) -> list[str]:
    """``shlex.split(text, comments=True)``: a line without quotes or backslashes is split here (at spaces, tabs
    and line ends, up to a ``#``), any other by shlex, which imports re."""
    if _SHELL_SPECIAL.isdisjoint(text):
        words = " ".join(line.partition("#")[0] for line in text.split("\n"))  # a comment ends with its line
        return [word for word in words.replace("\t", " ").replace("\r", " ").split(" ") if word]
    import shlex
    return shlex.split(text, comments=True)


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
    import argparse
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
