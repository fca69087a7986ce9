"""Job order inside a queue: higher priority first, then earlier submission."""

from gpud import hookimpl
from gpud.core.orders import NATIVE, job_order_key


@hookimpl
def gpud_job_order_key(job):
    return job_order_key(job)


setattr(gpud_job_order_key, NATIVE, job_order_key)  # the core may call it directly (gpud.core.hooks.first_result)
