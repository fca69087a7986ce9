"""The benchmark's PASS/FAIL line: each placement against the best published policy at each load."""

from __future__ import annotations

from gpud.trace.published import PublishedRow
from gpud.trace.run import FillSummary
from gpud.trace.verdict import verdict_json, verdict_text, versus_published

PUBLISHED = [PublishedRow("default", "05-BestFit", {80: 80.02, 90: 89.99, 130: 93.08}),
             PublishedRow("default", "06-FGD", {80: 80.02, 90: 89.98, 130: 95.39})]


def summary(name: str, at80: float, at90: float, at130: float) -> FillSummary:
    levels = {50: 50.0, 80: at80, 90: at90, 100: 90.0, 110: 91.0, 120: 92.0, 130: at130}
    return FillSummary(name, [52], levels, {k: 0.0 for k in levels}, 1.0)


def test_each_level_is_judged_against_the_best_published_policy_there():
    verdicts = versus_published([summary("fragaware", 79.98, 90.02, 95.30), summary("binpack", 79.70, 90.0, 93.9)],
                                PUBLISHED)
    got = {(v.placement, v.level): (v.best_policy, v.passed) for v in verdicts}
    assert got == {("fragaware", 80): ("05-BestFit", True), ("fragaware", 90): ("05-BestFit", True),
                   ("fragaware", 130): ("06-FGD", False), ("binpack", 80): ("05-BestFit", False),
                   ("binpack", 90): ("05-BestFit", True), ("binpack", 130): ("06-FGD", False)}
    text = verdict_text(verdicts)
    assert "FAIL fragaware" in text and "130% FAIL 95.30 vs 95.39 06-FGD" in text and "80% PASS 79.98" in text
    assert verdict_json(verdicts)[0] == {"placement": "fragaware", "level": 80, "alloc_pct": 79.98,
                                         "best_published": "05-BestFit", "best_published_pct": 80.02, "passed": True}


def test_a_placement_that_matches_the_best_everywhere_passes_and_levels_without_figures_are_left_out():
    verdicts = versus_published([summary("fragaware", 80.02, 90.0, 95.4)],
                                [PublishedRow("default", "06-FGD", {80: 80.02, 130: 95.39})])
    assert [(v.level, v.passed) for v in verdicts] == [(80, True), (130, True)]
    assert verdict_text(verdicts).splitlines()[1].startswith("  PASS fragaware")
