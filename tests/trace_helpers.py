"""Small trace files written in tests, in the Alibaba v2023 CSV format."""

from __future__ import annotations

from pathlib import Path

POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
# The trace files ship with the project (traces/, with their sources and licences), read from this checkout.
TRACES = Path(__file__).resolve().parent.parent / "traces"
TRACE_DIR = TRACES / "alibaba-gpu-v2023" / "csv"


def write_pods(path: Path, rows: list[tuple]) -> str:
    """A pod list: rows of (name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, qos, phase,
    creation, deletion, scheduled); None is written as an empty cell."""
    lines = [POD_HEADER] + [",".join("" if v is None else str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def write_nodes(path: Path, rows: list[tuple]) -> str:
    """A node list: rows of (sn, cpu_milli, memory_mib, gpu, model)."""
    path.write_text("\n".join([NODE_HEADER] + [",".join(map(str, r)) for r in rows]) + "\n")
    return str(path)
