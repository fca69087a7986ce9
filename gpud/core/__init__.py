"""The pure scheduling core: a snapshot and a policy in, a plan out; no I/O, no clock."""

import gpud.core.cycle as _cycle
from gpud.core.cycle import Scheduler, schedule

# True in an installation built with GPUD_COMPILE=1, where mypyc compiled the core to C extensions.
COMPILED = not _cycle.__file__.endswith(".py")

__all__ = ["COMPILED", "Scheduler", "schedule"]
