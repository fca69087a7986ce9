"""The trace files the tests and bench/trace.py read ship with the project, unchanged, with their sources."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from trace_helpers import TRACE_DIR, TRACES

ROOT = Path(__file__).resolve().parents[2]


def _bench_trace():
    spec = importlib.util.spec_from_file_location("bench_trace", ROOT / "bench" / "trace.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_file_the_benchmark_reads_is_in_the_checkout(monkeypatch):
    monkeypatch.delenv("GPUD_TRACES", raising=False)
    bench = _bench_trace()
    wanted = [bench.NODES, bench.PUBLISHED, bench.QUOTAS] + [
        bench.pods_path(w) for w in ("default", "gpushare100", "multigpu50")]
    for path in map(Path, wanted):
        assert path.resolve().is_relative_to(ROOT), path
        assert path.is_file(), f"{path} is missing from the checkout"


def test_the_test_trace_is_read_from_the_checkout():
    assert TRACE_DIR.resolve().is_relative_to(ROOT)
    for name in ("openb_pod_list_default.csv", "openb_node_list_gpu_node.csv"):
        assert (TRACE_DIR / name).is_file(), f"{TRACE_DIR / name} is missing from the checkout"


def test_files_are_the_published_bytes():
    sums = (TRACES / "SHA256SUMS").read_text().split("\n")
    listed = [line.split(None, 1) for line in sums if line]
    assert len(listed) == 6
    for digest, name in listed:
        assert hashlib.sha256((TRACES / name.strip()).read_bytes()).hexdigest() == digest, name
    shipped = sorted(str(p.relative_to(TRACES)) for p in TRACES.rglob("*.csv"))
    assert shipped == sorted(name.strip().removeprefix("./") for _, name in listed)


def test_each_source_names_its_commit_and_licence():
    alibaba = (TRACES / "alibaba-gpu-v2023" / "README.md").read_text()
    assert "7a6c496e4f4b6ce6150be8f881cb051bf2abff42" in alibaba and "License" in alibaba
    helios = (TRACES / "helios-vc-quotas" / "README.md").read_text()
    assert "106713b0d0fc761c70073b4af018681656b60f48" in helios and "CC BY 4.0" in helios


def test_no_path_of_another_machine_is_written_into_the_project():
    machine_path = "/work" + "/shared"
    offenders = []
    for path in ROOT.rglob("*"):
        parts = path.relative_to(ROOT).parts
        if not path.is_file() or parts[0].startswith(".") or parts[0] in {"build", "dist"} or "__pycache__" in parts or path.suffix == ".csv":
            continue
        if path.suffix not in {".py", ".md", ".toml", ".txt", ".cfg", ".in", ".service", ".sh", ""}:
            continue
        if machine_path in path.read_text(errors="replace"):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
