"""Usage accounting: decayed GPU, CPU and memory time per user, project, department and node pool."""

from gpud.accounting.decay import LEVELS, RESETS, UsageKey, decay_factor, last_reset

__all__ = ["LEVELS", "RESETS", "UsageKey", "decay_factor", "last_reset"]
