"""JSON read and written by the json module's own C accelerator (``_json``), without importing json.

Importing json imports re (json compiles its patterns when it is imported), which with enum costs a
gpuctl call about as much as Python's own start-up. The C scanner and encoder need none of that:
given the json module's defaults, they produce exactly what ``json.loads`` and ``json.dumps(value,
separators=(",", ":"))`` produce. What they do not take (a byte order mark, another encoding than
UTF-8, text that is not JSON) goes to the json module, whose answer or error is then the answer.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: gpuctl starts faster
if TYPE_CHECKING:
    from typing import Any

try:
    import _json
except ImportError:  # a Python without the accelerator: the json module does it all
    _json = None  # type: ignore[assignment]

_WHITESPACE = " \t\n\r"
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Settings:
    """The json module's decoding defaults, as its C scanner reads them off a JSONDecoder."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__
    memo: dict = {}


def _unserializable(value: Any) -> Any:
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


# The stub types the argument as a JSONDecoder; the C scanner reads these attributes off any object.
_scan = _json.make_scanner(_Settings()) if _json is not None else None  # type: ignore[arg-type]


def loads(data: str | bytes) -> Any:
    """``json.loads(data)``: the value of the JSON text, or json's JSONDecodeError (a ValueError) saying where it
    is wrong."""
    text = data
    if isinstance(data, (bytes, bytearray)):
        # json.loads guesses UTF-16 or UTF-32 from zero bytes and a byte order mark; plain UTF-8 is read here.
        if len(data) < 2 or data[0] in (0, 0xEF, 0xFE, 0xFF) or data[1] == 0:
            return _json_loads(data)
        try:
            text = data.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            return _json_loads(data)
    if _scan is None or not isinstance(text, str) or text.startswith("\ufeff"):
        return _json_loads(data)
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration:
        return _json_loads(data)
    if end != len(text) and text[end:].strip(_WHITESPACE):
        return _json_loads(data)  # extra data: json says where
    return value


def dumps(value: Any) -> str:
    """``json.dumps(value, separators=(",", ":"))``: compact JSON, non-ASCII characters escaped; TypeError for a
    value JSON cannot hold, ValueError for a circular one."""
    if _json is None:
        import json
        return json.dumps(value, separators=(",", ":"))
    encode = _json.make_encoder({}, _unserializable, _json.encode_basestring_ascii, None, ":", ",", False, False,
                                True)
    return "".join(encode(value, 0))


def _json_loads(data: str | bytes) -> Any:
    import json
    return json.loads(data)
