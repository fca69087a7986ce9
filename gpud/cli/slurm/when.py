"""Times as Slurm's commands take them (``sacct -S/-E``), read as sacct reads them: in local time, and in
the past when a time of day or a date without a year could be either.

The forms: ``now[+|-COUNT[UNIT]]`` (UNIT seconds, the default, minutes, hours, days or weeks, or a prefix
of one: ``now-1hour``, ``now-2days``), ``today``, ``midnight``, ``noon``, ``fika`` (15:00), ``teatime``
(16:00), ``HH:MM[:SS][AM|PM]``, ``YYYY-MM-DD[THH:MM[:SS]]``, and ``MMDD[YY]``, ``MM/DD[/YY]`` or
``MM.DD[.YY]``, each optionally followed by ``-HH:MM[:SS]`` or ``THH:MM[:SS]``.
"""

from __future__ import annotations

import re
import time

_UNITS = (("seconds", 1), ("minutes", 60), ("hours", 3600), ("days", 86400), ("weeks", 7 * 86400))
_NAMED = {"midnight": (0, 0), "noon": (12, 0), "fika": (15, 0), "teatime": (16, 0)}
_NOW = re.compile(r"now(?:([+-])(\d+)([a-z]*))?")
_CLOCK = r"(\d{1,2}):(\d{2})(?::(\d{2}))?"
_TIME_OF_DAY = re.compile(_CLOCK + r"\s*(am|pm)?")
_ISO = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2})(?:[t ]" + _CLOCK + r")?")
_MONTH_DAY = re.compile(r"(\d{2})([/.]?)(\d{2})(?:\2(\d{2}))?(?:[-t]" + _CLOCK + r")?")


def slurm_time(text: str, now: float | None = None) -> float:
    """The Unix time ``text`` names, ``now`` (the current time by default) being the time it is read at.

    Raises ValueError naming the text when it is none of the forms above.
    """
    now = time.time() if now is None else now
    spec = text.strip().lower()
    if (match := _NOW.fullmatch(spec)) is not None:
        return now + _offset(match, text)
    today = time.localtime(now)
    if spec == "today":
        return _local(today.tm_year, today.tm_mon, today.tm_mday, 0, 0, 0, text)
    if spec in _NAMED:
        return _latest_by(now, *_NAMED[spec], 0, text)
    if (match := _TIME_OF_DAY.fullmatch(spec)) is not None:
        hour, minute, second = int(match[1]), int(match[2]), int(match[3] or 0)
        if match[4]:
            if not 1 <= hour <= 12:
                raise ValueError(f"invalid time specification: {text!r} (an AM/PM hour is 1 to 12)")
            hour = hour % 12 + (12 if match[4] == "pm" else 0)
        return _latest_by(now, hour, minute, second, text)
    if (match := _ISO.fullmatch(spec)) is not None:
        return _local(int(match[1]), int(match[2]), int(match[3]), *_clock(match, 4), text)
    if (match := _MONTH_DAY.fullmatch(spec)) is not None:
        month, day = int(match[1]), int(match[3])
        if match[4] is not None:
            return _local(2000 + int(match[4]), month, day, *_clock(match, 5), text)
        moment = _local(today.tm_year, month, day, *_clock(match, 5), text)
        # No year: the latest such date that is not in the future, as sacct reads it.
        return moment if moment <= now else _local(today.tm_year - 1, month, day, *_clock(match, 5), text)
    raise ValueError(f"invalid time specification: {text!r} (use now-1hour, today, 14:30, 2026-11-01, "
                     f"2026-11-01T14:30, 11/01 or 1101)")


def _offset(match: re.Match[str], text: str) -> float:
    if match[1] is None:
        return 0.0
    unit = match[3] or "seconds"
    factor = next((seconds for name, seconds in _UNITS if name.startswith(unit)), None)
    if factor is None:
        raise ValueError(f"invalid time specification: {text!r} (the unit is seconds, minutes, hours, days or "
                         f"weeks)")
    return (1 if match[1] == "+" else -1) * int(match[2]) * factor


def _clock(match: re.Match[str], first: int) -> tuple[int, int, int]:
    """The hours, minutes and seconds in groups ``first`` to ``first + 2`` (midnight when absent)."""
    if match[first] is None:
        return 0, 0, 0
    return int(match[first]), int(match[first + 1]), int(match[first + 2] or 0)


def _latest_by(now: float, hour: int, minute: int, second: int, text: str) -> float:
    """The latest moment at that time of day that is not in the future: today's, or yesterday's."""
    day = time.localtime(now)
    moment = _local(day.tm_year, day.tm_mon, day.tm_mday, hour, minute, second, text)
    if moment <= now:
        return moment
    yesterday = time.localtime(moment - 86400)
    return _local(yesterday.tm_year, yesterday.tm_mon, yesterday.tm_mday, hour, minute, second, text)


def _local(year: int, month: int, day: int, hour: int, minute: int, second: int, text: str) -> float:
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 59):
        raise ValueError(f"invalid time specification: {text!r} (no such date or time of day)")
    import datetime
    try:
        return datetime.datetime(year, month, day, hour, minute, second).timestamp()
    except ValueError as exc:
        raise ValueError(f"invalid time specification: {text!r} ({exc})") from None
