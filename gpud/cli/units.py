"""Reading and writing the durations, sizes and array ranges people type and read.

The grammars are small enough to read with str methods: re, with the enum module under it, costs a
``gpuctl submit --array 0-99`` more than the rest of gpuctl. A digit is any Unicode decimal digit, as
``\\d`` and ``int()`` take them.
"""

from __future__ import annotations

_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_GIB_PER_UNIT = {"": 1.0, "K": 1 / 1024**2, "M": 1 / 1024, "G": 1.0, "T": 1024.0, "P": 1024.0**2}
_SIZE_SUFFIXES = ("", "B", "IB")  # after the unit letter, upper-cased: 16G, 16GB, 16GiB
MAX_CHECKED_ELEMENTS = 1_000_000  # beyond this, repeats are left to the controller to find


def _is_number(text: str) -> bool:
    """Whether ``text`` is digits with an optional fraction: ``12``, ``1.5`` (not ``1.``, ``.5`` or ``-1``)."""
    whole, dot, fraction = text.partition(".")
    return whole.isdecimal() and (not dot or fraction.isdecimal())


def _leading_number(text: str) -> tuple[str, str]:
    """``text`` split after its leading number (digits, then a fraction when a digit follows the point)."""
    end = _decimal_run(text, 0)
    if end and text[end:end + 1] == "." and _decimal_run(text, end + 1) > end + 1:
        end = _decimal_run(text, end + 1)
    return text[:end], text[end:]


def _decimal_run(text: str, start: int) -> int:
    """The index after the decimal digits of ``text`` from ``start`` on."""
    end = start
    while end < len(text) and text[end].isdecimal():
        end += 1
    return end


def parse_duration(text: str) -> float:
    """Seconds in a time limit written as Slurm does or with a unit.

    Accepts ``90`` (minutes, as Slurm), ``MM:SS``, ``HH:MM:SS``, ``D-HH``,
    ``D-HH:MM``, ``D-HH:MM:SS``, and ``30s``, ``90m``, ``1.5h``, ``2d``.
    Raises ValueError with a sentence saying what is accepted; the result is
    always > 0.
    """
    value = text.strip().lower()
    seconds = _duration(value)
    if seconds is None or seconds <= 0:
        raise ValueError(f"bad time {text!r}: use minutes (90), MM:SS, HH:MM:SS, D-HH:MM:SS, "
                         f"or a number with s, m, h or d (90m, 1.5h)")
    return seconds


def _duration(value: str) -> float | None:
    if value[-1:] in _UNIT_S and _is_number(value[:-1]):
        return float(value[:-1]) * _UNIT_S[value[-1]]
    days = 0
    if "-" in value:
        day_text, _, value = value.partition("-")
        if not day_text.isdigit():
            return None
        days = int(day_text)
    parts = value.split(":")
    if not all(p.isdigit() for p in parts) or len(parts) > 3:
        return None
    numbers = [int(p) for p in parts]
    if days:  # after "D-" the first field is hours: D-HH, D-HH:MM, D-HH:MM:SS
        numbers += [0] * (3 - len(numbers))
        hours, minutes, seconds = numbers
    elif len(numbers) == 1:
        hours, minutes, seconds = 0, numbers[0], 0
    elif len(numbers) == 2:
        hours, (minutes, seconds) = 0, numbers
    else:
        hours, minutes, seconds = numbers
    if (len(parts) > 1 or days) and (minutes > 59 or seconds > 59):
        return None
    return float(days * 86400 + hours * 3600 + minutes * 60 + seconds)


def format_duration(seconds: float | None) -> str:
    """A duration the way squeue prints it: ``M:SS``, ``H:MM:SS`` or ``D-HH:MM:SS``; ``-`` for None."""
    if seconds is None:
        return "-"
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def parse_size_gib(text: str) -> float:
    """GiB in a size such as ``16G``, ``20GiB``, ``512M``, ``1.5T`` or ``16`` (a bare number is GiB).

    Units are powers of 1024 whether written G, GB or GiB, as Slurm reads
    them. Raises ValueError; the result is always > 0.
    """
    number, rest = _leading_number(text.strip())
    unit = rest.lstrip().upper()  # as the strip above: the whitespace \\s matches
    letter = unit[:1] if unit[:1] in _GIB_PER_UNIT and unit[:1] != "B" else ""
    if not number or not unit.isascii() or unit[len(letter):] not in _SIZE_SUFFIXES or float(number) <= 0:
        raise ValueError(f"bad size {text!r}: use a number with K, M, G or T (16G, 20GiB, 512M)")
    return float(number) * _GIB_PER_UNIT[letter]


def format_size_gib(gib: float | None) -> str:
    """A size in GiB for people: ``512M``, ``16G``, ``1.5T``; ``-`` for None."""
    if gib is None:
        return "-"
    for unit, scale in (("T", 1024.0), ("G", 1.0), ("M", 1 / 1024)):
        if gib >= scale or unit == "M":
            return f"{format_number(gib / scale)}{unit}"
    raise AssertionError("unreachable")


def format_number(value: float | None) -> str:
    """A number without a useless fraction: ``2``, ``0.5``, ``1.25``; ``-`` for None."""
    if value is None:
        return "-"
    if abs(value - round(value)) < 1e-9:
        return str(int(round(value)))
    return f"{value:.2f}".rstrip("0").rstrip(".")


def parse_array(text: str) -> tuple[int, int | None]:
    """The number of elements and the at-once limit of an array spec such as ``0-99%8``, ``1,3,5-7``, ``0-15:4``.

    ``A-B:S`` steps by S. Raises ValueError when the spec is malformed, a
    range runs backwards, a step is 0, an index repeats, or the limit is 0.
    """
    spec, percent, limit_text = text.strip().partition("%")
    if not all(_is_range(part) for part in spec.split(",")) or (percent and not limit_text.isdecimal()):
        raise ValueError(f"bad array {text!r}: use ranges and indices such as 0-99, 1,3,5-7 or 0-99%8")
    ranges = []
    for part in spec.split(","):
        span, _, step_text = part.partition(":")
        lo, _, hi = span.partition("-")
        first, last, step = int(lo), int(hi or lo), int(step_text or 1)
        if last < first:
            raise ValueError(f"bad array {text!r}: the range {part} runs backwards")
        if step < 1:
            raise ValueError(f"bad array {text!r}: the step in {part} must be at least 1")
        ranges.append(range(first, last + 1, step))
    count = sum(len(r) for r in ranges)
    if count <= MAX_CHECKED_ELEMENTS and len(set().union(*ranges)) != count:
        raise ValueError(f"bad array {text!r}: an index appears twice")
    limit = int(limit_text) if percent else None
    if limit == 0:
        raise ValueError(f"bad array {text!r}: the limit after % must be at least 1")
    return count, limit


def _is_range(part: str) -> bool:
    """Whether ``part`` is an index, a range ``A-B`` or a stepped range ``A-B:S``."""
    first, dash, rest = part.partition("-")
    last, colon, step = rest.partition(":")
    return first.isdecimal() and (not dash or (last.isdecimal() and (not colon or step.isdecimal())))


_DATE = r"^\d{4}-\d{2}-\d{2}([ T]\d{1,2}:\d{2}(:\d{2})?)?$"


def parse_when(text: str) -> float:
    """A Unix time from a local date (2026-11-01, '2026-11-01 14:00') or a time ago (2h, 7d, 90m).

    Raises argparse.ArgumentTypeError naming what is wrong, for use as an argparse ``type``.
    """
    import argparse
    import re
    import time
    text = text.strip()
    if re.match(_DATE, text):
        from datetime import datetime
        try:
            return datetime.fromisoformat(text).timestamp()
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"bad date {text!r}: {exc}") from None
    try:
        return round(time.time() - parse_duration(text), 3)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad time {text!r}: use a date (2026-11-01, '2026-11-01 14:00') or a time ago (2h, 7d, 90m)") from None
