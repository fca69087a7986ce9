"""Prometheus text exposition, written by hand: counters, gauges and histograms with labels."""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Iterable

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Histogram:
    """A Prometheus histogram per label set (cumulative buckets, sum and count)."""

    def __init__(self, name: str, help_text: str, label: str, buckets: tuple[float, ...] = LATENCY_BUCKETS):
        self.name, self.help, self.label, self.buckets = name, help_text, label, buckets
        self.counts: dict[str, list[int]] = defaultdict(lambda: [0] * (len(buckets) + 1))
        self.sums: dict[str, float] = defaultdict(float)

    def observe(self, value: float, label: str = "") -> None:
        """Count one observation."""
        self.counts[label][bisect.bisect_left(self.buckets, value)] += 1
        self.sums[label] += value

    def render(self) -> list[str]:
        """The histogram's exposition lines."""
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for label, counts in sorted(self.counts.items()):
            prefix = f'{self.label}="{escape(label)}",' if self.label else ""
            total = 0
            for bound, count in zip(self.buckets, counts):
                total += count
                lines.append(f'{self.name}_bucket{{{prefix}le="{bound}"}} {total}')
            total += counts[-1]
            lines.append(f'{self.name}_bucket{{{prefix}le="+Inf"}} {total}')
            braces = f"{{{prefix.rstrip(',')}}}" if prefix else ""
            lines.append(f"{self.name}_sum{braces} {self.sums[label]:.6f}")
            lines.append(f"{self.name}_count{braces} {total}")
        return lines


def metric(name: str, kind: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]) -> list[str]:
    """The exposition lines of one gauge or counter with its labelled samples."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        inner = ",".join(f'{key}="{escape(str(val))}"' for key, val in labels.items())
        lines.append(f"{name}{{{inner}}} {value:g}" if inner else f"{name} {value:g}")
    return lines


def escape(text: str) -> str:
    """A label value escaped for the text format."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
