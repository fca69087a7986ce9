"""Tests for reading the policy file: every setting, and every mistake refused by table and key."""

import math
import tomllib
from pathlib import Path

import pytest

from gpud.errors import ConfigError
from gpud.model import Resources
from gpud.policy import DEFAULT_PRIORITY_CLASSES, Department, NodePool
from gpud.policy_file import load_policy, parse_policy

REPO = Path(__file__).resolve().parents[2]


def parse(text, **kwargs):
    return parse_policy(tomllib.loads(text), "policy.toml", **kwargs)


def refused(text, **kwargs):
    with pytest.raises(ConfigError) as info:
        parse(text, **kwargs)
    return info.value


def test_empty_policy_has_the_defaults():
    policy = parse("")
    assert policy.placement == "binpack"
    assert policy.cpu_placement == "binpack"
    assert policy.gpu_placement is None
    assert policy.over_quota_weights is True
    assert policy.min_runtime_s == 300.0
    assert policy.max_move_lost_hours == 2.0
    assert policy.default_pool == "default"
    assert dict(policy.priority_classes) == dict(DEFAULT_PRIORITY_CLASSES)
    assert policy.plugins.disable == () and policy.plugins.directory is None
    assert policy.departments == {} and policy.projects == {} and policy.pools == {}


def test_top_level_settings():
    policy = parse("""
placement = "spread"
cpu_placement = "spread"
gpu_placement = "binpack"
over_quota_weights = false
min_runtime = 12.5
default_pool = "main"
[priority_classes]
nightly = 10
train = 55
[plugins]
disable = ["spread", "victim_order"]
directory = "/etc/gpud/plugins"
""")
    assert (policy.placement, policy.cpu_placement, policy.gpu_placement) == ("spread", "spread", "binpack")
    assert policy.over_quota_weights is False
    assert policy.min_runtime_s == 12.5
    assert policy.default_pool == "main"
    assert policy.priority_classes["nightly"] == 10
    assert policy.priority_classes["train"] == 55
    assert policy.priority_classes["inference"] == 125
    assert policy.plugins.disable == ("spread", "victim_order")
    assert policy.plugins.directory == "/etc/gpud/plugins"


def test_the_bound_on_what_moves_lose_is_hours_and_not_below_zero():
    assert parse("max_move_lost_hours = 0.5").max_move_lost_hours == 0.5
    assert parse("max_move_lost_hours = 0").max_move_lost_hours == 0.0
    error = refused("max_move_lost_hours = -1")
    assert error.where == "max_move_lost_hours" and "-1" in str(error)
    assert refused('max_move_lost_hours = "2h"').where == "max_move_lost_hours"


def test_projects_without_department_get_an_implicit_default_department():
    policy = parse("""
[[projects]]
name = "a"
gpu_quota = 2
[[projects]]
name = "b"
department = "default"
""")
    assert policy.departments == {"default": Department("default", implicit=True)}
    assert policy.projects["a"].department == "default"
    assert policy.projects["b"].department == "default"
    assert policy.department_of("a").implicit


def test_declared_default_department_is_not_implicit():
    policy = parse("""
[[departments]]
name = "default"
gpu_quota = 4
[[projects]]
name = "a"
""")
    assert policy.departments["default"].implicit is False
    assert policy.departments["default"].quota_in("default") == Resources(gpu=4)


def test_no_projects_no_implicit_department():
    policy = parse('[[departments]]\nname = "d1"\n')
    assert list(policy.departments) == ["d1"]


def test_departments_and_projects_with_every_key():
    policy = parse("""
[[departments]]
name = "d1"
gpu_quota = 8
cpu_quota = 64
memory_quota_gib = 512
over_quota_weight = 2
over_quota_priority = 3
over_quota = false
gpu_limit = 16
cpu_limit = 128
memory_limit_gib = 1024

[[projects]]
name = "p1"
department = "d1"
users = ["alice", "bob"]
gpu_quota = 2
over_quota_weight = 0
gpu_limit = 6
""")
    d1 = policy.departments["d1"]
    assert d1.quota == {"default": Resources(8, 64, 512)}
    assert d1.limit == {"default": Resources(16, 128, 1024)}
    assert (d1.over_quota_weight, d1.over_quota_priority, d1.over_quota) == (2.0, 3, False)
    assert not d1.implicit
    p1 = policy.projects["p1"]
    assert p1.department == "d1"
    assert p1.users == ("alice", "bob")
    assert p1.over_quota_weight == 0.0
    assert p1.over_quota_priority == 0 and p1.over_quota is True
    assert "default" not in policy.departments


def test_per_pool_quotas_and_limits():
    policy = parse("""
[[projects]]
name = "p1"
gpu_quota = { default = 2, h100 = 4 }
cpu_quota = 16
gpu_limit = { h100 = 8 }
memory_limit_gib = 100
""")
    p1 = policy.projects["p1"]
    assert p1.quota == {"default": Resources(2, 16, 0), "h100": Resources(4, 0, 0)}
    assert p1.quota_in("h100") == Resources(gpu=4)
    assert p1.quota_in("a100") == Resources()
    assert p1.limit["h100"] == Resources(8, math.inf, math.inf)
    assert p1.limit["default"] == Resources(math.inf, math.inf, 100)
    assert p1.limit_in("a100") is None


def test_a_plain_number_is_in_the_default_pool():
    policy = parse('default_pool = "main"\n[[projects]]\nname = "p"\ngpu_quota = 3\n')
    assert policy.projects["p"].quota == {"main": Resources(gpu=3)}


def test_any_pool_name_is_fine_without_node_pools():
    policy = parse('[[projects]]\nname = "p"\ngpu_quota = { anything = 1 }\n')
    assert policy.projects["p"].quota_in("anything").gpu == 1


def test_node_pools():
    policy = parse("""
placement = "spread"
cpu_placement = "spread"
[[node_pools]]
name = "h100"
placement = "binpack"
[[node_pools]]
name = "a100"
gpu_placement = "binpack"
[[projects]]
name = "p"
gpu_quota = { h100 = 1, a100 = 2, default = 3 }
""")
    assert policy.pools["h100"] == NodePool("h100", "binpack", "spread", "binpack")
    assert policy.pools["a100"] == NodePool("a100", "spread", "spread", "binpack")
    assert policy.pool("other") == NodePool("other", "spread", "spread", "spread")


def test_custom_placement_strategies():
    policy = parse('placement = "topology"', known_placements=frozenset({"binpack", "topology"}))
    assert policy.placement == "topology"


def test_unknown_top_level_key_suggests_the_closest():
    error = refused('placment = "binpack"')
    assert error.source == "policy.toml"
    assert error.where == "placment"
    assert 'unknown key; did you mean "placement"?' in str(error)


def test_unknown_key_in_a_project_suggests_the_closest():
    error = refused('[[projects]]\nname = "vision"\ngpu_qouta = 2\n')
    assert error.where == 'projects[1] (name = "vision").gpu_qouta'
    assert 'did you mean "gpu_quota"?' in str(error)


def test_unknown_key_without_a_close_one_lists_the_known_keys():
    error = refused('[[node_pools]]\nname = "x"\ncolour = "red"\n')
    assert error.where == 'node_pools[1] (name = "x").colour'
    assert "known keys: name, placement, cpu_placement, gpu_placement" in str(error)


def test_a_scenario_files_tables_in_a_policy_file_are_named_as_such():
    error = refused('[policy]\nmin_runtime = 0\n')
    assert error.where == "policy"
    assert "[policy] is a table of a scenario file" in str(error) and "top-level keys" in str(error)
    error = refused('[[projects]]\nname = "a"\n[[nodes]]\nname = "n1"\n')
    assert error.where == "nodes" and "belong in a scenario file" in str(error)


def test_unknown_key_in_plugins_and_departments():
    assert refused('[plugins]\ndisabled = ["x"]\n').where == "plugins.disabled"
    error = refused('[[departments]]\nname = "d"\nusers = ["a"]\n')
    assert error.where == 'departments[1] (name = "d").users'


def test_negative_quota_names_the_project_and_key():
    error = refused('[[projects]]\nname = "a"\n[[projects]]\nname = "vision"\ngpu_quota = -1\n')
    assert error.where == 'projects[2] (name = "vision").gpu_quota'
    assert str(error) == 'policy.toml: projects[2] (name = "vision").gpu_quota: must not be negative (got -1)'


@pytest.mark.parametrize("line, where", [
    ("cpu_limit = -2", "cpu_limit"),
    ("memory_quota_gib = { h100 = -5 }", "memory_quota_gib.h100"),
    ("over_quota_weight = -0.5", "over_quota_weight"),
])
def test_negative_amounts_are_refused(line, where):
    error = refused(f'[[departments]]\nname = "d"\n{line}\n')
    assert error.where == f'departments[1] (name = "d").{where}'
    assert "must not be negative" in str(error)


@pytest.mark.parametrize("text, min_runtime, grace", [
    ('min_runtime = "5m"\ngrace_period = "45s"', 300.0, 45.0),
    ('min_runtime = "1:30:00"\ngrace_period = "1.5m"', 5400.0, 90.0),
    ("min_runtime = 90\ngrace_period = 0", 90.0, 0.0),
])
def test_times_are_seconds_or_written_as_gpuctl_takes_them(text, min_runtime, grace):
    policy = parse_policy(tomllib.loads(text), "policy.toml")
    assert (policy.min_runtime_s, policy.grace_period_s) == (min_runtime, grace)


def test_negative_min_runtime():
    error = refused("min_runtime = -1")
    assert error.where == "min_runtime" and "must not be negative (got -1)" in str(error)


@pytest.mark.parametrize("text, where, words", [
    ('[[projects]]\nname = "p"\ngpu_quota = "4"', 'projects[1] (name = "p").gpu_quota',
     'expected a number or a table of node pool = number, got a string ("4")'),
    ('[[projects]]\nname = "p"\ngpu_quota = true', 'projects[1] (name = "p").gpu_quota', "got a boolean (true)"),
    ('[[projects]]\nname = "p"\ngpu_quota = { h100 = true }', 'projects[1] (name = "p").gpu_quota.h100',
     "expected a number, got a boolean (true)"),
    ('[[projects]]\nname = "p"\nover_quota_weight = false', 'projects[1] (name = "p").over_quota_weight',
     "expected a number, got a boolean (false)"),
    ('[[projects]]\nname = "p"\nover_quota_priority = 1.5', 'projects[1] (name = "p").over_quota_priority',
     "expected an integer, got a float (1.5)"),
    ('[[projects]]\nname = "p"\nover_quota = 1', 'projects[1] (name = "p").over_quota',
     "expected true or false, got an integer (1)"),
    ('[[projects]]\nname = "p"\nusers = "alice"', 'projects[1] (name = "p").users',
     'expected an array of strings, got a string ("alice")'),
    ('[[projects]]\nname = "p"\nusers = ["alice", 3]', 'projects[1] (name = "p").users[2]',
     "expected a string, got an integer (3)"),
    ('[[projects]]\nname = "p"\ndepartment = 7', 'projects[1] (name = "p").department',
     "expected a string, got an integer (7)"),
    ('[[projects]]\nname = 5', "projects[1].name", "expected a string, got an integer (5)"),
    ("over_quota_weights = 1", "over_quota_weights", "expected true or false, got an integer (1)"),
    ('min_runtime = "soon"', "min_runtime", "bad time 'soon'"),
    ('min_runtime = "300"', "min_runtime", 'a bare number is seconds: write 300 (no quotes), or a time with a unit'),
    ('grace_period = [30]', "grace_period", "expected a number, got an array"),
    ("min_runtime = true", "min_runtime", "expected a number, got a boolean (true)"),
    ("min_runtime = nan", "min_runtime", "must be a finite number"),
    ("default_pool = 1", "default_pool", "expected a string, got an integer (1)"),
    ("placement = 1", "placement", "expected a string, got an integer (1)"),
    ("[priority_classes]\nurgent = 1.5", "priority_classes.urgent", "expected an integer, got a float (1.5)"),
    ("[priority_classes]\nurgent = true", "priority_classes.urgent", "expected an integer, got a boolean"),
    ("priority_classes = 3", "priority_classes", "expected a table, got an integer (3)"),
    ("[plugins]\ndisable = \"spread\"", "plugins.disable", "expected an array of strings"),
    ("[plugins]\ndirectory = []", "plugins.directory", "expected a string, got an array"),
    ("projects = 3", "projects", "expected an array of tables, got an integer (3)"),
    ("projects = [1]", "projects[1]", "expected a table, got an integer (1)"),
])
def test_wrong_types_say_what_was_expected_and_given(text, where, words):
    error = refused(text)
    assert error.where == where
    assert words in str(error)


def test_infinite_limit_is_refused():
    error = refused('[[projects]]\nname = "p"\ngpu_limit = inf\n')
    assert error.where == 'projects[1] (name = "p").gpu_limit'
    assert "must be a finite number (got inf)" in str(error)


def test_project_in_an_unknown_department():
    error = refused('[[departments]]\nname = "research"\n[[projects]]\nname = "p"\ndepartment = "reserch"\n')
    assert error.where == 'projects[1] (name = "p").department'
    assert 'unknown department "reserch"; did you mean "research"?' in str(error)
    assert "departments: default, research" in str(error)


@pytest.mark.parametrize("table", ["departments", "projects", "node_pools"])
def test_duplicate_names(table):
    error = refused(f'[[{table}]]\nname = "x"\n[[{table}]]\nname = "x"\n')
    assert error.where == f'{table}[2] (name = "x").name'
    assert f'duplicate name: another entry of [[{table}]] is also named "x"' in str(error)


@pytest.mark.parametrize("table", ["departments", "projects", "node_pools"])
def test_missing_name(table):
    error = refused(f'[[{table}]]\nname = "ok"\n[[{table}]]\ngpu_quota = 1\n'
                    if table != "node_pools" else f'[[{table}]]\nname = "ok"\n[[{table}]]\nplacement = "spread"\n')
    assert error.where == f"{table}[2].name"
    assert "is required" in str(error)


def test_empty_name_is_refused():
    error = refused('[[projects]]\nname = ""\n')
    assert error.where == "projects[1].name" and "must not be empty" in str(error)


@pytest.mark.parametrize("text, where", [
    ('placement = "binpak"', "placement"),
    ('cpu_placement = "fill"', "cpu_placement"),
    ('gpu_placement = "fill"', "gpu_placement"),
    ('[[node_pools]]\nname = "h100"\nplacement = "fill"', 'node_pools[1] (name = "h100").placement'),
    ('[[node_pools]]\nname = "h100"\ngpu_placement = "fill"', 'node_pools[1] (name = "h100").gpu_placement'),
])
def test_unknown_placement_strategy_lists_the_known_ones(text, where):
    error = refused(text)
    assert error.where == where
    assert "unknown placement strategy" in str(error)
    assert "(known strategies: binpack, spread)" in str(error)


def test_unknown_placement_suggests_the_closest():
    assert 'did you mean "binpack"?' in str(refused('placement = "binpak"'))


def test_unknown_pool_in_a_per_pool_table_when_node_pools_are_declared():
    error = refused("""
[[node_pools]]
name = "h100"
[[projects]]
name = "p"
gpu_quota = { h100 = 1, h10 = 2 }
""")
    assert error.where == 'projects[1] (name = "p").gpu_quota.h10'
    assert 'unknown node pool "h10"' in str(error)
    assert "node pools: default, h100" in str(error)


def test_the_default_pool_is_known_even_when_not_declared():
    policy = parse('[[node_pools]]\nname = "h100"\n[[projects]]\nname = "p"\ngpu_quota = { default = 1 }\n')
    assert policy.projects["p"].quota_in("default").gpu == 1


def test_unknown_pool_in_a_limit_table():
    error = refused('[[node_pools]]\nname = "h100"\n[[departments]]\nname = "d"\ncpu_limit = { a100 = 3 }\n')
    assert error.where == 'departments[1] (name = "d").cpu_limit.a100'


def test_limit_below_quota():
    error = refused('[[projects]]\nname = "p"\ngpu_quota = 4\ngpu_limit = 2\n')
    assert error.where == 'projects[1] (name = "p").gpu_limit'
    assert 'gpu_limit (2) is below gpu_quota (4) in node pool "default"' in str(error)


def test_limit_below_quota_per_pool():
    error = refused('[[departments]]\nname = "d"\nmemory_quota_gib = { h100 = 64 }\n'
                    'memory_limit_gib = { h100 = 32, default = 1 }\n')
    assert error.where == 'departments[1] (name = "d").memory_limit_gib'
    assert 'in node pool "h100"' in str(error)


def test_limit_equal_to_quota_is_fine():
    policy = parse('[[projects]]\nname = "p"\ngpu_quota = 4\ngpu_limit = 4\n')
    assert policy.projects["p"].limit_in("default").gpu == 4


def test_errors_inside_a_scenario_carry_the_table_prefix():
    with pytest.raises(ConfigError) as info:
        parse_policy({"projects": [{"name": "p", "gpu_quota": -1}]}, "s.toml", where="policy")
    assert info.value.where == 'policy.projects[1] (name = "p").gpu_quota'


def test_load_policy_reads_a_file(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text('[[projects]]\nname = "p"\ngpu_quota = 1\n')
    assert load_policy(path).projects["p"].quota_in("default").gpu == 1


def test_load_policy_turns_a_syntax_error_into_a_config_error_with_the_line(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text('placement = "binpack"\n[[projects]]\nname = \n')
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    assert info.value.source == str(path)
    assert info.value.where.startswith("line 3")
    assert str(path) in str(info.value) and "line 3, column" in str(info.value)
    assert "TOML syntax error" in str(info.value)


def test_load_policy_reports_an_unterminated_string(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text('placement = "binpack')
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    assert "TOML syntax error" in str(info.value)


def test_load_policy_refuses_a_missing_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_policy(tmp_path / "nope.toml")
    assert "nope.toml" in str(info.value) and "cannot read the file" in str(info.value)


def test_load_policy_refuses_a_directory(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_policy(tmp_path)
    assert "cannot read the file" in str(info.value)


def test_load_policy_refuses_binary(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_bytes(b"placement = \"\xff\"\n")
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    assert "not UTF-8" in str(info.value)


def test_load_policy_names_the_file_in_semantic_errors(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text('[[projects]]\nname = "p"\ndepartment = "nope"\n')
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    assert str(info.value).startswith(f'{path}: projects[1] (name = "p").department: unknown department')


def test_the_example_policy_loads():
    policy = load_policy(REPO / "etc" / "gpud" / "policy.toml")
    assert set(policy.departments) == {"research", "product", "default"}
    assert policy.departments["default"].implicit
    assert policy.projects["vision"].quota_in("h100").gpu == 2
    assert policy.projects["vision"].limit_in("default").gpu == 6
    assert set(policy.pools) == {"default", "h100"}
    assert policy.priority_classes["nightly"] == 40
