"""The pure scheduling core: a snapshot and a policy in, a plan out; no I/O, no clock."""

from gpud.core.cycle import Scheduler, schedule

__all__ = ["Scheduler", "schedule"]
