"""What users and admins read and write about reservations: the policy's table and gpuctl's start texts."""

from __future__ import annotations

import pytest

from gpud.cli.job_cmd import show_text, why_text
from gpud.cli.queue_cmd import start_table
from gpud.errors import ConfigError
from gpud.policy_file import parse_policy
from test_gpuctl_render import NOW, job


def test_the_reservations_table_sets_pools_and_class_default_limits():
    policy = parse_policy({"reservations": {"jobs": 2, "default_time_limit": "1h", "max_time_limit": "2d"},
                           "node_pools": [{"name": "h100", "reservations": {"jobs": 0}}],
                           "priority_classes": {"build": {"priority": 100, "default_time_limit": "30m"}},
                           "projects": [{"name": "p"}]}, "policy.toml")
    assert policy.reservations_in("default").jobs == 2
    assert policy.reservations_in("h100").jobs == 0
    assert policy.reservations_in("h100").default_time_limit_s == 3600.0  # the policy's, under the pool's own
    assert policy.time_limit_for("default", "build", None) == 1800.0
    assert policy.time_limit_for("default", "train", None) == 3600.0
    assert policy.time_limit_for("default", "train", 600.0) == 600.0
    assert policy.time_limit_for("default", "train", 10 * 86400.0) == 2 * 86400.0


def test_the_resolution_of_promised_starts_is_five_minutes_unless_set():
    def parsed(table: dict):
        return parse_policy({"reservations": table, "projects": [{"name": "p"}]}, "policy.toml")
    assert parsed({}).reservations.resolution_s == 300.0
    assert parsed({"resolution": "15m"}).reservations.resolution_s == 900.0
    assert parsed({"resolution": 0}).reservations.resolution_s == 0.0


@pytest.mark.parametrize("table, words", [
    ({"jobs": -1}, "reservations.jobs"),
    ({"default_time_limit": 0}, "longer than 0 seconds"),
    ({"window": "soon"}, "reservations.window"),
    ({"resolution": -60}, "reservations.resolution"),
    ({"job": 3}, "job"),
])
def test_a_bad_reservations_table_is_refused_by_name(table, words):
    with pytest.raises(ConfigError) as refused:
        parse_policy({"reservations": table, "projects": [{"name": "p"}]}, "policy.toml")
    assert words in str(refused.value)


def test_show_why_and_queue_start_say_when_a_job_starts_and_where_room_is_held():
    held = job(id="7", estimated_start=NOW + 600, reserved_start=NOW + 900, start_nodes=["n1", "n2"],
               no_estimate=None)
    none = job(id="8", estimated_start=None, reserved_start=None, start_nodes=[], no_estimate="held")
    assert "Est. start:" in show_text(held, NOW) and "room held on n1, n2" in show_text(held, NOW)
    assert "no estimate: it is held" in show_text(none, NOW)
    why = why_text({"id": "7", "state": "PENDING", "reason": "waiting for GPUs", "blockers": [],
                    "would_start": [], "start": {k: held[k] for k in ("estimated_start", "reserved_start",
                                                                       "start_nodes", "no_estimate")}})
    assert "Expected to start:" in why and "n1, n2" in why
    table = start_table([none, held], NOW).splitlines()
    assert table[0].split()[-2:] == ["START", "NODES"]
    assert table[1].startswith("7 ") and table[1].rstrip().endswith("n1,n2")
    assert table[2].startswith("8 ") and "no estimate" in table[2]
