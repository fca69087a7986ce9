"""JSON for a command that starts, makes one request and exits: the json module's own C parts, without its import.

Importing json costs a gpuctl call about a third of Python's whole start-up: json
imports re, and re imports enum, before json compiles its patterns. The encoder
and scanner json itself uses are in the C module _json, which imports nothing;
they are called here as json calls them. Anything they do not take the fast way
(a document json would refuse, a Python without these C parts) goes to the json
module, so the answers, and the errors, are json's.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs every gpuctl call ~2 ms; Any is needed only by type checkers
if TYPE_CHECKING:
    from typing import Any

_WHITESPACE = " \t\n\r"  # what JSON allows around a value
_codec: list = []  # the (encoder, scanner) pair, made on first use; empty tuple when _json cannot make them


class _ScannerSettings:
    """What _json's scanner reads from json.JSONDecoder: json.loads's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> float:
        return {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}[name]


def _fail(value: object) -> None:
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


def _made() -> tuple:
    if not _codec:
        try:
            import _json
            encoder = _json.make_encoder({}, _fail, _json.encode_basestring_ascii, None, ":", ",", False, False, True)
            _codec.append((encoder, _json.make_scanner(_ScannerSettings())))  # type: ignore[arg-type]  # duck-typed
        except (ImportError, AttributeError, TypeError):
            _codec.append(())
    return _codec[0]


def dumps(value: Any) -> str:
    """``value`` as compact JSON text, exactly as ``json.dumps(value, separators=(",", ":"))`` writes it."""
    made = _made()
    if made and not isinstance(value, str):
        try:
            return "".join(made[0](value, 0))
        except (TypeError, ValueError, RecursionError):
            pass  # json says what is wrong
    import json
    return json.dumps(value, separators=(",", ":"))


def loads(data: bytes | str) -> Any:
    """The value of the JSON document ``data``, as ``json.loads`` gives it; ValueError when it is not JSON."""
    made = _made()
    if made:
        try:
            text = data.decode("utf-8") if isinstance(data, bytes) else data
            start = len(text) - len(text.lstrip(_WHITESPACE))
            value, end = made[1](text, start)
            if end == len(text) or not text[end:].strip(_WHITESPACE):
                return value
        except (ValueError, StopIteration, RecursionError):
            pass  # json says what is wrong
    import json
    return json.loads(data)
