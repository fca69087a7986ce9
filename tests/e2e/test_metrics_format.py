"""The /metrics pages follow Prometheus's exposition rules, as `promtool check metrics` checks them.

The controller's page is read from a real controller after jobs have run and
usage has been charged; the node's is rendered from a node's real parts.
Each page goes through the rules below (always) and through promtool itself
when it is installed (Debian's `prometheus` package has it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import urllib.request
from types import SimpleNamespace

import pytest

from daemons import POLICY, running_cluster, wait_for
from gpud.gpu.fake import FakeBackend
from gpud.node.metrics import render as render_node
from gpud.node.slicerun import GpuSlicer, PlanRecord

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
# promtool's lint: names carry base units (seconds, bytes, ratios), never these.
NOT_BASE_UNITS = ("milliseconds", "microseconds", "nanoseconds", "minutes", "hours", "days", "weeks",
                  "kilobytes", "megabytes", "gigabytes", "kibibytes", "mebibytes", "gibibytes", "bits", "percent")
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count", "")}


def exposition_problems(text: str) -> list[str]:
    """What breaks the text format's rules or promtool's lint in ``text``; [] when nothing does."""
    problems: list[str] = []
    helps: dict[str, str] = {}
    types: dict[str, str] = {}
    sampled: set[str] = set()
    series: set[str] = set()
    infinite: dict[str, set[str]] = {}
    if not text.endswith("\n"):
        problems.append("the page does not end with a newline")
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            _, word, name, *rest = line.split(" ", 3)
            value = rest[0] if rest else ""
            if not NAME.match(name):
                problems.append(f"bad metric name {name!r}")
            seen = helps if word == "HELP" else types
            if name in seen:
                problems.append(f"second {word} for {name}")
            if name in sampled:
                problems.append(f"{word} for {name} after its samples")
            seen[name] = value
            if word == "HELP" and not value.strip():
                problems.append(f"{name} has an empty HELP")
            if word == "TYPE" and value not in TYPES:
                problems.append(f"{name} has an unknown TYPE {value!r}")
            continue
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        if match is None:
            problems.append(f"bad sample line {line!r}")
            continue
        name, labels, value = match.groups()
        family = next((name[:-len(s)] for kind in ("histogram", "summary") for s in SUFFIXES[kind]
                       if s and name.endswith(s) and types.get(name[:-len(s)]) == kind), name)
        sampled.add(family)
        if family not in types:
            problems.append(f"{name} has no TYPE before its samples")
        if family not in helps:
            problems.append(f"{name} has no HELP")
        pairs = LABEL.findall(labels[1:-1]) if labels else []
        if labels and ",".join(f'{k}="{v}"' for k, v in pairs) != labels[1:-1]:
            problems.append(f"bad labels in {line!r}")
        if len({k for k, _ in pairs}) != len(pairs):
            problems.append(f"a label repeated in {line!r}")
        key = name + "{" + ",".join(sorted(f"{k}={v}" for k, v in pairs)) + "}"
        if key in series:
            problems.append(f"series {key} twice")
        series.add(key)
        try:
            float(value)
        except ValueError:
            problems.append(f"bad value in {line!r}")
        if types.get(family) == "histogram" and name.endswith("_bucket"):
            rest = ",".join(f"{k}={v}" for k, v in pairs if k != "le")
            if dict(pairs).get("le") == "+Inf":
                infinite.setdefault(family, set()).add(rest)
    for name, kind in types.items():
        if kind == "counter" and not name.endswith("_total"):
            problems.append(f"counter {name} should end in _total")
        if kind != "counter" and name.endswith("_total"):
            problems.append(f"{name} ends in _total but is a {kind}")
        for unit in NOT_BASE_UNITS:
            if re.search(rf"(^|_){unit}(_|$)", name):
                problems.append(f"{name} should use a base unit, not {unit}")
        if kind == "histogram" and name in sampled and not infinite.get(name):
            problems.append(f"histogram {name} has no +Inf bucket")
    return problems


def promtool_problems(text: str) -> str:
    """What `promtool check metrics` says about ``text`` ("" when it accepts it)."""
    done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    return "" if done.returncode == 0 else (done.stdout + done.stderr).strip() or f"exit {done.returncode}"


@pytest.mark.parametrize("text, says", [
    ("# HELP a_total x\n# TYPE a_total gauge\na_total 1\n", "ends in _total but is a gauge"),
    ("# HELP a x\n# TYPE a counter\na 1\n", "counter a should end in _total"),
    ("# HELP gpud_usage_gpu_hours x\n# TYPE gpud_usage_gpu_hours gauge\ngpud_usage_gpu_hours 1\n",
     "base unit, not hours"),
    ("# TYPE a gauge\na 1\n", "a has no HELP"),
    ("a 1\n# HELP a x\n# TYPE a gauge\n", "after its samples"),
    ('# HELP a x\n# TYPE a gauge\na{k="1"} 1\na{k="1"} 2\n', "twice"),
    ('# HELP a x\n# TYPE a gauge\na{k=1} 1\n', "bad labels"),
])
def test_the_rules_catch_what_promtool_refuses(text, says):
    assert any(says in problem for problem in exposition_problems(text)), exposition_problems(text)
    if shutil.which("promtool") and "after its samples" not in says and "twice" not in says:
        assert promtool_problems(text)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("metrics"), "usage_charge_interval = 0.5\n" + POLICY,
                         nodes={"n1": 2}) as live:
        yield live


def test_the_controllers_metrics_pass_after_jobs_have_run(cluster):
    done = [cluster.submit(command=["sh", "-c", f"sleep 1; exit {code}"], gpus=1) for code in (0, 3)]
    for job_id in done:
        cluster.wait_state(job_id, "COMPLETED", "FAILED")

    def page() -> str | None:
        with urllib.request.urlopen(f"{cluster.url}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        charged = re.search(r'^gpud_usage_gpu_\w+\{.*name="alpha"\} (\S+)$', text, re.M)
        return text if charged and float(charged.group(1)) > 0 else None
    text = wait_for(page, "usage to be charged and shown")
    assert re.search(r'^gpud_jobs_finished_total\{state="FAILED"\} 1$', text, re.M), text
    assert "gpud_scheduling_cycle_seconds_bucket" in text
    assert exposition_problems(text) == []
    if shutil.which("promtool"):
        assert promtool_problems(text) == ""


def test_the_node_metrics_pass(tmp_path):
    slicer = GpuSlicer(3, "strict", 0.05, 0.1)
    slicer.history.append(PlanRecord({"a": 0.25, "b": 0.75}, {"a": 0.25, "b": 0.75}, {"a": 1.3, "b": 3.7}, 5.0))
    agent = SimpleNamespace(
        config=SimpleNamespace(name="n1"), tasks=SimpleNamespace(states=lambda: []),
        backend=FakeBackend("n1", 4, str(tmp_path)),
        link=SimpleNamespace(connected=threading.Event(), registrations=2),
        slices=SimpleNamespace(slicers={3: slicer}))
    text = render_node(agent, started=0.0)
    assert exposition_problems(text) == []
    if shutil.which("promtool"):
        assert promtool_problems(text) == ""
