"""A plain command line read without argparse, from the same ``add_argument`` calls.

argparse imports re and gettext, and builds a parser per verb: together more
than Python's own start-up, on every gpuctl call. A verb's arguments are
declared once, by calls to ``add_argument``; an :class:`OptionTable` takes
those calls and reads the command lines whose meaning is plain: options spelled
out in full (``--gpus 1``, ``--gpus=1``, ``-p vision``), switches, and at most
the one positional the verb takes. For anything else (``--help``, an
abbreviated or unknown option, ``-pvision``, a value that starts with ``-``, a
value its type refuses, a second positional) it answers None, and argparse
reads the line, with its own messages. Where it answers, the answer is what
argparse would give (tests/test_quickparse.py checks that on random lines).
"""

from __future__ import annotations

from types import SimpleNamespace

TYPE_CHECKING = False  # typing costs every gpuctl call ~2 ms; its names are needed only by type checkers
if TYPE_CHECKING:
    from typing import Any

_TAKES_VALUE = ("store", "append")
_NO_VALUE = ("store_true", "store_false", "store_const")


class _Unsure(Exception):
    """The line is not plain enough to read here: argparse is to read it."""


class OptionTable:
    """The arguments of one verb, recorded from the ``add_argument`` calls that declare them for argparse."""

    def __init__(self) -> None:
        self.options: dict[str, tuple[str, str, Any, Any]] = {}  # "--gpus": (dest, action, type, const)
        self.positional: tuple[str, Any] | None = None  # (dest, type) of the one optional positional
        self.defaults: dict[str, Any] = {}
        self.complete = True  # False once a call declares what this table does not read

    def add_argument(self, *flags: str, **kwargs: Any) -> None:
        """Record an argument as ``argparse.ArgumentParser.add_argument`` takes it."""
        action = kwargs.get("action", "store")
        known = {"action", "type", "const", "default", "help", "metavar", "dest", "nargs"}
        if set(kwargs) - known or (action in _TAKES_VALUE and "const" in kwargs) or \
                action not in _TAKES_VALUE + _NO_VALUE or kwargs.get("nargs") not in (None, "?"):
            self.complete = False
            return
        if not flags[0].startswith("-"):
            if self.positional is not None or kwargs.get("nargs") != "?":
                self.complete = False
                return
            self.positional = (flags[0], kwargs.get("type"))
            self.defaults.setdefault(flags[0], kwargs.get("default"))
            return
        if "nargs" in kwargs:
            self.complete = False
            return
        long = next((flag for flag in flags if flag.startswith("--")), flags[0])
        dest = kwargs.get("dest") or long.lstrip("-").replace("-", "_")
        default = kwargs.get("default", {"store_true": False, "store_false": True}.get(action))
        if (isinstance(default, str) and kwargs.get("type") is not None) or (action == "append" and default is not None):
            self.complete = False  # argparse would convert or copy it; no verb read here has one
            return
        self.defaults.setdefault(dest, default)
        for flag in flags:
            self.options[flag] = (dest, action, kwargs.get("type"), kwargs.get("const"))

    def set_defaults(self, **kwargs: Any) -> None:
        """Values every parse starts from, as ``argparse.ArgumentParser.set_defaults`` sets them."""
        self.defaults.update(kwargs)

    def parse(self, argv: list[str]) -> SimpleNamespace | None:
        """The namespace argparse would make of ``argv``, or None when argparse is to read it."""
        if not self.complete:
            return None
        try:
            return SimpleNamespace(**{**self.defaults, **self._values(argv)})
        except _Unsure:
            return None

    def _values(self, argv: list[str]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        words = iter(argv)
        positional_seen = False
        for word in words:
            if word.startswith("-") and word != "-":
                name, equals, given = word.partition("=") if word.startswith("--") else (word, "", "")
                if name not in self.options:
                    raise _Unsure
                dest, action, convert, const = self.options[name]
                if action in _NO_VALUE:
                    if equals:
                        raise _Unsure
                    values[dest] = {"store_true": True, "store_false": False}.get(action, const)
                    continue
                if not equals:
                    given = next(words, "-")
                    if given.startswith("-"):
                        raise _Unsure
                value = _converted(convert, given)
                if action == "append":
                    values[dest] = [*(values.get(dest) or []), value]
                else:
                    values[dest] = value
            elif self.positional is not None and not positional_seen:
                positional_seen = True
                values[self.positional[0]] = _converted(self.positional[1], word)
            else:
                raise _Unsure
        return values


def _converted(convert: Any, text: str) -> Any:
    if convert is None:
        return text
    try:
        return convert(text)
    except Exception:  # argparse says what is wrong with it, in its own words
        raise _Unsure from None
