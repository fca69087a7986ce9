"""The FGD paper's published fill results (mean over seeds 42-51), to set gpud's figures beside."""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass

PUBLISHED_NAME = "fgd_atc23_expected_results_summary.csv"


@dataclass(frozen=True, slots=True)
class PublishedRow:
    """One policy on one workload: allocation ratio (%) at each arrived-load level (%)."""

    workload: str
    policy: str
    alloc_pct: dict[int, float]


def workload_name(trace_path: str) -> str:
    """The workload a pod list holds, from its file name (``openb_pod_list_default.csv`` -> ``default``)."""
    base = os.path.basename(trace_path)
    found = re.match(r"openb_pod_list_(.+)\.csv$", base)
    return found.group(1) if found else os.path.splitext(base)[0]


def default_published_path(trace_path: str) -> str | None:
    """The published summary beside a trace's ``csv/`` folder (``../published/``), when it is there."""
    candidate = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(trace_path))), "published",
                             PUBLISHED_NAME)
    return candidate if os.path.exists(candidate) else None


def read_published(path: str, workload: str) -> list[PublishedRow]:
    """The published rows of one workload, in file order (policies such as ``05-BestFit``)."""
    rows = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if row["workload"] != workload:
                continue
            levels = {int(k.rsplit("_", 1)[1]): float(v) for k, v in row.items()
                      if k.startswith("alloc_pct_at_arrived_") and v not in ("", None)}
            rows.append(PublishedRow(row["workload"], row["policy"], levels))
    return rows
