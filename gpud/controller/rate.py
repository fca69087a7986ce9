"""Per-token submit rate limits: a token bucket for each user, off unless the controller's config sets a rate."""

from __future__ import annotations

import time
from typing import Callable


class SubmitRate:
    """How many jobs each user may submit: ``rate`` per second on average, ``burst`` at once (rate 0: no limit)."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst or rate
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, user: str, jobs: int) -> float:
        """Take ``jobs`` from ``user``'s bucket; 0.0 when allowed, else the seconds to wait before trying again."""
        if self.rate <= 0:
            return 0.0
        now = self.clock()
        level, since = self._buckets.get(user, (self.burst, now))
        level = min(self.burst, level + (now - since) * self.rate)
        if jobs > level:
            self._buckets[user] = (level, now)
            return (jobs - level) / self.rate if jobs <= self.burst else float("inf")
        self._buckets[user] = (level - jobs, now)
        return 0.0
