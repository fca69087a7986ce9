"""The node daemon's /metrics page, rendered from a node's real parts."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from gpud.gpu.fake import FakeBackend
from gpud.node.metrics import render
from gpud.node.slicerun import GpuSlicer, PlanRecord


def test_the_time_slicing_error_of_each_shared_gpus_last_plan_is_exposed(tmp_path):
    slicer = GpuSlicer(3, "strict", 0.05, 0.1)
    slicer.history.append(PlanRecord({"a": 0.25, "b": 0.75}, {"a": 0.25, "b": 0.75}, {"a": 1.3, "b": 3.7}, 5.0))
    agent = SimpleNamespace(
        config=SimpleNamespace(name="n1"), tasks=SimpleNamespace(states=lambda: []),
        backend=FakeBackend("n1", 4, str(tmp_path)),
        link=SimpleNamespace(connected=threading.Event(), registrations=2),
        slices=SimpleNamespace(slicers={3: slicer}))
    text = render(agent, started=0.0)
    assert 'gpud_node_timeslice_error_pp{node="n1",gpu="3"} 1' in text
    assert 'gpud_node_gpus{node="n1",health="healthy"} 4' in text
