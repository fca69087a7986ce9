"""Checking what a node sends before the cluster reads it, as API bodies are checked before a submit.

A node message is JSON text within bounds (depth, values), with no NaN or
Infinity; each task report in it has the fields and types the node writes
(gpud/node/taskstate.py), each number finite and within range. Anything else
is a ValueError naming the field, which the node is told; the controller
never fails on it.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

from gpud.controller.body import BodyError, check_shape
from gpud.wire.task import TaskReport

MAX_DEPTH = 16
MAX_ITEMS = 5_000_000        # a heartbeat lists every task of the node, each a few values
MAX_INDEX = (1 << 31) - 1    # tasks, attempts, pids, exit codes and signals are 32-bit on every platform
MAX_QUANTITY = 1e18          # bytes, seconds, percentages: anything larger is not a measurement


def loads_message(text: str | bytes) -> dict:
    """The message's JSON object; ValueError naming what is wrong (not JSON, too deep or big, NaN, not an object).

    A text too long to be sure it holds at most MAX_ITEMS values is counted
    before it is parsed, so no message makes the controller build more; a
    shorter one (every heartbeat) is parsed first and its depth measured on
    what was built, which costs a tenth of scanning the text.
    """
    data = text.encode() if isinstance(text, str) else text
    if len(data) > MAX_ITEMS:  # each value takes at least one byte: a shorter text cannot hold too many
        _check_shape(data)
    try:
        message = orjson.loads(data)   # strict: NaN and Infinity are not JSON
    except orjson.JSONDecodeError:
        _check_shape(data)  # nested too deeply for orjson: say that rather than what json makes of it
        try:  # what orjson refuses and json takes (an integer wider than 64 bits, a lone surrogate)
            message = json.loads(data, parse_constant=_not_a_number)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise ValueError(f"the message is not valid JSON: {exc}") from None
    if _deeper_than(message, MAX_DEPTH):
        raise ValueError(f"the message nests more than {MAX_DEPTH} levels deep")
    if not isinstance(message, dict):
        raise ValueError("a message is a JSON object")
    return message


def _check_shape(data: bytes) -> None:
    try:
        check_shape(data, MAX_DEPTH, MAX_ITEMS)
    except BodyError as exc:
        raise ValueError(str(exc).replace("the body", "the message").replace("JSON body", "message")) from None


def _deeper_than(value: Any, limit: int) -> bool:
    """True when ``value`` nests objects and arrays more than ``limit`` levels deep (a top-level one is level 1)."""
    level = [value] if isinstance(value, (dict, list)) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        inner = []
        for container in level:
            for item in container.values() if isinstance(container, dict) else container:
                if isinstance(item, (dict, list)):
                    inner.append(item)
        level = inner
    return False


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def task_report(report: Any, where: str = "task report") -> dict:
    """``report`` when it is a well-formed task report (gpud.wire.task.TaskReport); ValueError naming the field
    that is not."""
    TaskReport.decode(report, where)
    return report


def task_reports(items: Any, where: str = "tasks", checked: list[dict] | None = None) -> list[dict]:
    """The checked task reports of a register or heartbeat message; ValueError naming the first bad one.

    A report equal to the one at its position in ``checked`` (the node's last
    list, already checked) is not checked again: that checked one is returned in
    its place (so a value equal but of another type, ``true`` for ``1``, is never
    what is read). A heartbeat mostly repeats the last.
    """
    if items is None:
        return []
    if not isinstance(items, list):
        raise ValueError(f"{where} must be a list of task reports")
    known = checked or []
    if items == known:  # the same reports as last time (equal values are read as the checked ones, as below)
        return known
    return [known[index] if index < len(known) and item == known[index] else task_report(item, f"{where}[{index}]")
            for index, item in enumerate(items)]


def quantity(message: dict, name: str, default: float = 0.0, where: str = "message") -> float:
    """A finite, non-negative number field of a message (``default`` when absent); ValueError otherwise."""
    if message.get(name) is None:
        return default
    _quantity(message, name, where)
    return float(message[name])


def index(message: dict, name: str, where: str = "message") -> int:
    """A required integer field from 0 to MAX_INDEX; ValueError otherwise."""
    _index(message, name, where, required=True)
    return int(message[name])


def _index(report: dict, name: str, where: str, required: bool = False) -> None:
    _integer(report, name, where, 0, MAX_INDEX, required)


def _integer(report: dict, name: str, where: str, low: int, high: int, required: bool = False) -> None:
    value = report.get(name)
    if value is None and not required:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{where}: {name} must be an integer from {low} to {high} (got {_shown(value)})")


def _quantity(report: dict, name: str, where: str) -> None:
    value = report.get(name)
    if value is None:
        return
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not 0 <= value <= MAX_QUANTITY):
        raise ValueError(f"{where}: {name} must be a number from 0 to {MAX_QUANTITY:g} (got {_shown(value)})")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
