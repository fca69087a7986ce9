"""Whether each of gpud's placements allocates at least as much as the best published policy, load by load."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from gpud.trace.published import PublishedRow
from gpud.trace.run import FillSummary

COMPARED_LEVELS = (80, 90, 130)
TOLERANCE = 0.05


@dataclass(frozen=True, slots=True)
class Verdict:
    """One gpud placement at one arrived-load level against the best published policy there."""

    placement: str
    level: int
    alloc_pct: float
    best_policy: str
    best_pct: float
    passed: bool


def versus_published(summaries: Sequence[FillSummary], published: Sequence[PublishedRow],
                     levels: Sequence[int] = COMPARED_LEVELS, tolerance: float = TOLERANCE) -> list[Verdict]:
    """Per placement and level (those the published rows give): passed when gpud's mean allocation is
    at least the best published mean less ``tolerance`` points."""
    out = []
    for summary in summaries:
        for level in levels:
            rows = [p for p in published if level in p.alloc_pct]
            if not rows or level not in summary.alloc_pct:
                continue
            best = max(rows, key=lambda p: p.alloc_pct[level])
            mine = summary.alloc_pct[level]
            out.append(Verdict(summary.strategy, level, mine, best.policy, best.alloc_pct[level],
                               mine >= best.alloc_pct[level] - tolerance))
    return out


def verdict_json(verdicts: Sequence[Verdict]) -> list[dict]:
    """The verdicts as JSON-ready records."""
    return [{"placement": v.placement, "level": v.level, "alloc_pct": round(v.alloc_pct, 3),
             "best_published": v.best_policy, "best_published_pct": v.best_pct, "passed": v.passed}
            for v in verdicts]


def verdict_text(verdicts: Sequence[Verdict], tolerance: float = TOLERANCE) -> str:
    """One line per placement: PASS or FAIL at each level against the best published policy."""
    lines = [f"Against the best published policy at each arrived load (PASS: within {tolerance:g} points or above):"]
    placements = list(dict.fromkeys(v.placement for v in verdicts))
    for placement in placements:
        mine = [v for v in verdicts if v.placement == placement]
        overall = "PASS" if all(v.passed for v in mine) else "FAIL"
        parts = [f"{v.level}% {'PASS' if v.passed else 'FAIL'} {v.alloc_pct:.2f} vs {v.best_pct:.2f} {v.best_policy}"
                 for v in mine]
        lines.append(f"  {overall} {placement:<10} " + " | ".join(parts))
    return "\n".join(lines)
