"""Job order inside a queue: higher priority first, then earlier submission."""

from gpud import hookimpl


@hookimpl
def gpud_job_order_key(job):
    return (-job.priority, job.submitted, job.seq, job.id)
