"""Reading the Alibaba GPU trace v2023 ("openb") into gpud nodes and single-task jobs."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from typing import Iterable

from gpud.model import JobSpec, NodeSpec, TaskRequest

MIB_PER_GIB = 1024.0
MODEL_LABEL = "gpu_model"
# The trace does not give GPU memory; these are the public sizes of the named models, and
# 32 GiB for the undisclosed G1-G3. Only memory-slice requests would read them; the trace has none.
GPU_MEMORY_GIB = {"V100M16": 16.0, "V100M32": 32.0, "P100": 16.0, "T4": 16.0, "A10": 24.0}
DEFAULT_GPU_MEMORY_GIB = 32.0
# QoS to priority: the trace README's proposal (not trace semantics). LS and Guaranteed are
# non-preemptible (inference class), Burstable is the default train class, BE is preemptible below it.
QOS_PRIORITY = {"Guaranteed": 125, "LS": 125, "Burstable": 50, "BE": 25}


@dataclass(frozen=True, slots=True)
class TracePod:
    """One row of a pod list: what it asks for and when it came, started and ended in production."""

    name: str
    cpus: float
    memory_gib: float
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...]
    qos: str
    phase: str
    created: float
    scheduled: float | None
    deleted: float | None

    @property
    def gpus(self) -> float:
        """The GPUs asked for: a fraction below 1, or a whole number (0 for CPU-only pods)."""
        if self.num_gpu == 1 and 0 < self.gpu_milli < 1000:
            return self.gpu_milli / 1000.0
        return float(self.num_gpu)

    @property
    def gpu_milli_total(self) -> int:
        """The request in thousandths of a GPU, as the FGD paper counts arrived load."""
        return self.num_gpu * self.gpu_milli if self.num_gpu else 0

    @property
    def duration(self) -> float | None:
        """How long it ran in production (deletion minus scheduling), None when it never started."""
        if self.scheduled is None or self.deleted is None:
            return None
        return max(0.0, self.deleted - self.scheduled)

    def request(self) -> TaskRequest:
        """The pod as a gpud task request."""
        return TaskRequest(gpus=self.gpus, cpus=self.cpus, memory_gib=self.memory_gib)

    def selector(self) -> dict[str, str]:
        """The node selector of a single-model constraint ({} when any model will do).

        A constraint naming several models cannot be one selector; ``selectors``
        lists them, and placement tries each.
        """
        return {MODEL_LABEL: self.gpu_spec[0]} if len(self.gpu_spec) == 1 else {}


def _float(value: str) -> float | None:
    return float(value) if value not in ("", None) else None


def read_pods(path: str) -> list[TracePod]:
    """Every pod of an ``openb_pod_list_*.csv`` file, in file order."""
    pods = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            spec = tuple(s for s in (row.get("gpu_spec") or "").split("|") if s)
            pods.append(TracePod(row["name"], int(row["cpu_milli"]) / 1000.0,
                                 int(row["memory_mib"]) / MIB_PER_GIB, int(row["num_gpu"]),
                                 int(row["gpu_milli"]), spec, row.get("qos", ""), row.get("pod_phase", ""),
                                 float(row.get("creation_time") or 0), _float(row.get("scheduled_time", "")),
                                 _float(row.get("deletion_time", ""))))
    return pods


def read_nodes(path: str, pool: str = "default") -> list[NodeSpec]:
    """Every node of an ``openb_node_list_*.csv`` file as a NodeSpec labelled with its GPU model."""
    nodes = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            model = row.get("model") or ""
            labels = {MODEL_LABEL: model} if model else {}
            nodes.append(NodeSpec(row["sn"], gpus=int(row["gpu"]),
                                  gpu_memory_gib=GPU_MEMORY_GIB.get(model, DEFAULT_GPU_MEMORY_GIB),
                                  cpus=int(row["cpu_milli"]) / 1000.0,
                                  memory_gib=int(row["memory_mib"]) / MIB_PER_GIB, pool=pool, labels=labels))
    return nodes


def pod_job(pod: TracePod, job_id: str, project: str, submitted: float, seq: int,
            priority: int | None = None, model: str | None = None) -> JobSpec:
    """A pending single-task job for ``pod``; ``model`` picks one of its allowed GPU models."""
    selector = {MODEL_LABEL: model} if model else pod.selector()
    return JobSpec(job_id, project, pod.request(), priority=QOS_PRIORITY.get(pod.qos, 50) if priority is None
                   else priority, submitted=submitted, node_selector=selector, seq=seq)


def total_gpus(nodes: Iterable[NodeSpec]) -> int:
    """The GPUs of a set of nodes."""
    return sum(n.usable_gpus for n in nodes)


def workload_profile(pods: Iterable[TracePod]):
    """The trace's typical requests for the fragmentation-aware placement, as FGD derives them."""
    from gpud.policies.fragaware import profile_of, shape_of
    return profile_of([shape_of(p.request(), p.selector()) for p in pods])


def trace_plugin(pods: Iterable[TracePod]):
    """A fragmentation-aware placement plugin that knows the trace's typical requests.

    Registered after the built-ins, it answers for ``fragaware`` and ``fgd``
    in their place.
    """
    from gpud.policies.fragaware import FragAware
    return FragAware(workload_profile(pods))
