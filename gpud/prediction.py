"""Predicted run times from users' finished jobs, for start estimates (never to stop a job).

Users ask for time limits far above what their jobs run, and a user's next
job tends to run as long as the last ones of its kind (Tsafrir et al. 2007):
a job's run time is predicted as the mean of its user's last two jobs of its
shape (the GPUs per task and the tasks), capped at its limit. In
``bench/reservations.py`` this did better than the user's median share of the
limit (0.19 of estimates within the bound against 0.15). Nothing here stops
a job: its time limit does.
"""

from __future__ import annotations

from typing import Final

KEPT: Final = 2  # run times kept per user and shape


class RuntimePredictor:
    """Each user's last run times by job shape; the controller and the replays keep one each."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, float, int], list[float]] = {}

    def record(self, user: str, gpus: float, tasks: int, runtime: float) -> None:
        """Remember that a job of ``user`` of ``tasks`` tasks of ``gpus`` GPUs ran ``runtime`` seconds."""
        if runtime <= 0:
            return
        runs = self._runs.setdefault((user, gpus, tasks), [])
        runs.append(runtime)
        del runs[:-KEPT]

    def predict(self, user: str, gpus: float, tasks: int, limit: float | None) -> float | None:
        """The predicted run time of such a job, at most ``limit``; None when the user ran none of its shape."""
        runs = self._runs.get((user, gpus, tasks))
        if not runs:
            return None
        guess = sum(runs) / len(runs)
        return min(guess, limit) if limit is not None else guess
