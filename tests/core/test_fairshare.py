"""Fair share: the water-filling arithmetic, and the department/project hierarchy through scenarios."""

from __future__ import annotations

import pytest

from gpud.core.fairshare import Claim, divide, water_fill
from sched_helpers import fair_share, gpus, queue, reason, run

INF = float("inf")


def claim(quota=0.0, weight=1.0, priority=0, cap=INF) -> Claim:
    return Claim(quota=quota, weight=weight, priority=priority, cap=cap)


# --- water_fill ---------------------------------------------------------------------------------

def test_water_fill_divides_by_weight():
    assert water_fill(8, [3, 1], [INF, INF]) == pytest.approx([6, 2])


def test_water_fill_gives_what_a_capped_entry_cannot_take_to_the_others():
    assert water_fill(10, [1, 1, 1], [2, INF, INF]) == pytest.approx([2, 4, 4])


def test_water_fill_gives_weight_zero_nothing():
    assert water_fill(10, [1, 0, 1], [INF, INF, INF]) == pytest.approx([5, 0, 5])


def test_water_fill_never_hands_out_more_than_the_amount_nor_more_than_caps():
    given = water_fill(10, [1, 2], [2, 3])
    assert given == pytest.approx([2, 3])
    assert sum(water_fill(7, [1, 2, 3], [INF, 1, INF])) == pytest.approx(7)


def test_water_fill_with_nothing_to_give():
    assert water_fill(0, [1, 1], [5, 5]) == [0.0, 0.0]


# --- divide -------------------------------------------------------------------------------------

def test_divide_reference_worked_example():
    # reference 003: 40 GPUs, quotas 14/6/0, weights 2/3/1: Project 2 gets 6 + 3/6 x 20 = 16.
    shares = divide(40, [claim(14, 2), claim(6, 3), claim(0, 1)], scale_quotas=False)
    assert shares == pytest.approx([20 + 2 / 3, 16, 3 + 1 / 3])


def test_divide_deserved_quota_is_capped_by_demand():
    assert divide(10, [claim(8, cap=3), claim(0)], scale_quotas=False) == pytest.approx([3, 7])


def test_divide_top_level_honours_quotas_beyond_capacity():
    assert divide(10, [claim(8), claim(8)], scale_quotas=False) == pytest.approx([8, 8])


def test_divide_shares_out_no_surplus_beyond_the_pool():
    # A department deserving 7 of a 6-GPU pool: its projects keep their quotas, and the surplus
    # handed to the third is what the pool has left (6 - 4), not what the department's quota says.
    claims = [claim(2, weight=0), claim(5, weight=0, cap=2), claim(0, weight=1)]
    assert divide(7, claims, scale_quotas=True, pool=6) == pytest.approx([2, 2, 2])
    assert divide(7, claims, scale_quotas=True) == pytest.approx([2, 2, 3])


def test_divide_inside_department_scales_quotas_in_proportion():
    assert divide(6, [claim(6), claim(3)], scale_quotas=True) == pytest.approx([4, 2])


def test_divide_scaled_quota_is_still_capped_by_demand():
    assert divide(6, [claim(6, cap=1), claim(6)], scale_quotas=True) == pytest.approx([1, 5])


def test_divide_serves_higher_over_quota_priority_first():
    assert divide(10, [claim(1), claim(1, priority=5)], scale_quotas=False) == pytest.approx([1, 9])
    assert divide(10, [claim(1), claim(1, priority=5, cap=3)], scale_quotas=False) == pytest.approx([7, 3])


def test_divide_never_exceeds_capacity_when_quotas_fit():
    shares = divide(12, [claim(2, 1, cap=5), claim(3, 2), claim(0, 0.5, cap=1)], scale_quotas=False)
    assert sum(shares) == pytest.approx(12)
    assert shares[0] <= 5 and shares[2] <= 1


# --- the hierarchy, through scenarios -----------------------------------------------------------

def nodes(count: int, gpus_each: int = 8, pool: str | None = None, prefix: str = "n") -> str:
    pool_line = f'pool = "{pool}"\n' if pool else ""
    return "".join(f'[[nodes]]\nname = "{prefix}{i}"\ngpus = {gpus_each}\n{pool_line}\n'
                   for i in range(1, count + 1))


def jobs(name: str, project: str, count: int, pool: str | None = None) -> str:
    pool_line = f'pool = "{pool}"\n' if pool else ""
    return f'[[jobs]]\nname = "{name}"\nproject = "{project}"\ncount = {count}\ngpus = 1\n{pool_line}\n'


def test_reference_worked_example_in_a_scenario():
    sim = run(f"""
        [[policy.projects]]
        name = "p1"
        gpu_quota = 14
        over_quota_weight = 2
        [[policy.projects]]
        name = "p2"
        gpu_quota = 6
        over_quota_weight = 3
        [[policy.projects]]
        name = "p3"
        gpu_quota = 0
        over_quota_weight = 1
        {nodes(5)}
        {jobs("a", "p1", 30)}
        {jobs("b", "p2", 30)}
        {jobs("c", "p3", 30)}
        """)
    assert fair_share(sim, "p1") == pytest.approx(20.6667, abs=0.01)
    assert fair_share(sim, "p2") == pytest.approx(16.0)
    assert fair_share(sim, "p3") == pytest.approx(3.3333, abs=0.01)
    assert gpus(sim, "p2") == 16
    assert gpus(sim, "p1") + gpus(sim, "p2") + gpus(sim, "p3") == 40


def test_surplus_split_three_to_one_by_weight():
    sim = run(f"""
        [[policy.projects]]
        name = "A"
        over_quota_weight = 3
        [[policy.projects]]
        name = "B"
        over_quota_weight = 1
        {nodes(1)}
        {jobs("a", "A", 10)}
        {jobs("b", "B", 10)}
        """)
    assert (fair_share(sim, "A"), fair_share(sim, "B")) == pytest.approx((6, 2))
    assert (gpus(sim, "A"), gpus(sim, "B")) == (6, 2)


def test_surplus_split_by_quota_when_weights_are_off():
    # The weights would favour A; with over_quota_weights = false they mean nothing, quotas decide.
    sim = run(f"""
        [policy]
        over_quota_weights = false
        [[policy.projects]]
        name = "A"
        gpu_quota = 1
        over_quota_weight = 5
        [[policy.projects]]
        name = "B"
        gpu_quota = 3
        over_quota_weight = 1
        {nodes(2)}
        {jobs("a", "A", 20)}
        {jobs("b", "B", 20)}
        """)
    assert (fair_share(sim, "A"), fair_share(sim, "B")) == pytest.approx((4, 12))
    assert (gpus(sim, "A"), gpus(sim, "B")) == (4, 12)


def test_a_queue_asking_less_gives_its_surplus_away():
    sim = run(f"""
        [[policy.projects]]
        name = "small"
        [[policy.projects]]
        name = "b"
        [[policy.projects]]
        name = "c"
        {nodes(1, 12)}
        {jobs("s", "small", 2)}
        {jobs("x", "b", 20)}
        {jobs("y", "c", 20)}
        """)
    assert [fair_share(sim, p) for p in ("small", "b", "c")] == pytest.approx([2, 5, 5])
    assert [gpus(sim, p) for p in ("small", "b", "c")] == [2, 5, 5]


def test_a_queue_asking_less_than_its_quota_deserves_only_what_it_asks():
    sim = run(f"""
        [[policy.projects]]
        name = "rich"
        gpu_quota = 6
        [[policy.projects]]
        name = "poor"
        {nodes(1)}
        {jobs("r", "rich", 1)}
        {jobs("p", "poor", 20)}
        """)
    assert fair_share(sim, "rich") == pytest.approx(1)
    assert fair_share(sim, "poor") == pytest.approx(7)


def test_gpu_limit_caps_fair_share_and_allocation():
    sim = run(f"""
        [[policy.projects]]
        name = "A"
        gpu_limit = 3
        [[policy.projects]]
        name = "B"
        {nodes(1, 12)}
        {jobs("a", "A", 20)}
        {jobs("b", "B", 20)}
        """)
    assert (fair_share(sim, "A"), fair_share(sim, "B")) == pytest.approx((3, 9))
    assert (gpus(sim, "A"), gpus(sim, "B")) == (3, 9)


def test_gpu_limit_holds_even_on_an_idle_cluster():
    sim = run(f"""
        [[policy.projects]]
        name = "A"
        gpu_limit = 3
        {nodes(1)}
        {jobs("a", "A", 5)}
        """)
    assert gpus(sim, "A") == 3
    assert "limit of 3 GPUs" in reason(sim, "a-4")


def test_weight_zero_gets_no_surplus():
    sim = run(f"""
        [[policy.projects]]
        name = "A"
        gpu_quota = 2
        over_quota_weight = 0
        [[policy.projects]]
        name = "B"
        gpu_quota = 2
        {nodes(1)}
        {jobs("a", "A", 10)}
        {jobs("b", "B", 10)}
        """)
    assert (fair_share(sim, "A"), fair_share(sim, "B")) == pytest.approx((2, 6))
    assert (gpus(sim, "A"), gpus(sim, "B")) == (2, 6)


def test_over_quota_priority_groups_are_served_first():
    sim = run(f"""
        [[policy.projects]]
        name = "low"
        gpu_quota = 2
        over_quota_weight = 3
        [[policy.projects]]
        name = "high"
        over_quota_priority = 100
        {nodes(1)}
        {jobs("l", "low", 10)}
        {jobs("h", "high", 10)}
        """)
    # the high-priority group takes the whole surplus, however the weights look
    assert (fair_share(sim, "low"), fair_share(sim, "high")) == pytest.approx((2, 6))
    assert (gpus(sim, "low"), gpus(sim, "high")) == (2, 6)


def test_over_quota_priority_leftover_goes_to_the_next_group():
    sim = run(f"""
        [[policy.projects]]
        name = "low"
        gpu_quota = 2
        [[policy.projects]]
        name = "high"
        over_quota_priority = 100
        {nodes(1)}
        {jobs("l", "low", 10)}
        {jobs("h", "high", 3)}
        """)
    assert (fair_share(sim, "low"), fair_share(sim, "high")) == pytest.approx((5, 3))


def test_over_quota_false_caps_at_quota_even_when_gpus_are_idle():
    sim = run(f"""
        [[policy.projects]]
        name = "capped"
        gpu_quota = 2
        over_quota = false
        [[policy.projects]]
        name = "free"
        gpu_quota = 2
        {nodes(1)}
        {jobs("c", "capped", 10)}
        {jobs("f", "free", 3)}
        """)
    assert fair_share(sim, "capped") == pytest.approx(2)
    assert gpus(sim, "capped") == 2
    assert gpus(sim, "free") == 3
    assert "may not go over quota" in reason(sim, "c-3")


def test_departments_are_divided_first_then_their_projects():
    # Two equal departments; D2 has three projects. Per project it would be 3/3/3/3; per department 6 | 2/2/2.
    sim = run(f"""
        [[policy.departments]]
        name = "D1"
        [[policy.departments]]
        name = "D2"
        [[policy.projects]]
        name = "solo"
        department = "D1"
        [[policy.projects]]
        name = "x"
        department = "D2"
        [[policy.projects]]
        name = "y"
        department = "D2"
        [[policy.projects]]
        name = "z"
        department = "D2"
        {nodes(1, 12)}
        {jobs("s", "solo", 12)}
        {jobs("a", "x", 12)}
        {jobs("b", "y", 12)}
        {jobs("c", "z", 12)}
        """)
    assert fair_share(sim, "D1", kind="department") == pytest.approx(6)
    assert fair_share(sim, "D2", kind="department") == pytest.approx(6)
    assert [fair_share(sim, p) for p in ("solo", "x", "y", "z")] == pytest.approx([6, 2, 2, 2])
    assert [gpus(sim, p) for p in ("solo", "x", "y", "z")] == [6, 2, 2, 2]


def test_department_share_divided_among_projects_in_proportion_to_quota():
    # D1 deserves 6 (D2 takes its 6); its projects' quotas 6 + 3 = 9 exceed that, so they get 4 and 2.
    sim = run(f"""
        [[policy.departments]]
        name = "D1"
        gpu_quota = 6
        [[policy.departments]]
        name = "D2"
        gpu_quota = 6
        [[policy.projects]]
        name = "big"
        department = "D1"
        gpu_quota = 6
        [[policy.projects]]
        name = "small"
        department = "D1"
        gpu_quota = 3
        [[policy.projects]]
        name = "other"
        department = "D2"
        gpu_quota = 6
        {nodes(1, 12)}
        {jobs("b", "big", 10)}
        {jobs("s", "small", 10)}
        {jobs("o", "other", 10)}
        """)
    assert fair_share(sim, "D1", kind="department") == pytest.approx(6)
    assert (fair_share(sim, "big"), fair_share(sim, "small")) == pytest.approx((4, 2))
    assert (gpus(sim, "big"), gpus(sim, "small"), gpus(sim, "other")) == (4, 2, 6)


def test_top_level_quotas_over_the_pool_are_not_scaled():
    sim = run(f"""
        [[policy.projects]]
        name = "A"
        gpu_quota = 8
        [[policy.projects]]
        name = "B"
        gpu_quota = 8
        {nodes(1, 10)}
        {jobs("a", "A", 10)}
        {jobs("b", "B", 10)}
        """)
    assert (fair_share(sim, "A"), fair_share(sim, "B")) == pytest.approx((8, 8))
    assert gpus(sim, "A") + gpus(sim, "B") == 10


def test_quotas_are_per_node_pool():
    sim = run(f"""
        [[policy.projects]]
        name = "A"
        gpu_quota = {{ default = 6, h100 = 2 }}
        [[policy.projects]]
        name = "B"
        gpu_quota = {{ default = 2, h100 = 6 }}
        {nodes(1)}
        {nodes(1, pool="h100", prefix="h")}
        {jobs("a", "A", 10)}
        {jobs("b", "B", 10)}
        {jobs("ah", "A", 10, pool="h100")}
        {jobs("bh", "B", 10, pool="h100")}
        """)
    assert (fair_share(sim, "A"), fair_share(sim, "B")) == pytest.approx((6, 2))
    assert (fair_share(sim, "A", "h100"), fair_share(sim, "B", "h100")) == pytest.approx((2, 6))
    assert (gpus(sim, "A"), gpus(sim, "B")) == (6, 2)
    assert (gpus(sim, "A", "h100"), gpus(sim, "B", "h100")) == (2, 6)


def test_fair_share_is_per_resource():
    sim = run("""
        [[policy.projects]]
        name = "A"
        [[policy.projects]]
        name = "B"
        [[nodes]]
        name = "n1"
        gpus = 8
        cpus = 16
        [[jobs]]
        name = "a"
        project = "A"
        count = 4
        gpus = 1
        cpus = 1
        [[jobs]]
        name = "b"
        project = "B"
        count = 20
        gpus = 0
        cpus = 1
        """)
    a, b = queue(sim, "A"), queue(sim, "B")
    assert (a.fair_share.gpu, b.fair_share.gpu) == pytest.approx((4, 0))
    assert (a.fair_share.cpu, b.fair_share.cpu) == pytest.approx((4, 12))
