"""When the dashboard's watcher may push a change to the open pages: a CPU budget with a floor and a ceiling.

Pushes are paid for out of a share of the CPU the rest of the controller
spends, saved up to a few pushes' worth while the cluster is quiet. So a
change on a quiet cluster goes out at once; under a steady stream of
changes pushes come as often as the budget pays for them, never more often
than every ``min_gap`` seconds and never less often than every ``max_gap``
seconds; and open dashboards cost at most a few per cent of what the
controller spends on its own work, however busy it is.
"""

from __future__ import annotations

SHARE = 0.02          # pushes may take this much of the CPU the controller spends on everything else
MIN_GAP_S = 2.0       # at most one push this often, however cheap
MAX_GAP_S = 10.0      # a change is pushed this soon at the latest, whatever it costs
SAVED_PUSHES = 3      # a quiet spell saves this many pushes' worth, to go out as soon as changes come


class PushBudget:
    """The CPU the pushes may still take, earned from the controller's own use and spent on each push."""

    def __init__(self, share: float = SHARE, min_gap: float = MIN_GAP_S, max_gap: float = MAX_GAP_S,
                 saved: int = SAVED_PUSHES) -> None:
        self.share, self.min_gap, self.max_gap, self.saved = share, min_gap, max_gap, saved
        self.credit = 0.0                 # CPU seconds the pushes may still take
        self.cost = 0.0                   # what a push takes, as lately seen (CPU seconds)
        self.spent = 0.0                  # CPU seconds all pushes took
        self.pushed = float("-inf")       # when the last push was made
        self._rest: float | None = None   # the controller's CPU seconds at the last earn, the pushes' own left out

    def earn(self, process_cpu: float) -> None:
        """Credit the share of the CPU the controller spent since the last call (``process_cpu``: its CPU
        seconds so far, the pushes' included; they are left out), saving at most ``saved`` pushes' worth."""
        rest = process_cpu - self.spent
        if self._rest is not None:
            self.credit = min(self.credit + self.share * max(0.0, rest - self._rest), self.saved * self.cost)
        self._rest = rest

    def may_push(self, now: float) -> bool:
        """Whether a change may be pushed at ``now`` (seconds, any monotonic clock)."""
        gap = now - self.pushed
        return gap >= self.min_gap and (self.credit >= self.cost or gap >= self.max_gap)

    def paid(self, now: float, cost: float) -> None:
        """A push made at ``now`` took ``cost`` CPU seconds."""
        self.pushed = now
        self.charge(cost)
        self.cost = cost if self.cost == 0.0 else (self.cost + cost) / 2

    def charge(self, cost: float) -> None:
        """The open streams took ``cost`` CPU seconds besides a push (keeping them open, ending them)."""
        self.credit -= cost
        self.spent += cost
