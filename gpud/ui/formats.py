"""How the pages write times, durations and amounts (template filters)."""

from __future__ import annotations

import time
from typing import Any, Callable


def when(value: Any) -> str:
    """A Unix time as UTC date and time; a dash for none; anything else as it is written."""
    if value is None:
        return "–"
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return str(value)
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(value)))


def duration(value: Any) -> str:
    """Seconds as 3d 4h, 2h 05m, 4m 10s or 12s; a dash for none."""
    if value is None:
        return "–"
    s = int(float(value))
    if s >= 86400:
        return f"{s // 86400}d {s % 86400 // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"


def num(value: Any, places: int = 2) -> str:
    """A number without trailing zeros (1, 0.5, 2.25); ∞ for no limit, a dash for none."""
    if value is None:
        return "–"
    if value == float("inf"):
        return "∞"
    text = f"{float(value):.{places}f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def percent(value: Any) -> str:
    """A percentage (of 100) rounded; a dash for none."""
    return "–" if value is None else f"{float(value):.0f}%"


FILTERS: dict[str, Callable[..., str]] = {"when": when, "duration": duration, "num": num, "percent": percent}
