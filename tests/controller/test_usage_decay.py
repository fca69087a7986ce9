"""The decay arithmetic of usage accounting: monotone, halving per half-life, and commuting with charging."""

from __future__ import annotations

import calendar
import math

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gpud.accounting.decay import charged, decay_factor, decayed, last_reset, scaled

HALF_LIVES = st.floats(min_value=1.0, max_value=3e7)
GAPS = st.floats(min_value=0.0, max_value=3e7)
AMOUNTS = st.tuples(*(st.floats(min_value=0.0, max_value=1e9),) * 3)
KEYS = st.tuples(st.sampled_from(["department", "project", "user"]), st.sampled_from(["default", "h100"]),
                 st.sampled_from(["a", "b", "a/alice", "b/bob"]))
ROWS = st.dictionaries(KEYS, AMOUNTS, max_size=8)
CHARGES = st.lists(st.tuples(KEYS, AMOUNTS), max_size=8)


def close(a: dict, b: dict) -> bool:
    if set(a) != set(b):
        return False
    return all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-6) for k in a for x, y in zip(a[k], b[k]))


@given(HALF_LIVES, GAPS, GAPS)
def test_decay_is_monotone_in_time(half_life, t1, t2):
    """Waiting longer never leaves more usage, and no wait leaves it unchanged."""
    lo, hi = sorted((t1, t2))
    assert decay_factor(hi, half_life) <= decay_factor(lo, half_life) <= 1.0
    assert decay_factor(0.0, half_life) == 1.0


@given(HALF_LIVES, st.integers(min_value=0, max_value=20))
def test_each_half_life_halves(half_life, n):
    assert math.isclose(decay_factor(n * half_life, half_life), 0.5 ** n, rel_tol=1e-9)


@given(HALF_LIVES, GAPS, GAPS)
def test_decay_in_two_steps_is_decay_in_one(half_life, a, b):
    assert math.isclose(decay_factor(a, half_life) * decay_factor(b, half_life), decay_factor(a + b, half_life),
                        rel_tol=1e-9, abs_tol=1e-300)


@settings(max_examples=examples(200))
@given(ROWS, CHARGES, HALF_LIVES, st.floats(min_value=0.0, max_value=1e6))
def test_charging_then_decaying_equals_decaying_then_charging_the_decayed_amount(rows, charges, half_life, gap):
    t0 = 1_700_000_000.0
    first = decayed(charged(rows, charges), t0, t0 + gap, half_life)
    factor = decay_factor((t0 + gap) - t0, half_life)  # the gap as the clock can hold it
    second = charged(decayed(rows, t0, t0 + gap, half_life), [(k, scaled(a, factor)) for k, a in charges])
    second = {k: a for k, a in second.items() if max(a) >= 1e-6}
    assert close(first, second)


@given(ROWS, HALF_LIVES, GAPS)
def test_decay_never_grows_any_amount(rows, half_life, gap):
    t0 = 1_700_000_000.0
    later = decayed(rows, t0, t0 + gap, half_life)
    for key, amount in later.items():
        assert all(new <= old for new, old in zip(amount, rows[key]))


def test_no_half_life_means_no_decay():
    rows = {("user", "default", "a/alice"): (10.0, 1.0, 2.0)}
    assert decayed(rows, 0.0, 1e9, 0.0) == rows


def test_reset_periods_start_usage_over_at_their_boundary():
    wed_noon = calendar.timegm((2026, 11, 25, 12, 0, 0))  # a Wednesday
    assert last_reset("daily", wed_noon) == calendar.timegm((2026, 11, 25, 0, 0, 0))
    assert last_reset("weekly", wed_noon) == calendar.timegm((2026, 11, 23, 0, 0, 0))
    assert last_reset("monthly", wed_noon) == calendar.timegm((2026, 11, 1, 0, 0, 0))
    assert last_reset("none", wed_noon) is None
    rows = {("project", "default", "a"): (100.0, 0.0, 0.0)}
    # Monday 10:00 to Wednesday noon crosses a daily boundary, not a weekly one.
    monday = calendar.timegm((2026, 11, 23, 10, 0, 0))
    assert decayed(rows, monday, wed_noon, 0.0, "daily") == {}
    assert decayed(rows, monday, wed_noon, 0.0, "weekly") == rows
    assert decayed(rows, monday - 86400, wed_noon, 0.0, "weekly") == {}
