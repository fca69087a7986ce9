"""Aging: with the policy's ``age_weight`` a job's place in its project's order grows with its wait."""

from __future__ import annotations

import pytest

from gpud.core.orders import AgedJobOrder, PriorityJobOrder
from gpud.model import JobSpec, TaskRequest
from gpud.errors import ConfigError
from gpud.policy_file import parse_policy
from sched_helpers import run

# One GPU, busy until 3600 s; a train job (priority 50) waits from 0 s, and a build job (100) comes every
# hour, 1000 s before the GPU frees: each would take the GPU ahead of the train job while they come.
# (Running jobs are kept from preemption: the order of the waiting ones is the point.)
STREAM = """
    until = 30000
    [policy]
    min_runtime = "10h"
    {weight}
    [[policy.projects]]
    name = "p"
    gpu_quota = 1
    [[nodes]]
    name = "n1"
    gpus = 1
    [[jobs]]
    name = "running"
    project = "p"
    priority = "build"
    gpus = 1
    running_on = ["n1"]
    started = 0
    time_limit = 3600
    runtime = 3600
    [[jobs]]
    name = "old"
    project = "p"
    priority = "train"
    gpus = 1
    submitted = 0
    time_limit = 3600
    runtime = 3600
""" + "".join(f"""
    [[jobs]]
    name = "new{k}"
    project = "p"
    priority = "build"
    gpus = 1
    submitted = {k * 3600 - 1000}
    time_limit = 3600
    runtime = 3600
""" for k in range(1, 7)) + """
    [expect]
    {expect}
"""


def test_without_aging_a_stream_of_higher_jobs_keeps_a_low_one_waiting():
    sim = run(STREAM.format(weight="", expect="started = { new1 = 3600, new2 = 7200, new3 = 10800 }"))
    assert sim.started["old"] == 7 * 3600  # only once the stream has dried up


def test_with_aging_the_low_job_passes_the_newer_higher_ones_once_it_has_waited_long_enough():
    # 30 points an hour: at 7200 s the train job stands at 50 + 60 = 110, the build job submitted at
    # 6200 s at 100 + 8.3; at 3600 s it stood at 80 against 108.3.
    sim = run(STREAM.format(weight="age_weight = 30", expect="started = { new1 = 3600, old = 7200, new2 = 10800, "
                                                              "new3 = 14400 }"))
    assert sim.started["old"] == 7200


def test_the_aged_key_orders_as_priority_plus_weight_times_hours_waited_at_any_moment():
    order = AgedJobOrder(30.0)
    old = JobSpec("old", "p", TaskRequest(gpus=1), priority=50, submitted=0.0, seq=0)
    new = JobSpec("new", "p", TaskRequest(gpus=1), priority=125, submitted=9800.0, seq=1)
    assert order.key(old) < order.key(new)  # 50 + 30 x (t / 3600) > 125 + 30 x ((t - 9800) / 3600) at any t
    assert PriorityJobOrder().key(new) < PriorityJobOrder().key(old)
    later = JobSpec("later", "p", TaskRequest(gpus=1), priority=125, submitted=10000.0, seq=2)
    assert order.key(new) < order.key(later)  # one priority: the earlier first, as without aging


def policy(extra: dict):
    return parse_policy({"projects": [{"name": "p"}], **extra}, "policy.toml")


def test_age_weight_is_off_by_default_and_refused_when_negative():
    assert policy({}).age_weight == 0.0
    assert policy({"age_weight": 2.5}).age_weight == 2.5
    with pytest.raises(ConfigError, match="age_weight.*must not be negative"):
        policy({"age_weight": -1})
