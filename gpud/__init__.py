"""gpud: a Slurm-style batch scheduler for shared GPU servers on bare metal."""

import pluggy

__version__ = "0.1.0"

hookimpl = pluggy.HookimplMarker("gpud")
"""Marks a function as an implementation of a gpud hook: ``@hookimpl``."""

__all__ = ["__version__", "hookimpl"]
