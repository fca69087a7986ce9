"""Reading TOML files and tables with checks whose errors name the file, the table and the key."""

from __future__ import annotations

import copy
import difflib
import json
import math
import os
import re
import tomllib
from typing import Any, Callable, Iterable, Mapping

from gpud.errors import ConfigError

MAX_FILE_BYTES = 16 * 1024 * 1024
REQUIRED: Any = object()
_POSITION = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)\s*$")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


MAX_DEPTH = 32  # no gpud file nests nearly this deep; deeper is a mistake or an attack


def read_toml(path: str | os.PathLike) -> tuple[dict, str]:
    """Read and parse a TOML file, returning its data and its name for messages.

    A missing, unreadable, oversized or non-UTF-8 file and a TOML syntax error
    (with its line and column) are all ConfigErrors naming the file.
    """
    source = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(source, "", f"cannot read the file: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(source, "", f"the file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(source, "", f"not UTF-8 text (bad byte at offset {exc.start})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise syntax_error(source, exc) from None
    except RecursionError:
        raise ConfigError(source, "", f"tables and arrays nest more than {MAX_DEPTH} levels deep") from None
    if _depth(data) > MAX_DEPTH:
        raise ConfigError(source, "", f"tables and arrays nest more than {MAX_DEPTH} levels deep")
    return data, source


def _depth(value: Any) -> int:
    """How deep tables and arrays nest in ``value`` (walked without recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= MAX_DEPTH:
            stack.extend((child, level + 1) for child in children)
    return deepest


def syntax_error(source: str, exc: tomllib.TOMLDecodeError) -> ConfigError:
    """Turn a tomllib error, whose message ends with its position, into a ConfigError naming the line."""
    message = str(exc)
    match = _POSITION.search(message)
    if match is None:
        return ConfigError(source, "", f"TOML syntax error: {message}")
    where = f"line {match[1]}, column {match[2]}" if match[1] else "end of file"
    return ConfigError(source, where, f"TOML syntax error: {message[:match.start()]}")


def quote(text: str) -> str:
    """A name in double quotes, escaped as TOML and JSON write strings."""
    return json.dumps(text, ensure_ascii=False)


def key_path(where: str, key: str) -> str:
    """The dotted path of ``key`` inside the table at ``where``, quoting keys that are not bare."""
    part = key if _BARE_KEY.match(key) else quote(key)
    return f"{where}.{part}" if where else part


def describe(value: Any) -> str:
    """What a TOML value is, in the words a person reading the file uses."""
    if isinstance(value, bool):
        return f"a boolean ({'true' if value else 'false'})"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a float ({value})"
    if isinstance(value, str):
        shown = quote(value if len(value) <= 40 else value[:40] + "…")
        return f"a string ({shown})"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a date/time ({value})"


def fmt(value: float) -> str:
    """A number as a person would write it: 2 rather than 2.0."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def suggestion(name: str, known: Iterable[str]) -> str:
    """A "; did you mean ...?" hint for a misspelt name, or an empty string."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"; did you mean {quote(close[0])}?" if close else ""


def choices(known: Iterable[str]) -> str:
    """The known names, sorted and comma-separated, for a message."""
    names = sorted(known)
    return ", ".join(names) if names else "(none)"


def as_number(value: Any, source: str, where: str, *, lo: float | None = None,
              above: float | None = None, hi: float | None = None,
              expected: str = "a number") -> float:
    """Check that ``value`` is a finite number (not a boolean) within the bounds, and return it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(source, where, f"expected {expected}, got {describe(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(source, where, f"must be a finite number (got {value})")
    if lo == 0 and value < 0:
        raise ConfigError(source, where, f"must not be negative (got {fmt(value)})")
    if lo is not None and value < lo:
        raise ConfigError(source, where, f"must be at least {fmt(lo)} (got {fmt(value)})")
    if above is not None and value <= above:
        raise ConfigError(source, where, f"must be greater than {fmt(above)} (got {fmt(value)})")
    if hi is not None and value > hi:
        raise ConfigError(source, where, f"must be at most {fmt(hi)} (got {fmt(value)})")
    return value


def as_int(value: Any, source: str, where: str, *, lo: int | None = None, hi: int | None = None,
           expected: str = "an integer") -> int:
    """Check that ``value`` is an integer (not a boolean, not a float) within the bounds, and return it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(source, where, f"expected {expected}, got {describe(value)}")
    return int(as_number(value, source, where, lo=lo, hi=hi))


def as_str(value: Any, source: str, where: str, *, expected: str = "a string") -> str:
    """Check that ``value`` is a non-empty string, and return it."""
    if not isinstance(value, str):
        raise ConfigError(source, where, f"expected {expected}, got {describe(value)}")
    if not value:
        raise ConfigError(source, where, "must not be empty")
    return value


def as_list(value: Any, source: str, where: str, *, expected: str = "an array",
            limit: int = 1_000_000) -> list:
    """Check that ``value`` is an array of at most ``limit`` items, and return it."""
    if not isinstance(value, list):
        raise ConfigError(source, where, f"expected {expected}, got {describe(value)}")
    if len(value) > limit:
        raise ConfigError(source, where, f"has {len(value)} entries; at most {limit} are allowed")
    return value


def spotted(exc: ConfigError, container: Any, key: Any) -> ConfigError:
    """``exc``, marked as a mistake at ``container[key]`` unless a more precise spot is already known."""
    if exc.spot is None:
        exc.spot = (container, key)
    return exc


def every_mistake(check: Callable[[Any], Any], data: Any, limit: int = 100) -> list[ConfigError]:
    """Every mistake ``check`` finds in ``data`` (up to ``limit``), in order; empty when there is none.

    After each mistake its spot is set aside (the key dropped, the array
    entry skipped) in a copy of ``data`` and the check runs again, until it
    passes or finds a mistake it cannot step over.
    """
    try:
        data = copy.deepcopy(data)
    except RecursionError:
        data = None
    mistakes: list[ConfigError] = []
    while len(mistakes) < limit:
        try:
            check(data)
            return mistakes
        except ConfigError as exc:
            mistakes.append(exc)
            if data is None or not _set_aside(exc.spot):
                return mistakes
    return mistakes


def _set_aside(spot: tuple | None) -> bool:
    if spot is None:
        return False
    container, key = spot
    if isinstance(container, dict) and key in container:
        del container[key]
        return True
    if isinstance(container, list) and isinstance(key, int) and 0 <= key < len(container) \
            and container[key] is not None:
        container[key] = None   # TOML has no null: tables() skips it, and later entries keep their numbers
        return True
    return False


class Table:
    """One TOML table being read: unknown keys are refused, and every getter checks its type."""

    __slots__ = ("data", "source", "where")

    def __init__(self, data: Any, source: str, where: str, known: Iterable[str] | None) -> None:
        if not isinstance(data, dict):
            raise ConfigError(source, where, f"expected a table, got {describe(data)}")
        self.data = data
        self.source = source
        self.where = where
        if known is not None:
            self.check_keys(known)

    def check_keys(self, known: Iterable[str]) -> None:
        """Refuse a key not in ``known``, suggesting the closest known key."""
        known = tuple(known)
        for key in self.data:
            if key not in known:
                hint = suggestion(key, known) or f"; known keys: {', '.join(known)}"
                raise self.error(key, f"unknown key{hint}")

    def at(self, key: str) -> str:
        """The path of ``key`` in this table, for messages."""
        return key_path(self.where, key)

    def error(self, key: str, message: str) -> ConfigError:
        """A ConfigError about ``key`` of this table."""
        return spotted(ConfigError(self.source, self.at(key), message), self.data, key)

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def _get(self, key: str, default: Any) -> tuple[bool, Any]:
        if key in self.data:
            return True, self.data[key]
        if default is REQUIRED:
            raise self.error(key, "is required")
        return False, default

    def string(self, key: str, default: Any = REQUIRED) -> Any:
        """A non-empty string, or ``default`` when absent."""
        found, value = self._get(key, default)
        try:
            return as_str(value, self.source, self.at(key)) if found else value
        except ConfigError as exc:
            raise spotted(exc, self.data, key) from None

    def boolean(self, key: str, default: Any = REQUIRED) -> Any:
        """A boolean (true or false), or ``default`` when absent."""
        found, value = self._get(key, default)
        if found and not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {describe(value)}")
        return value

    def number(self, key: str, default: Any = REQUIRED, **bounds: Any) -> Any:
        """A finite number (integer or float) within ``bounds``, or ``default`` when absent."""
        found, value = self._get(key, default)
        try:
            return float(as_number(value, self.source, self.at(key), **bounds)) if found else value
        except ConfigError as exc:
            raise spotted(exc, self.data, key) from None

    def seconds(self, key: str, default: Any = REQUIRED) -> Any:
        """A duration of 0 or more seconds: a number of seconds, or a string such as "5m", "1.5h" or
        "1:30:00", as gpuctl takes times; ``default`` when absent."""
        found, value = self._get(key, default)
        if not found or not isinstance(value, str):
            return float(as_number(value, self.source, self.at(key), lo=0)) if found else value
        from gpud.cli.units import parse_duration
        text = value.strip()
        if text.replace(".", "", 1).isdigit():
            raise self.error(key, f"a bare number is seconds: write {text} (no quotes), or a time with a unit "
                                  f"such as \"{text}m\"")
        try:
            return parse_duration(text)
        except ValueError as exc:
            raise self.error(key, f"{exc}; or a number of seconds") from None

    def integer(self, key: str, default: Any = REQUIRED, **bounds: Any) -> Any:
        """An integer within ``bounds``, or ``default`` when absent."""
        found, value = self._get(key, default)
        try:
            return as_int(value, self.source, self.at(key), **bounds) if found else value
        except ConfigError as exc:
            raise spotted(exc, self.data, key) from None

    def strings(self, key: str, default: Any = ()) -> Any:
        """An array of non-empty strings as a tuple, or ``default`` when absent."""
        found, value = self._get(key, default)
        if not found:
            return value
        try:
            items = as_list(value, self.source, self.at(key), expected="an array of strings")
            return tuple(as_str(item, self.source, f"{self.at(key)}[{i}]")
                         for i, item in enumerate(items, 1))
        except ConfigError as exc:
            raise spotted(exc, self.data, key) from None

    def labels(self, key: str) -> dict[str, str]:
        """A table of string keys to string values (labels, selectors); empty when absent."""
        found, value = self._get(key, {})
        if not found:
            return {}
        try:
            table = Table(value, self.source, self.at(key), None)
            return {k: as_str(v, self.source, table.at(k)) for k, v in table.data.items()}
        except ConfigError as exc:
            raise spotted(exc, self.data, key) from None

    def tables(self, key: str, limit: int) -> list[tuple[int, Any]]:
        """The entries of an array of tables with their 1-based positions; empty when absent."""
        found, value = self._get(key, [])
        if not found:
            return []
        try:
            items = as_list(value, self.source, self.at(key), expected="an array of tables", limit=limit)
        except ConfigError as exc:
            raise spotted(exc, self.data, key) from None
        return [(index, item) for index, item in enumerate(items, 1) if item is not None]

    def table(self, key: str, known: Iterable[str] | None) -> Table:
        """A sub-table, checked against ``known`` keys (None: any key); empty when absent."""
        try:
            return Table(self.data.get(key, {}), self.source, self.at(key), known)
        except ConfigError as exc:
            raise spotted(exc, self.data, key) from None

    def entry(self, key: str, index: int, name: str | None = None) -> str:
        """The path of entry ``index`` of the array ``key``, with its name when known."""
        base = f"{self.at(key)}[{index}]"
        return f"{base} (name = {quote(name)})" if name is not None else base

    def named(self, key: str, index: int, raw: Any, known: Iterable[str], seen: Iterable[str]) -> Table:
        """Entry ``index`` of the array of tables ``key``, with its required ``name`` not in ``seen``."""
        try:
            table = Table(raw, self.source, self.entry(key, index), None)
            if isinstance(raw.get("name"), str) and raw["name"]:
                table.where = self.entry(key, index, raw["name"])
            table.check_keys(known)
            name = table.string("name")
            if name in seen:
                raise ConfigError(self.source, table.at("name"), f"duplicate name: another entry of "
                                                                 f"[[{self.at(key)}]] is also named {quote(name)}")
        except ConfigError as exc:
            if exc.spot is None or exc.spot == (raw, "name"):
                exc.spot = (self.data[key], index - 1)   # an entry without a usable name is set aside whole
            raise
        return table

    def names(self, key: str, known: Mapping[str, Any], kind: str) -> frozenset[str] | None:
        """An array of distinct names of ``known`` things (a ``kind``) as a set; None when absent."""
        names = self.strings(key, None)
        if names is None:
            return None
        seen: set[str] = set()
        for name in names:
            if name not in known:
                raise self.error(key, f"unknown {kind} {quote(name)}{suggestion(name, known)}")
            if name in seen:
                raise self.error(key, f"names {kind} {quote(name)} more than once")
            seen.add(name)
        return frozenset(names)

    def keyed(self, key: str, known: Mapping[str, Any], kind: str,
              read: Callable[[Any, str, Any], Any]) -> dict[str, Any] | None:
        """A table keyed by names of ``known`` things (a ``kind``); each value is ``read(value, where, thing)``.

        None when the table is absent.
        """
        if key not in self.data:
            return None
        entries = self.table(key, None)
        result = {}
        for name, value in entries.data.items():
            if name not in known:
                raise entries.error(name, f"unknown {kind} {quote(name)}{suggestion(name, known)}")
            result[name] = read(value, entries.at(name), known[name])
        return result
