"""The one wire schema: every message gpuctl, the controller, the node and its supervisors exchange.

``gpud.wire.job`` holds the job request (client to controller), ``gpud.wire.task``
the task start and stop orders (controller to node) and the task report
(node to controller) with their run state and exit cause; ``gpud.wire.fields``
the declarations they are made of, which decode, encode and describe them
(JSON Schema) alike.
"""

from gpud.wire.fields import WireError
from gpud.wire.job import JobRequest, job_request_schema
from gpud.wire.task import (ExitCause, MemorySliceSpec, RunState, TaskReport, TaskSpec, TaskStart, TaskStop,
                            TimeSlicingSpec)

__all__ = ["ExitCause", "JobRequest", "MemorySliceSpec", "RunState", "TaskReport", "TaskSpec", "TaskStart",
           "TaskStop", "TimeSlicingSpec", "WireError", "job_request_schema"]
