"""Time-slice plans as pure values: strict and fair shares, idle redistribution, carry-over, interleaving."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpud.node.slicer import (Holder, build_plan, clean_shares, fair_shares, interleave, next_carry, shares_for,
                              strict_shares, water_fill, with_carry)


def approx(mapping: dict[str, float]) -> dict:
    return {key: pytest.approx(value, abs=1e-9) for key, value in mapping.items()}


def test_strict_gives_each_exactly_its_request():
    holders = [Holder("a", 0.25, 0.25), Holder("b", 0.75, 0.75)]
    assert strict_shares(holders) == approx({"a": 0.25, "b": 0.75})


def test_strict_ignores_idleness_and_leaves_unrequested_time_idle():
    holders = [Holder("a", 0.25, 0.25, idle=True), Holder("b", 0.5, 0.5)]
    assert strict_shares(holders) == approx({"a": 0.25, "b": 0.5})


def test_strict_gives_unrequested_time_to_gpu_memory_jobs_up_to_their_limit():
    holders = [Holder("a", 0.5, 0.5), Holder("m1", 0.0, 1.0), Holder("m2", 0.0, 0.1)]
    assert strict_shares(holders) == approx({"a": 0.5, "m1": 0.4, "m2": 0.1})


def test_fair_with_everyone_busy_divides_spare_time_equally_up_to_limits():
    holders = [Holder("a", 0.2, 1.0), Holder("b", 0.4, 0.5)]
    # spare 0.4: 0.2 each, but b stops at 0.5, so a takes the rest
    assert fair_shares(holders, probe=0.05) == approx({"a": 0.5, "b": 0.5})


def test_fair_gives_an_idle_jobs_time_to_the_busy_ones_keeping_a_probe():
    holders = [Holder("a", 0.5, 1.0), Holder("b", 0.5, 1.0, idle=True)]
    assert fair_shares(holders, probe=0.05) == approx({"a": 0.95, "b": 0.05})


def test_fair_idle_time_is_split_equally_among_busy_jobs():
    holders = [Holder("a", 0.25, 1.0), Holder("b", 0.25, 1.0), Holder("c", 0.5, 1.0, idle=True)]
    assert fair_shares(holders, probe=0.1) == approx({"a": 0.45, "b": 0.45, "c": 0.1})


def test_fair_gives_what_busy_jobs_cannot_take_to_idle_ones():
    holders = [Holder("a", 0.5, 0.5), Holder("b", 0.5, 1.0, idle=True)]
    assert fair_shares(holders, probe=0.1) == approx({"a": 0.5, "b": 0.5})


def test_fair_weights_divide_the_spare_time():
    holders = [Holder("a", 0.0, 1.0, project="x"), Holder("b", 0.0, 1.0, project="y")]
    shares = fair_shares(holders, 0.05, weight=lambda h: 3.0 if h.project == "x" else 1.0)
    assert shares == approx({"a": 0.75, "b": 0.25})


def test_off_gives_everyone_the_whole_gpu():
    assert shares_for("off", [Holder("a", 0.5)], 0.05) == {"a": 1.0}


def test_water_fill_leaves_what_nobody_can_take():
    assert water_fill(1.0, {"a": 0.2, "b": 0.3}, {}) == approx({"a": 0.2, "b": 0.3})


def test_carry_corrects_and_never_overfills():
    holders = [Holder("a", 0.25, carry=0.03), Holder("b", 0.75, carry=-0.03)]
    assert with_carry({"a": 0.25, "b": 0.75}, holders, 0.05) == approx({"a": 0.28, "b": 0.72})
    big = [Holder("a", 0.5, carry=0.5), Holder("b", 0.5, carry=0.5)]
    assert sum(with_carry({"a": 0.5, "b": 0.5}, big, 1.0).values()) == pytest.approx(1.0)


def test_carry_is_clipped():
    holders = [Holder("a", 0.25, carry=0.5)]
    assert with_carry({"a": 0.25}, holders, 0.05) == approx({"a": 0.30})


def test_interleave_spreads_leases_rather_than_blocks():
    order = interleave({"a": 1, "b": 3})
    assert sorted(order) == ["a", "b", "b", "b"]
    assert order.count("a") == 1
    order = interleave({"a": 5, "b": 5})
    assert all(order[i] != order[i + 1] for i in range(len(order) - 1))


def test_plan_of_25_75_has_interleaved_leases_of_the_lease_length():
    plan = build_plan({"a": 0.25, "b": 0.75}, lease_s=0.25, precision=0.05)
    assert plan.plan_s == pytest.approx(5.0)
    assert [lease.holder for lease in plan.leases].count("a") == 5
    assert all(lease.seconds == pytest.approx(0.25) for lease in plan.leases)
    held = "".join(lease.holder for lease in plan.leases)
    assert "bbbb" not in held  # never more than three b leases in a row with 1:3
    assert sum(lease.seconds for lease in plan.leases) == pytest.approx(5.0)


def test_plan_with_unrequested_time_has_idle_leases():
    plan = build_plan({"a": 0.5}, lease_s=0.25, precision=0.05)
    assert {lease.holder for lease in plan.leases} == {"a", None}
    assert sum(lease.seconds for lease in plan.leases if lease.holder == "a") == pytest.approx(2.5)


def test_a_lone_holder_of_the_whole_gpu_gets_one_long_lease():
    plan = build_plan({"a": 1.0}, lease_s=0.25, precision=0.05)
    assert [(lease.holder, lease.seconds) for lease in plan.leases] == [("a", pytest.approx(5.0))]


def test_shares_that_are_not_multiples_of_the_precision_are_exact_in_time():
    plan = build_plan({"a": 0.263, "b": 0.737}, lease_s=0.25, precision=0.05)
    assert sum(lease.seconds for lease in plan.leases if lease.holder == "a") == pytest.approx(0.263 * 5.0)


def test_next_carry_owes_the_shortfall_and_ignores_uniform_loss():
    plan = build_plan({"a": 0.25, "b": 0.75}, 0.25, 0.05)
    holders = [Holder("a", 0.25), Holder("b", 0.75)]
    # both lost 10 % alike: nobody is owed anything
    assert next_carry(plan, {"a": 1.125, "b": 3.375}, holders, 0.05) == approx({"a": 0.0, "b": 0.0})
    # a got 20 % instead of 25 %
    assert next_carry(plan, {"a": 1.0, "b": 4.0}, holders, 0.1) == approx({"a": 0.05, "b": -0.05})


def test_next_carry_owes_idle_holders_nothing():
    plan = build_plan({"a": 0.95, "b": 0.05}, 0.25, 0.05)
    holders = [Holder("a", 0.5), Holder("b", 0.5, idle=True)]
    assert next_carry(plan, {"a": 4.75, "b": 0.0}, holders, 0.05) == approx({"a": 0.0, "b": 0.0})


shares_in = st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1), st.booleans()), min_size=1, max_size=6)


@given(shares_in)
def test_shares_never_exceed_the_gpu_nor_limits_and_fair_covers_busy_requests(raw):
    total = sum(r for r, _, _ in raw) or 1.0
    holders = [Holder(str(i), r / max(total, 1.0), max(l, r / max(total, 1.0)), idle=idle)
               for i, (r, l, idle) in enumerate(raw)]
    for shares in (strict_shares(holders), fair_shares(holders, 0.05)):
        assert sum(shares.values()) <= 1.0 + 1e-6
        for h in holders:
            assert -1e-9 <= shares[h.key] <= h.limit + 1e-9
    fair = fair_shares(holders, 0.05)
    for h in holders:
        if not h.idle:
            assert fair[h.key] >= h.request - 1e-9


@given(st.dictionaries(st.sampled_from("abcdef"), st.floats(0.01, 1), min_size=1))
def test_plans_give_each_holder_its_target_time(raw):
    total = sum(raw.values())
    targets = {k: v / max(total, 1.0) for k, v in raw.items()}
    plan = build_plan(targets, 0.1, 0.05)
    for key, share in targets.items():
        assert sum(l.seconds for l in plan.leases if l.holder == key) == pytest.approx(share * plan.plan_s)


def test_clean_shares_keeps_a_plugins_answer_runnable():
    holders = [Holder("a", 0.5), Holder("b", 0.5)]
    assert clean_shares({"a": 2.0, "b": 2.0, "zz": 1.0}, holders) == approx({"a": 0.5, "b": 0.5})
    assert clean_shares({"a": -1.0, "b": 0.3}, holders) == approx({"a": 0.0, "b": 0.3})


def test_a_plan_record_reports_its_error_in_points_of_the_plan():
    from gpud.node.slicerun import PlanRecord

    record = PlanRecord({"a": 0.25, "b": 0.75}, {"a": 0.25, "b": 0.75}, {"a": 1.4, "b": 3.6}, 5.0)
    assert abs(record.error_pp() - 3.0) < 1e-9
