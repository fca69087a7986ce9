"""docs/grafana/gpud.json reads only metrics the controller and node daemon expose."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "gpud.json"
DECLARED = re.compile(r'(metric|Histogram)\(\s*"(gpud_\w+)"')
QUERIED = re.compile(r"\bgpud_\w+")


def exposed() -> set[str]:
    """Every metric name the code declares; a histogram's series too."""
    names: set[str] = set()
    for path in (ROOT / "gpud").rglob("*.py"):
        for kind, name in DECLARED.findall(path.read_text()):
            names.add(name)
            if kind == "Histogram":
                names.update(f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
    return names


def queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def test_every_queried_metric_is_exposed() -> None:
    known = exposed()
    unknown = {name for expr in queries() for name in QUERIED.findall(expr)} - known
    assert not unknown, f"the dashboard queries metrics no code exposes: {sorted(unknown)}"


def test_the_dashboard_covers_the_main_families() -> None:
    text = " ".join(queries())
    for family in ("gpud_jobs", "gpud_gpus_allocated", "gpud_gpus_idle", "gpud_gpus_unhealthy",
                   "gpud_queue_fair_share_gpus", "gpud_queue_allocated_gpus", "gpud_scheduling_cycle_seconds",
                   "gpud_evictions_total", "gpud_api_request_seconds", "gpud_node_tasks", "gpud_node_gpus"):
        assert family in text


def test_panels_have_unique_ids_and_a_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["templating"]["list"][0]["type"] == "datasource"
