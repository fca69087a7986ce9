"""A reader for TOML files that are only ``key = "string"`` lines, such as gpuctl's client config.

``tomllib`` costs every gpuctl call about 10 ms to import; a client config
written by ``gpud up`` or by hand is a few string keys. Anything beyond that
subset makes ``read_simple`` answer None, and the caller reads the file with
``tomllib``, so no TOML is ever read differently.
"""

from __future__ import annotations

_BARE_KEY = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def read_simple(text: str) -> dict[str, str] | None:
    """The keys and string values of ``text``, or None when it is not only bare keys with one-line strings.

    Accepted: blank lines, comments, ``key = "basic string"`` without
    escapes and ``key = 'literal string'``, each optionally followed by a
    comment. Where it answers, the answer equals ``tomllib.loads(text)``.
    """
    if "\r" in text:
        return None
    out: dict[str, str] = {}
    for line in text.split("\n"):
        stripped = line.strip(" \t")
        if not stripped or stripped.startswith("#"):
            if _controls(stripped):
                return None
            continue
        key, equals, rest = stripped.partition("=")
        key, rest = key.strip(" \t"), rest.strip(" \t")
        if not equals or not key or not set(key) <= _BARE_KEY or key in out:
            return None
        if len(rest) < 2 or rest[0] not in "\"'" or rest.startswith(rest[0] * 3):
            return None
        end = rest.find(rest[0], 1)
        if end < 0:
            return None
        value, tail = rest[1:end], rest[end + 1:].strip(" \t")
        if (tail and not tail.startswith("#")) or (rest[0] == '"' and "\\" in value):
            return None
        if _controls(value) or _controls(tail):
            return None
        out[key] = value
    return out


def _controls(text: str) -> bool:
    """True when ``text`` holds a control character TOML does not allow there (tab is allowed)."""
    return any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in text)
