"""Job order inside a queue: higher priority first, then earlier submission."""

from gpud import hookimpl
from gpud.core.orders import PriorityJobOrder


class JobOrderPlugin(PriorityJobOrder):
    """The built-in job order (``PriorityJobOrder``); the core calls its ``key`` itself."""

    @hookimpl
    def gpud_job_order_key(self, job):
        return self.key(job)


PLUGIN = JobOrderPlugin()
