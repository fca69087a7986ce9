"""The settings and inputs of interactive work: idle_timeout per priority class, the detach timeout, ports."""

import tomllib

import pytest

from gpud.cli.run_cmd import parse_ports, queue_place, waiting_text
from gpud.cli.common import UsageError
from gpud.controller.config import load_config
from gpud.errors import ConfigError
from gpud.policy import DEFAULT_PRIORITY_CLASSES
from gpud.policy_file import parse_policy


def parse(text):
    return parse_policy(tomllib.loads(text), "policy.toml")


def test_idle_timeout_per_priority_class_in_seconds_or_with_a_unit():
    policy = parse('[priority_classes]\nbuild = { priority = 100, idle_timeout = "30m" }\n'
                   'notebook = { priority = 90, idle_timeout = 90 }\nnightly = 40\n'
                   'inference = { idle_timeout = "1.5h" }\n')
    assert dict(policy.idle_timeouts) == {"build": 1800.0, "notebook": 90.0, "inference": 5400.0}
    assert policy.priority_classes["build"] == 100 and policy.priority_classes["notebook"] == 90
    assert policy.priority_classes["inference"] == DEFAULT_PRIORITY_CLASSES["inference"]
    assert policy.priority_classes["nightly"] == 40
    assert dict(parse("").idle_timeouts) == {}


@pytest.mark.parametrize("value, says", [
    ('"soon"', "priority_classes.build.idle_timeout: bad time 'soon'"),
    ("0", "priority_classes.build.idle_timeout"),
    ("-5", "priority_classes.build.idle_timeout"),
    ("true", "priority_classes.build.idle_timeout"),
])
def test_a_bad_idle_timeout_names_the_class_and_key(value, says):
    with pytest.raises(ConfigError) as info:
        parse(f"[priority_classes]\nbuild = {{ priority = 100, idle_timeout = {value} }}\n")
    assert says in str(info.value)


def test_a_new_class_as_a_table_needs_its_priority_and_known_keys():
    with pytest.raises(ConfigError) as info:
        parse('[priority_classes]\nlab = { idle_timeout = "1h" }\n')
    assert "priority_classes.lab.priority" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse('[priority_classes]\nbuild = { priority = 100, idle = "1h" }\n')
    assert "idle" in str(info.value) and "priority_classes.build" in str(info.value)


def test_detach_timeout_from_the_controller_config(tmp_path):
    path = tmp_path / "controller.toml"
    assert load_config(None).detach_timeout_s == 600.0
    path.write_text("[interactive]\ndetach_timeout_s = 30\n")
    assert load_config(str(path)).detach_timeout_s == 30.0
    path.write_text("[interactive]\ndetach_timeout_s = -1\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert "interactive.detach_timeout_s" in str(info.value)
    path.write_text("[interactive]\ndetach = 30\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert "detach" in str(info.value)


def test_ports_for_forward():
    assert parse_ports("8888") == (8888, 8888)
    assert parse_ports("8888:9999") == (8888, 9999)
    assert parse_ports("6006:0") == (6006, 0)
    for bad in ("x", "0", "70000", "80:-1", "80:http", ""):
        with pytest.raises(UsageError, match="PORT"):
            parse_ports(bad)


def test_the_queue_place_follows_priority_then_submit_time_in_the_pool():
    def job(ident, priority, submitted, pool=None, hold=False):
        return {"id": ident, "priority": priority, "submitted": submitted, "pool": pool, "hold": hold,
                "project": "p", "priority_class": "build"}
    mine = job("5", 100, 50.0)
    pending = [job("1", 50, 10.0), job("2", 100, 20.0), job("3", 100, 60.0), mine, job("4", 100, 5.0, pool="b"),
               job("6", 200, 70.0, hold=True)]
    assert queue_place(mine, pending) == (2, 4)
    text = waiting_text(mine, pending, {"reason": "", "blockers": ["project p is over quota"],
                                        "would_start": ["a larger quota"]})
    assert text.splitlines() == [
        "gpuctl run: job 5 waits, 2 of 4 in project p's queue", "  - project p is over quota",
        "  it would start with: a larger quota",
        "  (class build is not preemptible, so it runs only within the project's quota; --priority "
        "interactive-preemptible may also use idle GPUs over it)"]


def test_the_class_of_interactive_work_comes_from_the_policy_and_the_project():
    policy = parse('interactive_class = "shell"\n[priority_classes]\nshell = 80\n'
                   '[[projects]]\nname = "a"\n[[projects]]\nname = "b"\ninteractive_class = "train"\n')
    assert policy.default_class("a", interactive=True) == "shell"
    assert policy.default_class("b", interactive=True) == "train"
    assert policy.default_class("a", interactive=False) == "train"
    assert parse("[[projects]]\nname = \"a\"\n").default_class("a", interactive=True) == "build"


@pytest.mark.parametrize("text, says", [
    ('interactive_class = "biuld"\n', "interactive_class: unknown priority class \"biuld\"; did you mean \"build\"?"),
    ('[[projects]]\nname = "a"\ninteractive_class = "shell"\n', "interactive_class: unknown priority class"),
])
def test_an_interactive_class_that_does_not_exist_is_refused(text, says):
    with pytest.raises(ConfigError) as info:
        parse(text)
    assert says in str(info.value)
