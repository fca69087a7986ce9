"""Victim order: lowest priority first, then the most recently started (least work lost)."""

from gpud import hookimpl


@hookimpl
def gpud_victim_order_key(victim):
    return (victim.job.priority, -victim.started, -victim.job.seq, victim.job.id)
