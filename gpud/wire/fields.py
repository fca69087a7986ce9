"""Declaring a wire message's fields once: the checking reader, the writer and the JSON Schema all follow it.

A message type is a frozen dataclass whose fields are made with :func:`wire`
(the kind of JSON value and its bounds) and whose ``check`` method refuses
fields that do not go together. :func:`decode` reads JSON into it
and refuses bad input with a :class:`WireError` naming the field; a value
of the wrong JSON type is a 400, one of the right type but out of bounds a
422. :func:`encode` writes a message back as JSON that :func:`decode` reads
to an equal message, and :func:`json_schema` describes what :func:`decode`
takes.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import Any

from gpud.tomlcheck import suggestion

MAX_TEXT = 65_536  # characters of one text field (or of a list's or a map's texts together)
WRONG_TYPE, OUT_OF_BOUNDS = 400, 422


class WireError(ValueError):
    """A message that does not follow its schema: ``field`` is the culprit (None for the whole message),
    ``status`` the HTTP status it is refused with (400 wrong type, 422 out of bounds)."""

    def __init__(self, message: str, field: str | None = None, status: int = OUT_OF_BOUNDS) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


@dataclass(frozen=True, slots=True)
class Rule:
    """What one field takes: ``kind`` of JSON value and the bounds :func:`decode` checks.

    Kinds: text, texts (a list of texts), map (an object of texts), flag, number, integer, integers,
    name_or_integer, choice (an enum's values), message (a nested message type in ``of``).
    """

    kind: str
    required: bool = False
    minimum: float | None = None
    above: float | None = None  # an exclusive minimum
    maximum: float | None = None
    limit: int = MAX_TEXT
    nonempty: bool = False
    absolute: bool = False  # a text that must be an absolute path
    choices: tuple[str, ...] = ()  # for a text: the values it may take, each also with ``prefix`` before it
    prefix: str = ""  # taken off a text's value before it is compared with ``choices``
    of: Any = None  # the enum of a choice, the message type of a message
    expect: str = ""  # what the wrong-type message says the field must be, where the kind's words do not fit


def wire(kind: str, default: Any = None, *, factory: Any = None, **bounds: Any) -> Any:
    """A dataclass field of a wire message: ``kind`` and ``bounds`` as :class:`Rule` says; absent or null in
    JSON, it takes ``default`` (or ``factory()``)."""
    metadata = {"wire": Rule(kind, **bounds)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


_RULES: dict[type, tuple[tuple[str, Rule], ...]] = {}


def rules(cls: type) -> tuple[tuple[str, Rule], ...]:
    """The wire fields of message type ``cls``, in declaration order: (name, rule)."""
    found = _RULES.get(cls)
    if found is None:
        found = _RULES[cls] = tuple((f.name, f.metadata["wire"]) for f in dataclasses.fields(cls)
                                    if "wire" in f.metadata)
    return found


def decode(cls: Any, data: Any, *, strict: bool = False, where: str = "", error: type[WireError] = WireError,
           path: str = "") -> Any:
    """Message ``cls`` from JSON ``data``; ``error`` (a WireError) naming the first field at fault otherwise.

    ``strict`` refuses fields the type does not declare; ``where`` is put before each message (such as
    "tasks[3]"); ``path`` before each field name (a nested message's field is "outer.inner").
    """
    head = f"{where}: " if where else ""
    if not isinstance(data, dict):
        raise error(f"{head}{path.rstrip('.') or 'a message'} must be a JSON object", path.rstrip(".") or None,
                    WRONG_TYPE)
    known = rules(cls)
    if strict:
        names = {name for name, _ in known}
        unknown = sorted(str(key) for key in data if key not in names)
        if unknown:
            raise error(f"{head}unknown field {unknown[0]!r}{suggestion(unknown[0], names)}", path + unknown[0])
    values: dict[str, Any] = {}
    for name, rule in known:
        value = data.get(name)
        if value is None:  # absent or null: the field's default
            if rule.required:
                raise error(f"{head}{path}{name} is required", path + name)
            continue
        try:
            values[name] = _READERS[rule.kind](rule, path + name, value)
        except WireError as exc:
            raise error(f"{head}{exc}", exc.field, exc.status) from None
    message = cls(**values)
    try:
        message.check()
    except WireError as exc:
        raise error(f"{head}{exc}", path + exc.field if exc.field else None, exc.status) from None
    return message


def encode(message: Any) -> dict[str, Any]:
    """``message`` as JSON-able data that :func:`decode` reads back to an equal message (a field that is None
    is left out: absent, it reads back as its default, None)."""
    out: dict[str, Any] = {}
    for name, rule in rules(type(message)):
        value = getattr(message, name)
        if value is not None:
            out[name] = _write(rule, value)
    return out


def json_schema(cls: Any, *, strict: bool = False) -> dict[str, Any]:
    """The JSON Schema of what :func:`decode` takes for ``cls`` (no null shown: null is the field's default)."""
    known = rules(cls)
    schema: dict[str, Any] = {"type": "object", "properties": {name: _schema(rule) for name, rule in known}}
    required = [name for name, rule in known if rule.required]
    if required:
        schema["required"] = required
    if strict:
        schema["additionalProperties"] = False
    return schema


def _text(rule: Rule, name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise WireError(f"{name} must be {rule.expect or 'a string'}", name, WRONG_TYPE)
    if len(value) > rule.limit or "\0" in value:
        raise WireError(f"{name} is longer than {rule.limit} characters or holds a NUL byte", name)
    _check_unicode(name, value)
    if rule.nonempty and not value:
        raise WireError(f"{name} must not be empty", name)
    if rule.absolute and not value.startswith("/"):
        raise WireError(f"{name} must be an absolute path, not {value!r}", name)
    if rule.choices:
        value = value.removeprefix(rule.prefix) if rule.prefix else value
        if value not in rule.choices:
            raise WireError(f"{name} must be one of {', '.join(rule.choices)}", name)
    return value


def _texts(rule: Rule, name: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise WireError(f"{name} must be a list of strings", name, WRONG_TYPE)
    if sum(len(item) for item in value) > rule.limit or any("\0" in item for item in value):
        raise WireError(f"{name} is longer than {rule.limit} characters or holds a NUL byte", name)
    _check_unicode(name, *value)
    if rule.nonempty and not value:
        raise WireError(f"{name} must not be empty", name)
    return tuple(value)


def _map(rule: Rule, name: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise WireError(f"{name} must be an object of strings", name, WRONG_TYPE)
    if sum(len(k) + len(v) for k, v in value.items()) > rule.limit:
        raise WireError(f"{name} is larger than {rule.limit} characters", name)
    _check_unicode(name, *value, *value.values())
    return dict(value)


def _flag(rule: Rule, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise WireError(f"{name} must be true or false", name, WRONG_TYPE)
    return value


def _number(rule: Rule, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WireError(f"{name} must be a number", name, WRONG_TYPE)
    try:
        number = float(value)
    except OverflowError:
        raise WireError(f"{name} is too large", name) from None
    if not math.isfinite(number):
        raise WireError(f"{name} must be a number", name, WRONG_TYPE)
    _check_bounds(rule, name, number, value, "a number")
    return number


def _integer(rule: Rule, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{name} must be an integer", name, WRONG_TYPE)
    _check_bounds(rule, name, value, value, "an integer")
    return value


def _integers(rule: Rule, name: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise WireError(f"{name} must be a list of integers", name, WRONG_TYPE)
    for item in value:
        _check_bounds(rule, name, item, item, "a list of integers each")
    return tuple(value)


def _name_or_integer(rule: Rule, name: str, value: Any) -> str | int:
    if isinstance(value, str):
        return _text(rule, name, value)
    if isinstance(value, int) and not isinstance(value, bool):
        if (rule.minimum is None or value >= rule.minimum) and (rule.maximum is None or value <= rule.maximum):
            return value
    raise WireError(f"{name} must be {rule.expect or 'a name or an integer'}", name, WRONG_TYPE)


def _choice(rule: Rule, name: str, value: Any) -> enum.Enum:
    member = rule.of._value2member_map_.get(value) if isinstance(value, str) else None
    if member is None:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise WireError(f"{name} must be one of {', '.join(m.value for m in rule.of)} (got {shown})", name)
    return member


def _message(rule: Rule, name: str, value: Any) -> Any:
    return decode(rule.of, value, path=name + ".")


_READERS = {"text": _text, "texts": _texts, "map": _map, "flag": _flag, "number": _number, "integer": _integer,
            "integers": _integers, "name_or_integer": _name_or_integer, "choice": _choice, "message": _message}


def _check_bounds(rule: Rule, name: str, number: float, shown: Any, what: str) -> None:
    low, high = rule.minimum, rule.maximum
    if low is not None and high is not None and not low <= number <= high:
        raise WireError(f"{name} must be {what} between {_bound(low)} and {_bound(high)}, not {shown}", name)
    if low is not None and number < low:
        raise WireError(f"{name} must be {what} of at least {_bound(low)}, not {shown}", name)
    if high is not None and number > high:
        raise WireError(f"{name} must be {what} of at most {_bound(high)}, not {shown}", name)
    if rule.above is not None and number <= rule.above:
        raise WireError(f"{name} must be {what} above {_bound(rule.above)}, not {shown}", name)


def _bound(value: float) -> str:
    """A bound as people write it: 2147483647 whole, 0.5 as it is, 1e+18 short."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


def _check_unicode(name: str, *texts: str) -> None:
    """400 naming the field when a text holds a lone surrogate (JSON's "\\ud800"): no argv, variable or file
    name can carry one, and the store writes only valid UTF-8."""
    for text in texts:
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise WireError(f"{name} must be valid Unicode text (it holds a lone surrogate)", name,
                                WRONG_TYPE) from None


def _write(rule: Rule, value: Any) -> Any:
    if rule.kind in ("texts", "integers"):
        return list(value)
    if rule.kind == "map":
        return dict(value)
    if rule.kind == "choice":
        return value.value
    if rule.kind == "message":
        return encode(value)
    return value


def _schema(rule: Rule) -> dict[str, Any]:
    kind = rule.kind
    if kind == "text":
        if rule.choices:
            return {"enum": [*rule.choices, *(rule.prefix + c for c in rule.choices if rule.prefix)]}
        return {"type": "string", "maxLength": rule.limit, **({"minLength": 1} if rule.nonempty else {})}
    if kind == "texts":
        return {"type": "array", "items": {"type": "string"}, **({"minItems": 1} if rule.nonempty else {})}
    if kind == "map":
        return {"type": "object", "additionalProperties": {"type": "string"}}
    if kind == "flag":
        return {"type": "boolean"}
    if kind in ("number", "integer"):
        return {"type": kind, **_bounds(rule)}
    if kind == "integers":
        return {"type": "array", "items": {"type": "integer", **_bounds(rule)}}
    if kind == "name_or_integer":
        return {"anyOf": [{"type": "string"}, {"type": "integer", **_bounds(rule)}]}
    if kind == "choice":
        return {"enum": [member.value for member in rule.of]}
    return json_schema(rule.of)


def _bounds(rule: Rule) -> dict[str, float]:
    out: dict[str, float] = {}
    if rule.minimum is not None:
        out["minimum"] = rule.minimum
    if rule.above is not None:
        out["exclusiveMinimum"] = rule.above
    if rule.maximum is not None:
        out["maximum"] = rule.maximum
    return out
