"""The GPU memory watchdog: a task past its memory slice (plus the policy's tolerance) is warned, then stopped."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping

log = logging.getLogger(__name__)
MIB_PER_GIB = 1024.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do about one task: ``"warn"`` or ``"stop"``, and the words to say."""

    key: Any  # the caller's key of the task, given back as it was
    action: str
    message: str


@dataclass(frozen=True, slots=True)
class Slice:
    """A task's memory slice on its GPU: the limit, the tolerance above it, the grace before a stop."""

    limit_mib: float
    tolerance: float = 0.05
    grace_s: float = 10.0
    enforce: bool = True

    @property
    def allowed_mib(self) -> float:
        """The most the task may hold before it is an offender."""
        return self.limit_mib * (1.0 + self.tolerance)


class MemoryWatch:
    """Decides, poll after poll, which tasks hold more GPU memory than their slice allows.

    A task over its allowance is warned once; if it is still over
    ``grace_s`` later it is stopped (or, when the slice is not enforced,
    only warned again). A task back under its allowance starts afresh.
    """

    def __init__(self) -> None:
        self._over_since: dict[object, float] = {}
        self._stopped: set[object] = set()

    def check(self, used_mib: Mapping[Any, float], slices: Mapping[Any, Slice], now: float) -> list[Verdict]:
        """The verdicts for this poll: ``used_mib`` is what each task holds, ``slices`` its slice."""
        verdicts = []
        for key in [k for k in self._over_since if k not in slices]:
            del self._over_since[key]
        for key, piece in slices.items():
            used = used_mib.get(key, 0.0)
            if used <= piece.allowed_mib or key in self._stopped:
                self._over_since.pop(key, None)
                continue
            words = (f"gpu memory: used {used / MIB_PER_GIB:.1f} GiB, over its slice of "
                     f"{piece.limit_mib / MIB_PER_GIB:.1f} GiB (+{piece.tolerance:.0%} tolerance)")
            since = self._over_since.get(key)
            if since is None:
                self._over_since[key] = now
                verdicts.append(Verdict(key, "warn", words))
            elif now - since >= piece.grace_s:
                if piece.enforce:
                    self._stopped.add(key)
                    verdicts.append(Verdict(key, "stop", words))
                else:
                    self._over_since[key] = now
                    verdicts.append(Verdict(key, "warn", words + "; not enforced"))
        return verdicts

    def forget(self, key: object) -> None:
        """Drop what is known of a task that ended."""
        self._over_since.pop(key, None)
        self._stopped.discard(key)
