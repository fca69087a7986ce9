"""Reasons for people, worded only when someone reads them: a cycle gives thousands, few are read."""

from __future__ import annotations

from typing import Any, Callable, Union


class Deferred:
    """Words put together when first read, by a function from the values it was given.

    The values are taken when the reason is given (numbers, immutable
    amounts, names), so a reading after the cycle says what was true then.
    The words are never empty: an empty reason is the plain "".
    """

    __slots__ = ("_say", "_args", "_text")

    def __init__(self, say: Callable[..., str], *args: Any) -> None:
        self._say = say
        self._args = args
        self._text: str | None = None

    def __str__(self) -> str:
        if self._text is None:
            self._text = self._say(*self._args)
        return self._text

    def __repr__(self) -> str:
        return f"Deferred({str(self)!r})"


Text = Union[str, Deferred]  # a reason as the core keeps it: read it with str()
