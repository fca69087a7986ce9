"""The controller's record of a node: what it reported, whether it takes work, what it is still stopping."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from gpud import jsontext
from gpud.controller import node_schema
from gpud.model import NodeSpec

UP = "up"
DOWN = "down"
UNKNOWN = "unknown"        # known from the store, not registered since the controller started


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU as its node reported it."""

    index: int
    uuid: str
    model: str = ""
    memory_gib: float = 80.0
    healthy: bool = True


@dataclass(slots=True)
class NodeRecord:
    """A node: inventory, liveness, drain, and task incarnations it still has to stop.

    ``reason`` is what the API shows: why the node is down, else why it is
    drained (``drain_reason``, kept for when a down node comes back).

    ``stopping`` maps "job/task/attempt" to the GPU indices that incarnation
    holds until the node reports it gone; a start on those GPUs waits.
    """

    name: str
    pool: str = "default"
    labels: dict[str, str] = field(default_factory=dict)
    cpus: float = 0.0
    memory_gib: float = 0.0
    gpus: list[Gpu] = field(default_factory=list)
    state: str = UNKNOWN
    reason: str = ""
    drain: bool = False
    last_seen: float = 0.0
    registered: float | None = None
    address: str = ""
    stopping: dict[str, list[int]] = field(default_factory=dict)
    drain_reason: str = ""
    limits: list[str] = field(default_factory=list)  # what the node's task cgroups enforce; empty: nothing
    limits_how: str = ""
    gpu_measures: list[str] | None = None  # what its GPU backend measures of each process; None: not said

    def spec(self) -> NodeSpec:
        """The node as the scheduling core sees it: unhealthy GPUs out of service, only an up, undrained node takes work."""
        memory = min((gpu.memory_gib for gpu in self.gpus), default=80.0)
        labels = dict(self.labels)
        labels.setdefault("pool", self.pool)
        faulty = tuple(position for position, gpu in enumerate(self.gpus) if not gpu.healthy)
        return NodeSpec(name=self.name, gpus=len(self.gpus), gpu_memory_gib=memory, cpus=self.cpus,
                        memory_gib=self.memory_gib, pool=self.pool, labels=labels,
                        schedulable=self.state == UP and not self.drain, out_of_service=faulty)

    def inventory(self) -> tuple:
        """What the scheduler depends on: a change means the scheduler must be rebuilt."""
        return (self.pool, tuple(sorted(self.labels.items())), self.cpus, self.memory_gib,
                tuple(self.gpus), self.state, self.drain)

    def uuids(self, indices: tuple[int, ...]) -> list[str]:
        """The UUIDs of the GPUs at ``indices``."""
        by_index = {gpu.index: gpu.uuid for gpu in self.gpus}
        return [by_index.get(i, f"GPU-unknown-{i}") for i in indices]

    def busy_gpus(self) -> set[int]:
        """GPU indices held by incarnations still being stopped."""
        return {i for indices in self.stopping.values() for i in indices}

    def display_state(self, busy: bool) -> str:
        """up, down, unknown, drained (drained and empty) or draining (drained, jobs still running)."""
        if self.state != UP or not self.drain:
            return self.state
        return "draining" if busy or self.stopping else "drained"

    def to_json(self) -> str:
        """The record as JSON for the store (what ``from_json`` reads back)."""
        # Field by field, not dataclasses.asdict: its deep copy made a node's record cost 0.7 ms, paid for every
        # node that registers and for every stop a node is sent.
        record = {name: getattr(self, name) for name in _RECORD_FIELDS}
        record["gpus"] = [{name: getattr(gpu, name) for name in _GPU_FIELDS} for gpu in self.gpus]
        return jsontext.dumps(record)

    @classmethod
    def from_json(cls, text: str) -> NodeRecord:
        """The record back from ``to_json``; a node read back is UNKNOWN until it registers again."""
        data = json.loads(text)
        gpus = [Gpu(**gpu) for gpu in data.pop("gpus")]
        record = cls(gpus=gpus, **data)
        if record.drain and not record.drain_reason:
            record.drain_reason = record.reason  # written before the drain's reason was kept apart
        if record.state == UP:
            record.state = UNKNOWN
        return record


_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(NodeRecord))
_GPU_FIELDS = tuple(f.name for f in dataclasses.fields(Gpu))


def gpus_from_report(items: Any) -> list[Gpu]:
    """GPUs from a register or heartbeat message; raises ValueError naming what is malformed."""
    if not isinstance(items, list):
        raise ValueError("gpus must be a list")
    gpus = []
    for number, item in enumerate(items):
        where = f"gpus[{number}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: a GPU is a JSON object")
        gpus.append(Gpu(index=node_schema.index(item, "index", where), uuid=str(item.get("uuid", "")),
                        model=str(item.get("model", "")),
                        memory_gib=node_schema.quantity(item, "memory_gib", 80.0, where),
                        healthy=bool(item.get("healthy", True))))
    return sorted(gpus, key=lambda gpu: gpu.index)


def incarnation_key(job: str, task: int, attempt: int) -> str:
    """The key of one task incarnation in ``NodeRecord.stopping``."""
    return f"{job}/{task}/{attempt}"
