"""Reservations and backfill: a job that finds no room is given a start, and later jobs may not delay it."""

from __future__ import annotations

from sched_helpers import nodes_of, run

# One node of 8 GPUs; a job holds 4 of them until its limit ends at 100 s; at 50 s an 8-GPU gang
# arrives, then 1-GPU jobs of a 300 s limit, and one of a 20 s limit.
GANG_BEHIND_RUNNING = """
    until = {until}
    [policy]
    [[policy.projects]]
    name = "p"
    [[nodes]]
    name = "n1"
    gpus = 8
    [[jobs]]
    name = "running"
    project = "p"
    gpus = 4
    running_on = ["n1"]
    started = 0
    time_limit = 100
    [[jobs]]
    name = "gang"
    project = "p"
    gpus = 8
    submitted = 50
    time_limit = 1000
    runtime = 200
    [[jobs]]
    name = "small"
    count = 3
    project = "p"
    gpus = 1
    submitted = 60
    time_limit = 300
    [[jobs]]
    name = "short"
    project = "p"
    gpus = 1
    submitted = 70
    time_limit = {short_limit}
    [expect]
    {expect}
"""


def gang_case(until: float, short_limit: float, expect: str):
    return run(GANG_BEHIND_RUNNING.format(until=until, short_limit=short_limit, expect=expect))


def test_a_job_that_would_delay_the_reservation_does_not_start():
    sim = gang_case(99, 20, 'pending = ["gang", "small-1", "small-2", "small-3"]\n'
                            'estimated_start = { gang = 100, small-1 = 1100 }')
    # The gang may start at 100 s; it is promised the end of its 300 s resolution step.
    assert sim.reserved["gang"] == 300
    assert "small-1" not in sim.started


def test_a_job_that_ends_before_the_reserved_start_backfills_at_once():
    sim = gang_case(99, 20, 'started = { short = 70 }\nfinished = ["short"]')
    assert sim.started["short"] == 70


def test_a_job_that_would_end_after_the_reserved_start_waits_like_the_others():
    gang_case(99, 40, 'pending = ["gang", "small-1", "small-2", "small-3", "short"]')


def test_the_gang_starts_when_the_limit_frees_the_gpus_and_small_jobs_follow_it():
    gang_case(1200, 20, 'started = { gang = 100, small-1 = 300, small-2 = 300, small-3 = 300 }')


def test_room_the_reservation_does_not_need_is_used_at_once():
    # A job holds 6 GPUs until 100 s; a 4-GPU gang needs only GPUs that job frees: the 2 free ones fill now.
    text = GANG_BEHIND_RUNNING.replace("gpus = 8\n    submitted = 50", "gpus = 4\n    submitted = 50").replace(
        "gpus = 4\n    running_on", "gpus = 6\n    running_on")
    sim = run(text.format(until=65, short_limit=20, expect='running = ["running", "small-1", "small-2"]'))
    assert sim.reserved.get("gang") == 300
    assert sim.first_estimates["gang"] == 100


def test_without_reservations_small_jobs_take_the_room_first():
    text = GANG_BEHIND_RUNNING.replace("[policy]\n", "[policy]\n    reservations = {{ jobs = 0 }}\n")
    sim = run(text.format(until=99, short_limit=20, expect='running = ["running", "small-1", "small-2", "small-3"]\n'
                                                           'started = { short = 70 }'))
    assert "gang" not in sim.reserved


def test_with_reservations_and_estimates_off_jobs_with_limits_go_as_without_limits():
    # No pool plans a start: the limits change nothing, and no pending job is given an estimate.
    off = GANG_BEHIND_RUNNING.replace("[policy]\n", "[policy]\n    reservations = {{ jobs = 0, estimate_jobs = 0 }}\n")
    expect = 'running = ["running", "small-1", "small-2", "small-3"]\nstarted = { short = 70 }'
    sim = run(off.format(until=99, short_limit=20, expect=expect))
    assert not sim.reserved and not sim.first_estimates
    unlimited = off.replace("    time_limit = 100\n", "").replace("    time_limit = 1000\n", "").replace(
        "    time_limit = 300\n", "").replace("    time_limit = {short_limit}\n", "")
    again = run(unlimited.format(until=99, expect="started = { short = 70 }"))  # it runs on, without a limit
    assert again.started == sim.started


def test_a_larger_job_that_ends_in_time_backfills_behind_smaller_ones_that_cannot():
    # The 1-GPU jobs end after the reserved start and cannot borrow; a 2-GPU job of a 20 s limit, larger
    # than they are, can: the queue is not passed over whole for what the 1-GPU jobs found.
    text = GANG_BEHIND_RUNNING.replace("gpus = 1\n    submitted = 70", "gpus = 2\n    submitted = 70")
    sim = run(text.format(until=99, short_limit=20, expect='started = { short = 70 }\nfinished = ["short"]\n'
                                                           'pending = ["gang", "small-1", "small-2", "small-3"]'))
    assert sim.reserved["gang"] == 300


def test_jobs_behind_one_of_their_shape_get_their_estimates_in_turn():
    # Three 8-GPU jobs wait behind one that holds the node until 100 s: the first of them is planned as it
    # finds no room; the others, passed over with it, are planned after the walk, each behind the last.
    sim = run("""
        until = 10
        [policy]
        [[policy.projects]]
        name = "p"
        [[nodes]]
        name = "n1"
        gpus = 8
        [[jobs]]
        name = "running"
        project = "p"
        gpus = 8
        running_on = ["n1"]
        started = 0
        time_limit = 100
        [[jobs]]
        name = "next"
        count = 3
        project = "p"
        gpus = 8
        submitted = 5
        time_limit = 100
        [expect]
        estimated_start = { next-1 = 100, next-2 = 200, next-3 = 300 }
    """)
    assert sim.reserved["next-1"] == 300
    assert "next-2" not in sim.reserved  # an estimate: the room is held for the first only


# Three nodes of 8 GPUs: n1 is free, a job holds n2 until 100 s and another n3 until 150 s. A 16-GPU gang
# (2 x 8) comes at 10 s, then eight 1-GPU jobs of a 1000 s limit.
FREE_NODE_OR_TWO_DRAINING = """
    until = {until}
    [policy]
    {settings}
    [[policy.projects]]
    name = "p"
    [[nodes]]
    name = "n1"
    gpus = 8
    [[nodes]]
    name = "n2"
    gpus = 8
    [[nodes]]
    name = "n3"
    gpus = 8
    [[jobs]]
    name = "a"
    project = "p"
    gpus = 8
    running_on = ["n2"]
    started = 0
    time_limit = 100
    [[jobs]]
    name = "b"
    project = "p"
    gpus = 8
    running_on = ["n3"]
    started = 0
    time_limit = 150
    [[jobs]]
    name = "gang"
    project = "p"
    gpus = 8
    tasks = 2
    submitted = 10
    time_limit = 1000
    runtime = 500
    [[jobs]]
    name = "small"
    count = 8
    project = "p"
    gpus = 1
    submitted = 20
    time_limit = 1000
    runtime = 900
    [expect]
    {expect}
"""


def test_a_free_node_is_not_held_idle_while_nodes_that_free_within_the_resolution_drain():
    # Starting at 100 on n1 and n2 would hold n1's 8 GPUs idle for 90 s; n2 and n3 free 50 s apart, within
    # the reservation's 300 s resolution step: the gang takes them and is promised the step's end, and
    # the small jobs run on n1 meanwhile.
    sim = run(FREE_NODE_OR_TWO_DRAINING.format(
        until=200, settings="", expect='started = { gang = 150, small-1 = 20, small-8 = 20 }'))
    assert sim.reserved["gang"] == 300
    assert sim.first_estimates["gang"] == 150
    assert sorted(nodes_of(sim, "gang")) == ["n2", "n3"]


def test_with_no_resolution_the_reservation_takes_the_earliest_start_and_holds_the_free_node():
    sim = run(FREE_NODE_OR_TWO_DRAINING.format(
        until=200, settings="reservations = { resolution = 0 }",
        expect='started = { gang = 100, small-1 = 150, small-8 = 150 }'))
    assert sim.reserved["gang"] == 100
    assert sorted(nodes_of(sim, "gang")) == ["n1", "n2"]


def test_a_reservation_that_moves_to_nodes_that_waste_less_keeps_its_promised_start():
    # Four nodes of 2 GPUs freed by limits at 240, 250, 260 and 290 s. At 10 s a gang of two 2-GPU tasks
    # takes a and b (both free by 250 s, a idle 10 s); at 30 s a's job ends early, and a would sit idle
    # 220 s: the reservation moves to b and c, free by 260 s. The start it promised at 10 s is the end of
    # its resolution step, 300 s, and it keeps it; a job behind it runs on a meanwhile.
    nodes = "".join(f'\n    [[nodes]]\n    name = "{n}"\n    gpus = 2' for n in "abcd")
    running = "".join(f'\n    [[jobs]]\n    name = "on-{n}"\n    project = "p"\n    gpus = 2\n    running_on = ["{n}"]'
                      f'\n    started = 0\n    time_limit = {limit}\n    runtime = {runtime}'
                      for n, limit, runtime in (("a", 240, 30), ("b", 250, 250), ("c", 260, 260), ("d", 290, 290)))
    sim = run(f"""
    until = 400
    [policy]
    [[policy.projects]]
    name = "p"{nodes}{running}
    [[jobs]]
    name = "gang"
    project = "p"
    gpus = 2
    tasks = 2
    submitted = 10
    time_limit = 1000
    [[jobs]]
    name = "behind"
    project = "p"
    gpus = 2
    submitted = 30
    time_limit = 500
    [expect]
    started = {{ gang = 260, behind = 30 }}
    """)
    assert sim.started["gang"] <= sim.reserved["gang"] == 300
    assert sim.first_estimates["gang"] == 250
    assert sorted(nodes_of(sim, "gang")) == ["b", "c"]
