"""A verb's command line declared once, as data: argparse is built from it for help, usage and every error, and
``Options.quick_parse`` reads the common command lines from it without importing argparse.

argparse and what it pulls in (re, gettext, locale) cost a gpuctl call more than Python's own start-up, and
a shell loop of ``gpuctl submit`` pays that on every job. The quick reader takes only command lines whose
meaning is plain: exact option names, values that cannot be options, no help; anything else (an
abbreviation, an unknown option, a bad value, a stray word, ``-h``) it declines, and argparse reads the same
words, so users see exactly what argparse says. Where it answers, its namespace equals argparse's (a
property test holds it to that).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: gpuctl starts faster
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from typing import Any

# The actions the quick reader knows, with the number of values each takes; any other makes it decline.
_QUICK_ACTIONS = {"store": 1, "append": 1, "store_true": 0, "store_false": 0, "store_const": 0}
# The keywords of add_argument that do not change what a command line means.
_WORDING = frozenset(("help", "metavar"))


class Namespace:
    """What a command line set, as argparse.Namespace holds it: attributes, equal to a namespace of the same ones."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)

    def __eq__(self, other: object) -> bool:
        return vars(self) == vars(other) if hasattr(other, "__dict__") else NotImplemented

    def __contains__(self, key: str) -> bool:
        return key in self.__dict__

    if TYPE_CHECKING:  # as argparse.Namespace is typed: any attribute a command line may set
        def __getattr__(self, name: str) -> Any: ...

        def __setattr__(self, name: str, value: Any) -> None: ...

    def __repr__(self) -> str:
        return f"Namespace({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


class _Argument:
    """One add_argument call: its words and keywords as given, and what argparse derives from them."""

    __slots__ = ("flags", "kwargs", "dest", "action", "default", "quick")

    def __init__(self, flags: tuple[str, ...], kwargs: dict[str, Any], default: Any) -> None:
        self.flags, self.kwargs = flags, kwargs
        self.action = kwargs.get("action", "store")
        positional = len(flags) == 1 and not flags[0].startswith("-")
        if positional:
            self.dest = flags[0]
        else:  # argparse's rule: the first long option, else the first short one, '-' read as '_'
            named = next((f for f in flags if f.startswith("--")), flags[0])
            self.dest = kwargs.get("dest") or named.lstrip("-").replace("-", "_")
        if "default" in kwargs:
            default = kwargs["default"]
        elif self.action == "store_true":
            default = False
        elif self.action == "store_false":
            default = True
        self.default = default
        known = {"action", "type", "const", "default", "dest"} | _WORDING | ({"nargs"} if positional else set())
        self.quick = (self.action in _QUICK_ACTIONS and set(kwargs) <= known
                      and (not positional or kwargs.get("nargs") in (None, "?"))
                      and all(f.startswith("--") or len(f) == 2 for f in flags if not positional))

    @property
    def positional(self) -> bool:
        return not self.flags[0].startswith("-")


class Options:
    """A command's arguments and defaults, recorded through argparse's own calls (``add_argument``,
    ``set_defaults``) so that one declaration serves both readers."""

    def __init__(self) -> None:
        self._arguments: list[_Argument] = []
        self._defaults: dict[str, Any] = {}
        self._calls: list[tuple[str, tuple, dict[str, Any]]] = []

    def add_argument(self, *flags: str, **kwargs: Any) -> None:
        """Record an argument exactly as ``argparse.ArgumentParser.add_argument`` takes it."""
        self._calls.append(("add_argument", flags, kwargs))
        argument = _Argument(flags, kwargs, None)
        if "default" not in kwargs and argument.dest in self._defaults:  # as argparse: set_defaults came first
            argument.default = self._defaults[argument.dest]
        self._arguments.append(argument)

    def set_defaults(self, **kwargs: Any) -> None:
        """Record defaults exactly as ``argparse.ArgumentParser.set_defaults`` takes them."""
        self._calls.append(("set_defaults", (), kwargs))
        self._defaults.update(kwargs)
        for argument in self._arguments:
            if argument.dest in kwargs:
                argument.default = kwargs[argument.dest]

    def apply(self, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Make the same calls on an argparse parser, in the same order; returns it."""
        for method, flags, kwargs in self._calls:
            getattr(parser, method)(*flags, **kwargs)
        return parser

    def quick_parse(self, argv: list[str], namespace: Namespace | None = None) -> Namespace | None:
        """The namespace argparse would make of ``argv`` (into ``namespace`` when given, as ``parse_args`` does),
        or None when the command line is not one of the plain ones read here.

        Never raises for a bad command line and never prints: whatever it
        declines, argparse reads (and refuses with its own message).
        """
        arguments = self._arguments
        # A string default argparse would pass through the argument's type: left to argparse.
        if not all(a.quick and not isinstance(a.default, str) for a in arguments):
            return None
        by_flag = {flag: a for a in arguments if not a.positional for flag in a.flags}
        positionals = [a for a in arguments if a.positional]
        namespace = Namespace() if namespace is None else namespace
        for argument in arguments:
            if not hasattr(namespace, argument.dest):
                setattr(namespace, argument.dest, argument.default)
        for dest, default in self._defaults.items():
            if not hasattr(namespace, dest):
                setattr(namespace, dest, default)
        index = 0
        while index < len(argv):
            word = argv[index]
            index += 1
            if not _option_like(word):
                if not positionals or not _take(namespace, positionals.pop(0), word):
                    return None  # a stray word or a bad value: argparse names it
                continue
            taken = _read_option(namespace, by_flag, word, argv[index] if index < len(argv) else None)
            if taken is None:
                return None
            index += taken
        for argument in positionals:  # not given: argparse's "required" error, or the default of an optional one
            if argument.kwargs.get("nargs") != "?":
                return None
            setattr(namespace, argument.dest, argument.default)
        return namespace


def _read_option(namespace: Namespace, by_flag: dict[str, _Argument], word: str, following: str | None) -> int | None:
    """Act on the option ``word`` (the next word on the line is ``following``): how many more words it took,
    0 or 1, or None when the quick reader leaves the line to argparse."""
    if word.startswith("--"):
        flag, equals, given = word.partition("=")
        value = given if equals else None
    elif "=" in word:
        return None  # -p=x: read differently by Python versions; argparse decides
    else:
        flag, value = word[:2], word[2:] or None
    option = by_flag.get(flag)
    if option is None:
        return None  # unknown, abbreviated or -h: argparse's to say
    if _QUICK_ACTIONS[option.action] == 0:
        if value is not None:
            return None  # a switch given a value, or several short switches glued: argparse's to say
        setattr(namespace, option.dest, {"store_true": True, "store_false": False}.get(
            option.action, option.kwargs.get("const")))
        return 0
    if value is not None:
        return 0 if _take(namespace, option, value) else None
    if following is None or _option_like(following):
        return None  # a missing value
    return 1 if _take(namespace, option, following) else None


def _option_like(word: str) -> bool:
    """Whether ``word`` may be taken for an option: all but the plainest words starting with '-' go to argparse."""
    return word.startswith("-") and word != "-"


def _take(namespace: Namespace, argument: _Argument, text: str) -> bool:
    """Store one value as argparse's action would; False when its type refuses it (argparse then says why)."""
    convert = argument.kwargs.get("type")
    try:
        value = convert(text) if convert is not None else text
    except Exception:
        return False
    if argument.action == "append":
        setattr(namespace, argument.dest, [*(getattr(namespace, argument.dest, None) or []), value])
    else:
        setattr(namespace, argument.dest, value)
    return True


class Verb(Options):
    """A gpuctl verb declared as data: its name, help texts, function and options; ``add_to`` registers it with
    argparse, ``quick_parse`` reads a plain command line of it without argparse."""

    def __init__(self, name: str, *, help: str, description: str, examples: str,
                 func: Callable[[Any], int], json_flag: bool = False) -> None:
        super().__init__()
        from gpud.cli.common import guarded
        self.name, self.help, self.description, self.examples = name, help, description, examples
        self._func = func
        self.run = guarded(name, func)
        if json_flag:
            self.add_argument("--json", action="store_true", help="print the controller's JSON answer")
        self.set_defaults(func=self.run)

    def add_to(self, subparsers: Any) -> argparse.ArgumentParser:
        """Register the verb and its options on gpuctl's sub-command parsers; returns its parser."""
        from gpud.cli.common import guarded
        from gpud.cli.parsing import verb_parser
        parser = self.apply(verb_parser(subparsers, self.name, help=self.help, description=self.description,
                                        examples=self.examples))
        as_typed = parser.prog.removeprefix("gpuctl ")
        if as_typed != self.name:  # a sub-verb ("policy reload") names itself as typed in its errors
            parser.set_defaults(func=guarded(as_typed, self._func))
        return parser
