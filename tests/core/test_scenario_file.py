"""Tests for reading scenario files: defaults, expansion, GPU bookkeeping, impossible states, expectations."""

import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gpud.errors import ConfigError
from gpud.model import NodeSpec, TaskPlacement, TaskRequest
from gpud.scenario import Expectations, load_scenario, parse_scenario

SHARED = Path(__file__).resolve().parents[3] / "shared" / "scenarios"
LOCAL = Path(__file__).resolve().parents[1] / "scenarios"

BASE = """
[[policy.projects]]
name = "p1"

[[nodes]]
name = "n1"
gpus = 4
"""


def parse(text, base=BASE, head=""):
    return parse_scenario(tomllib.loads(head + base + text), "s.toml")


def refused(text, base=BASE, head=""):
    with pytest.raises(ConfigError) as info:
        parse(text, base, head)
    return info.value


def jobs(scenario):
    return {job.id: job for job in scenario.snapshot.jobs}


def placements(scenario, name):
    return jobs(scenario)[name].placements


# defaults ------------------------------------------------------------------

def test_defaults():
    s = parse('[[jobs]]\nname = "j"\nproject = "p1"\n')
    assert s.source == "s.toml"
    assert s.cycles == 1 and s.stable_cycles == 0 and s.expect is None
    assert s.policy.min_runtime_s == 0.0
    assert s.snapshot.nodes == (NodeSpec("n1", gpus=4, gpu_memory_gib=80.0, cpus=64.0,
                                         memory_gib=512.0, pool="default", labels={}),)
    job = jobs(s)["j"]
    assert job.request == TaskRequest(gpus=0.0, gpu_memory_gib=None, cpus=1.0, memory_gib=1.0)
    assert job.priority == 50 and job.preemptible
    assert (job.tasks, job.min_tasks, job.submitted, job.started) == (1, None, 0.0, None)
    assert job.placements == (None,)
    assert job.pool is None and job.node_selector == {}
    assert s.snapshot.now == 3600.0


def test_now_defaults_to_latest_submitted_or_started_plus_an_hour():
    s = parse("""
[[jobs]]
name = "a"
project = "p1"
gpus = 1
submitted = 10
started = 500
running_on = ["n1"]
[[jobs]]
name = "b"
project = "p1"
submitted = 200
""")
    assert s.snapshot.now == 4100.0


def test_explicit_settings():
    s = parse('[[jobs]]\nname = "j"\nproject = "p1"\nsubmitted = 50\n',
              head="now = 50\ncycles = 3\nstable_cycles = 2\n")
    assert (s.snapshot.now, s.cycles, s.stable_cycles) == (50.0, 3, 2)


def test_min_runtime_in_the_scenario_policy_is_kept():
    s = parse("", base='[policy]\nmin_runtime = 120\n' + BASE)
    assert s.policy.min_runtime_s == 120.0


def test_node_keys():
    s = parse("""
[[nodes]]
name = "n2"
gpus = 2
gpu_memory_gib = 40
cpus = 16
memory_gib = 128
pool = "a100"
labels = { gpu = "a100", rack = "r1" }
""")
    assert s.snapshot.nodes[1] == NodeSpec("n2", 2, 40.0, 16.0, 128.0, "a100", {"gpu": "a100", "rack": "r1"})


def test_node_pool_defaults_to_the_policy_default_pool():
    s = parse("", base='[policy]\ndefault_pool = "main"\n' + BASE)
    assert s.snapshot.nodes[0].pool == "main"


def test_cpu_only_job_with_zero_cpus_and_memory():
    s = parse('[[jobs]]\nname = "j"\nproject = "p1"\ncpus = 0\nmemory_gib = 0\nrunning_on = ["n1"]\n')
    job = jobs(s)["j"]
    assert job.request.cpus == 0 and job.request.memory_gib == 0
    assert job.placements == (TaskPlacement("n1", (), 0.0),)


# priorities ----------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [('"inference"', 125), ('"build"', 100),
                                              ('"interactive-preemptible"', 75), ('"train"', 50), ("7", 7)])
def test_priority_names_and_integers(value, expected):
    s = parse(f'[[jobs]]\nname = "j"\nproject = "p1"\npriority = {value}\n')
    assert jobs(s)["j"].priority == expected


def test_priority_classes_of_the_scenario_policy():
    s = parse('[[jobs]]\nname = "j"\nproject = "p1"\npriority = "nightly"\n',
              base='[policy.priority_classes]\nnightly = 20\n' + BASE)
    assert jobs(s)["j"].priority == 20


def test_unknown_priority_class():
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\npriority = "trian"\n')
    assert error.where == 'jobs[1] (name = "j").priority'
    assert 'unknown priority class "trian"; did you mean "train"?' in str(error)
    assert "inference (125)" in str(error)


def test_priority_must_not_be_a_boolean_or_float():
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\npriority = true\n')
    assert "expected a priority class name or an integer, got a boolean (true)" in str(error)
    assert "got a float" in str(refused('[[jobs]]\nname = "j"\nproject = "p1"\npriority = 1.5\n'))


# count expansion -----------------------------------------------------------

def test_count_expands_in_order_with_increasing_seq():
    s = parse("""
[[jobs]]
name = "first"
project = "p1"
submitted = 5
[[jobs]]
name = "a"
count = 3
project = "p1"
gpus = 1
submitted = 7
running_on = ["n1"]
[[jobs]]
name = "last"
project = "p1"
""")
    ids = [job.id for job in s.snapshot.jobs]
    assert ids == ["first", "a-1", "a-2", "a-3", "last"]
    assert [job.seq for job in s.snapshot.jobs] == [0, 1, 2, 3, 4]
    copies = [jobs(s)[f"a-{k}"] for k in (1, 2, 3)]
    assert all(job.submitted == 7 and job.started == 7 for job in copies)
    assert [job.placements[0].gpu_index for job in copies] == [(0,), (1,), (2,)]


def test_count_of_one_still_numbers_the_job():
    s = parse('[[jobs]]\nname = "j"\ncount = 1\nproject = "p1"\n')
    assert [job.id for job in s.snapshot.jobs] == ["j-1"]


def test_count_must_be_positive_and_capped():
    assert "must be at least 1 (got 0)" in str(refused('[[jobs]]\nname = "j"\ncount = 0\nproject = "p1"\n'))
    error = refused('[[jobs]]\nname = "j"\ncount = 100000000\nproject = "p1"\n')
    assert error.where == 'jobs[1] (name = "j").count' and "must be at most" in str(error)


def test_total_jobs_and_tasks_are_capped():
    text = "".join(f'[[jobs]]\nname = "j{i}"\ncount = 100000\nproject = "p1"\n' for i in range(3))
    error = refused(text)
    assert error.where == 'jobs[3] (name = "j2").count' and "more than" in str(error)
    error = refused('[[jobs]]\nname = "j"\ncount = 1000\ntasks = 5000\nproject = "p1"\n')
    assert "more than" in str(error)


def test_duplicate_job_names_including_expanded_ones():
    error = refused('[[jobs]]\nname = "a"\ncount = 2\nproject = "p1"\n[[jobs]]\nname = "a-2"\nproject = "p1"\n')
    assert error.where == 'jobs[2] (name = "a-2").name'
    assert 'duplicate job name "a-2", also made by jobs[1] (name = "a")' in str(error)
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\n[[jobs]]\nname = "j"\nproject = "p1"\n')
    assert error.where == 'jobs[2] (name = "j").name'


def test_copy_errors_name_the_copy():
    error = refused('[[jobs]]\nname = "a"\ncount = 5\nproject = "p1"\ngpus = 1\nrunning_on = ["n1"]\n')
    assert error.where == 'jobs[1] (name = "a").running_on'
    assert '(job "a-5")' in str(error)


# GPU bookkeeping -----------------------------------------------------------

def test_whole_gpu_tasks_without_index_take_the_lowest_free_after_given_indices():
    s = parse("""
[[jobs]]
name = "free"
project = "p1"
gpus = 2
running_on = ["n1"]
[[jobs]]
name = "fixed"
project = "p1"
gpus = 1
running_on = ["n1"]
gpu_index = [[0]]
""")
    assert placements(s, "fixed") == (TaskPlacement("n1", (0,), 1.0),)
    assert placements(s, "free") == (TaskPlacement("n1", (1, 2), 1.0),)


def test_gang_tasks_on_several_nodes():
    s = parse("""
[[nodes]]
name = "n2"
gpus = 4
[[jobs]]
name = "g"
project = "p1"
tasks = 3
gpus = 2
running_on = ["n1", "n2", "n1"]
""")
    assert placements(s, "g") == (TaskPlacement("n1", (0, 1), 1.0), TaskPlacement("n2", (0, 1), 1.0),
                                  TaskPlacement("n1", (2, 3), 1.0))


def test_fraction_shares():
    s = parse("""
[[jobs]]
name = "half"
project = "p1"
gpus = 0.5
running_on = ["n1"]
[[jobs]]
name = "mem"
project = "p1"
gpu_memory_gib = 20
running_on = ["n1"]
[[jobs]]
name = "big"
project = "p1"
gpus = 0.6
running_on = ["n1"]
[[jobs]]
name = "whole"
project = "p1"
gpus = 1
running_on = ["n1"]
""")
    assert placements(s, "whole") == (TaskPlacement("n1", (0,), 1.0),)
    assert placements(s, "half") == (TaskPlacement("n1", (1,), 0.5),)
    assert placements(s, "mem") == (TaskPlacement("n1", (1,), 0.25),)
    assert placements(s, "big") == (TaskPlacement("n1", (2,), 0.6),)
    mem = jobs(s)["mem"]
    assert mem.request.is_shared and mem.request.gpu_memory_gib == 20 and mem.request.gpus == 0


def test_shared_task_prefers_a_gpu_already_shared():
    s = parse("""
[[jobs]]
name = "a"
project = "p1"
gpus = 0.25
running_on = ["n1"]
gpu_index = [[2]]
[[jobs]]
name = "b"
project = "p1"
gpus = 0.5
running_on = ["n1"]
""")
    assert placements(s, "b") == (TaskPlacement("n1", (2,), 0.5),)


def test_fractions_fill_a_gpu_exactly():
    s = parse('[[jobs]]\nname = "t"\ncount = 3\nproject = "p1"\ngpus = 0.3333333333333333\n'
              'running_on = ["n1"]\n[[jobs]]\nname = "x"\nproject = "p1"\ngpus = 0.5\nrunning_on = ["n1"]\n')
    assert [placements(s, f"t-{k}")[0].gpu_index for k in (1, 2, 3)] == [(0,), (0,), (0,)]
    assert placements(s, "x")[0].gpu_index == (1,)


def test_elastic_job_with_a_pending_task():
    s = parse('[[jobs]]\nname = "e"\nproject = "p1"\ntasks = 3\nmin_tasks = 2\ngpus = 1\n'
              'running_on = ["n1", "", "n1"]\ngpu_index = [[3], [], [1]]\n')
    job = jobs(s)["e"]
    assert job.placements == (TaskPlacement("n1", (3,), 1.0), None, TaskPlacement("n1", (1,), 1.0))
    assert job.running_tasks == 2 and job.gang_minimum == 2


def test_running_on_all_pending_is_a_pending_job():
    s = parse('[[jobs]]\nname = "e"\nproject = "p1"\ntasks = 2\ngpus = 1\nrunning_on = ["", ""]\n')
    assert jobs(s)["e"].placements == (None, None) and jobs(s)["e"].started is None


def test_started_defaults_to_submitted():
    s = parse('[[jobs]]\nname = "j"\nproject = "p1"\nsubmitted = 30\nrunning_on = ["n1"]\n')
    assert jobs(s)["j"].started == 30.0


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.sampled_from(["0.25", "0.5", "0.75", "1", "2", "3", "gpu_memory_gib = 20"]), max_size=8))
def test_running_gpus_never_overlap_or_exceed_a_share_of_one(requests):
    text = "".join(f'[[jobs]]\nname = "j{i}"\nproject = "p1"\n'
                   f'{r if r.startswith("gpu_") else "gpus = " + r}\nrunning_on = ["n1"]\n'
                   for i, r in enumerate(requests))
    try:
        s = parse(text)
    except ConfigError as error:
        assert error.where.endswith(".running_on")
        return
    used = [0.0] * 4
    for job in s.snapshot.jobs:
        (placement,) = job.placements
        assert len(placement.gpu_index) == (1 if job.request.is_shared else job.request.whole_gpus)
        for i in placement.gpu_index:
            used[i] += placement.gpu_share
    assert all(u <= 1.0 + 1e-9 for u in used)


# impossible states ---------------------------------------------------------

def test_running_on_an_unknown_node():
    text = "".join(f'[[jobs]]\nname = "j{i}"\nproject = "p1"\n' for i in (1, 2))
    error = refused(text + '[[jobs]]\nname = "big"\nproject = "p1"\nrunning_on = ["n9"]\n')
    assert str(error) == 's.toml: jobs[3] (name = "big").running_on: node "n9" is not in [[nodes]]'


def test_running_on_with_the_wrong_number_of_entries():
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\ntasks = 2\nrunning_on = ["n1"]\n')
    assert error.where == 'jobs[1] (name = "j").running_on'
    assert "has 1 entries for 2 task(s)" in str(error)


def test_running_on_entries_must_be_strings():
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\nrunning_on = [1]\n')
    assert error.where == 'jobs[1] (name = "j").running_on[1]' and "expected a node name" in str(error)


def test_running_below_the_gang_minimum():
    error = refused('[[jobs]]\nname = "g"\nproject = "p1"\ntasks = 2\nrunning_on = ["n1", ""]\n')
    assert error.where == 'jobs[1] (name = "g").running_on' and "gang minimum (2)" in str(error)


def test_node_over_its_gpus():
    error = refused('[[jobs]]\nname = "a"\nproject = "p1"\ngpus = 3\nrunning_on = ["n1"]\n'
                    '[[jobs]]\nname = "b"\nproject = "p1"\ngpus = 2\nrunning_on = ["n1"]\n')
    assert error.where == 'jobs[2] (name = "b").running_on'
    assert 'node "n1" has 4 GPU(s) and 1 free for task 1, which needs 2' in str(error)


def test_node_over_its_cpus_and_memory():
    error = refused('[[jobs]]\nname = "a"\nproject = "p1"\ncpus = 40\ncount = 2\nrunning_on = ["n1"]\n')
    assert error.where == 'jobs[1] (name = "a").running_on'
    assert 'node "n1" has 64 CPUs but its running tasks ask for 80' in str(error)
    error = refused('[[jobs]]\nname = "a"\nproject = "p1"\nmemory_gib = 600\nrunning_on = ["n1"]\n')
    assert "512 GiB of memory" in str(error)


def test_gpu_over_share_one_with_given_indices():
    error = refused('[[jobs]]\nname = "a"\nproject = "p1"\ngpus = 0.75\nrunning_on = ["n1"]\ngpu_index = [[1]]\n'
                    '[[jobs]]\nname = "b"\nproject = "p1"\ngpus = 1\nrunning_on = ["n1"]\ngpu_index = [[1]]\n')
    assert error.where == 'jobs[2] (name = "b").gpu_index'
    assert 'GPU 1 of node "n1" would be used beyond a share of 1' in str(error)


def test_shared_task_with_no_room_left():
    base = '[[policy.projects]]\nname = "p1"\n[[nodes]]\nname = "n1"\ngpus = 1\n'
    error = refused('[[jobs]]\nname = "a"\nproject = "p1"\ngpus = 0.6\ncount = 2\nrunning_on = ["n1"]\n', base)
    assert error.where == 'jobs[1] (name = "a").running_on'
    assert 'no GPU with a share of 0.6 free' in str(error) and '"a-2"' in str(error)


def test_gpu_index_out_of_range():
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\ngpus = 1\nrunning_on = ["n1"]\ngpu_index = [[4]]\n')
    assert error.where == 'jobs[1] (name = "j").gpu_index[1]'
    assert 'GPU 4 is out of range: node "n1" has 4 GPU(s)' in str(error)


@pytest.mark.parametrize("gpus, index, words", [
    ("2", "[[0]]", "holds 2 GPU(s), so give 2 index(es) (got 1)"),
    ("0.5", "[[0, 1]]", "holds 1 GPU(s)"),
    ("0", "[[0]]", "holds 0 GPU(s)"),
    ("2", "[[1, 1]]", "names a GPU more than once"),
    ("1", "[[-1]]", "must not be negative"),
])
def test_gpu_index_of_the_wrong_length(gpus, index, words):
    error = refused(f'[[jobs]]\nname = "j"\nproject = "p1"\ngpus = {gpus}\nrunning_on = ["n1"]\ngpu_index = {index}\n')
    assert error.where.startswith('jobs[1] (name = "j").gpu_index[1]')
    assert words in str(error)


def test_gpu_index_needs_one_entry_per_task_and_running_on():
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\ngpus = 1\ntasks = 2\nrunning_on = ["n1", "n1"]\n'
                    'gpu_index = [[0]]\n')
    assert error.where == 'jobs[1] (name = "j").gpu_index' and "has 1 entries for 2 task(s)" in str(error)
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\ngpus = 1\ngpu_index = [[0]]\n')
    assert error.where == 'jobs[1] (name = "j").gpu_index' and "give running_on too" in str(error)
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\ngpus = 1\ntasks = 2\nmin_tasks = 1\n'
                    'running_on = ["n1", ""]\ngpu_index = [[0], [1]]\n')
    assert error.where == 'jobs[1] (name = "j").gpu_index[2]' and "task 2 is pending" in str(error)


def test_started_rules():
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\nstarted = 5\n')
    assert error.where == 'jobs[1] (name = "j").started' and "only a running job" in str(error)
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\nsubmitted = 10\nstarted = 5\nrunning_on = ["n1"]\n')
    assert "must not be before submitted (10) (got 5)" in str(error)


def test_times_after_now():
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\nsubmitted = 200\n', head="now = 100\n")
    assert error.where == 'jobs[1] (name = "j").submitted' and "is after now (100)" in str(error)
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\nstarted = 200\nrunning_on = ["n1"]\n', head="now = 100\n")
    assert error.where == 'jobs[1] (name = "j").started'


def test_requests():
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\ngpus = 0.5\ngpu_memory_gib = 10\n')
    assert error.where == 'jobs[1] (name = "j").gpu_memory_gib' and "not both" in str(error)
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\ngpus = 1.5\n')
    assert error.where == 'jobs[1] (name = "j").gpus' and "whole number of GPUs (got 1.5)" in str(error)
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\ngpus = -1\n')
    assert "must not be negative (got -1)" in str(error)
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\ngpu_memory_gib = 0\n')
    assert "must be greater than 0" in str(error)
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\ngpu_memory_gib = 100\nrunning_on = ["n1"]\n')
    assert error.where == 'jobs[1] (name = "j").gpu_memory_gib'
    assert 'asks for 100 GiB but a GPU of node "n1" has 80 GiB' in str(error)


def test_whole_number_of_gpus_as_a_float_is_fine():
    s = parse('[[jobs]]\nname = "j"\nproject = "p1"\ngpus = 2.0\nrunning_on = ["n1"]\n')
    assert placements(s, "j")[0].gpu_index == (0, 1)


def test_tasks_and_min_tasks():
    assert "must be at least 1" in str(refused('[[jobs]]\nname = "j"\nproject = "p1"\ntasks = 0\n'))
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\ntasks = 2\nmin_tasks = 3\n')
    assert error.where == 'jobs[1] (name = "j").min_tasks' and "at most tasks (2)" in str(error)


def test_unknown_project():
    error = refused('[[jobs]]\nname = "j"\nproject = "p1x"\n')
    assert error.where == 'jobs[1] (name = "j").project'
    assert 'unknown project "p1x"; did you mean "p1"?' in str(error)
    assert "(projects in [policy]: p1)" in str(error)


def test_missing_project_and_name():
    assert refused('[[jobs]]\nname = "j"\n').where == 'jobs[1] (name = "j").project'
    assert refused('[[jobs]]\nproject = "p1"\n').where == "jobs[1].name"
    assert refused('[[nodes]]\ngpus = 1\n').where == "nodes[2].name"


def test_duplicate_node_names():
    error = refused('[[nodes]]\nname = "n1"\n')
    assert error.where == 'nodes[2] (name = "n1").name' and "duplicate name" in str(error)


@pytest.mark.parametrize("text, where", [
    ("", "cycle"),
    ('[[nodes]]\nname = "n2"\ngpu = 1\n', 'nodes[2] (name = "n2").gpu'),
    ('[[jobs]]\nname = "j"\nproject = "p1"\nnode_selecter = {}\n', 'jobs[1] (name = "j").node_selecter'),
    ('[expect]\nrunnig = []\n', "expect.runnig"),
    ('[policy]\nplacment = "spread"\n', "policy.placment"),
])
def test_unknown_keys_everywhere(text, where):
    error = refused(text, head="cycle = 2\n" if where == "cycle" else "")
    assert error.where == where and "unknown key; did you mean" in str(error)


def test_policy_errors_name_the_policy_table():
    error = refused("", base='[[policy.projects]]\nname = "p1"\ngpu_quota = -1\n')
    assert error.where == 'policy.projects[1] (name = "p1").gpu_quota'


def test_node_errors():
    assert "expected an integer, got a float (1.5)" in str(refused('[[nodes]]\nname = "n2"\ngpus = 1.5\n'))
    assert "must be at most 1024" in str(refused('[[nodes]]\nname = "n2"\ngpus = 5000\n'))
    error = refused('[[nodes]]\nname = "n2"\nlabels = { gpu = 1 }\n')
    assert error.where == 'nodes[2] (name = "n2").labels.gpu'
    assert refused('[[nodes]]\nname = "n2"\ngpu_memory_gib = 0\n').where == 'nodes[2] (name = "n2").gpu_memory_gib'


def test_cycles_are_bounded():
    assert refused("", head="cycles = 0\n").where == "cycles"
    assert "must be at most" in str(refused("", head="cycles = 100000\n"))
    assert refused("", head="stable_cycles = -1\n").where == "stable_cycles"


def test_pools_and_selectors():
    base = '[[policy.node_pools]]\nname = "h100"\n[[policy.projects]]\nname = "p1"\n' \
           '[[nodes]]\nname = "n1"\ngpus = 4\npool = "h100"\nlabels = { gpu = "h100" }\n'
    s = parse('[[jobs]]\nname = "j"\nproject = "p1"\npool = "h100"\nnode_selector = { gpu = "h100" }\n'
              'running_on = ["n1"]\n', base)
    assert jobs(s)["j"].pool == "h100" and jobs(s)["j"].node_selector == {"gpu": "h100"}
    error = refused('[[nodes]]\nname = "n2"\npool = "a100"\n', base)
    assert error.where == 'nodes[2] (name = "n2").pool' and 'unknown node pool "a100"' in str(error)
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\npool = "h10"\n', base)
    assert error.where == 'jobs[1] (name = "j").pool' and 'did you mean "h100"?' in str(error)
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\npool = "default"\nrunning_on = ["n1"]\n', base)
    assert error.where == 'jobs[1] (name = "j").running_on' and 'not in the job\'s pool "default"' in str(error)
    error = refused('[[jobs]]\nname = "j"\nproject = "p1"\nnode_selector = { gpu = "a100" }\n'
                    'running_on = ["n1"]\n', base)
    assert 'does not match node_selector (gpu = "a100")' in str(error)


def test_any_job_pool_is_fine_without_node_pools():
    s = parse('[[jobs]]\nname = "j"\nproject = "p1"\npool = "elsewhere"\n')
    assert jobs(s)["j"].pool == "elsewhere"


# expectations --------------------------------------------------------------

EXPECT_BASE = BASE + """
[[policy.departments]]
name = "d1"
[[policy.projects]]
name = "p2"
department = "d1"
[[jobs]]
name = "j"
count = 2
project = "p1"
tasks = 2
gpus = 1
"""


def test_expectations_parse():
    s = parse("""
[expect]
running = ["j-1"]
pending = ["j-2"]
preempted = []
placement = { j-1 = ["n1", ""] }
project_gpus = { p1 = 2 }
fair_share = { p1 = 2.5, d1 = 1, default = 3 }
running_tasks = { j-1 = 2 }
gpu_index = { j-1 = [[0], [1]] }
""", EXPECT_BASE)
    assert s.expect == Expectations(
        running=frozenset({"j-1"}), pending=frozenset({"j-2"}), preempted=frozenset(),
        placement={"j-1": ("n1", "")}, project_gpus={"p1": 2.0}, fair_share={"p1": 2.5, "d1": 1.0, "default": 3.0},
        running_tasks={"j-1": 2}, gpu_index={"j-1": ((0,), (1,))})


def test_empty_expect_table_checks_nothing():
    assert parse("[expect]\n").expect == Expectations()


@pytest.mark.parametrize("text, where, words", [
    ('running = ["j"]', "expect.running", 'unknown job "j"'),
    ('preempted = ["j-3"]', "expect.preempted", 'unknown job "j-3"; did you mean'),
    ('pending = ["j-1", "j-1"]', "expect.pending", 'names job "j-1" more than once'),
    ('running = ["j-1"]\npending = ["j-1"]', "expect.pending", 'job "j-1" is also in running'),
    ('placement = { x = ["n1"] }', "expect.placement.x", 'unknown job "x"'),
    ('placement = { j-1 = ["n1"] }', "expect.placement.j-1", 'has 1 entries but job "j-1" has 2 task(s)'),
    ('placement = { j-1 = ["n1", "n7"] }', "expect.placement.j-1", 'node "n7" is not in [[nodes]]'),
    ('project_gpus = { d1 = 1 }', "expect.project_gpus.d1", 'unknown project "d1"'),
    ('project_gpus = { p1 = -1 }', "expect.project_gpus.p1", "must not be negative"),
    ('project_gpus = { p1 = "2" }', "expect.project_gpus.p1", "expected a number"),
    ('fair_share = { d2 = 1 }', "expect.fair_share.d2", 'unknown project or department "d2"'),
    ('running_tasks = { j-1 = 3 }', "expect.running_tasks.j-1", "must be at most 2"),
    ('gpu_index = { j-1 = [[0]] }', "expect.gpu_index.j-1", "has 1 entries"),
    ('gpu_index = { j-1 = [[0], ["a"]] }', "expect.gpu_index.j-1[2]", "expected an integer"),
    ('running = "j-1"', "expect.running", "expected an array of strings"),
    ("placement = 3", "expect.placement", "expected a table"),
])
def test_expectation_errors(text, where, words):
    error = refused("[expect]\n" + text + "\n", EXPECT_BASE)
    assert error.where == where
    assert words in str(error)


# files ---------------------------------------------------------------------

def test_load_scenario_reads_a_file(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(BASE + '[[jobs]]\nname = "j"\nproject = "p1"\n')
    s = load_scenario(path)
    assert s.source == str(path) and [job.id for job in s.snapshot.jobs] == ["j"]


def test_load_scenario_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('cycles = 1\n[[nodes]\nname = "n1"\n')
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert info.value.source == str(path) and info.value.where.startswith("line 2")


def test_load_scenario_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_scenario(tmp_path / "missing.toml")


def test_load_scenario_error_names_the_file(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(BASE + '[[jobs]]\nname = "j"\nproject = "p1"\nrunning_on = ["n2"]\n')
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert str(info.value) == f'{path}: jobs[1] (name = "j").running_on: node "n2" is not in [[nodes]]'


@pytest.mark.parametrize("path", sorted(SHARED.glob("*.toml")), ids=lambda p: p.name)
def test_shared_scenarios_parse(path):
    s = load_scenario(path)
    assert s.snapshot.jobs and s.snapshot.nodes and s.expect is not None
    assert s.stable_cycles == 0


needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="the reference scenarios (../shared) are not beside this checkout")


@needs_shared
def test_there_are_shared_and_local_scenarios():
    shared = sorted(p.name for p in SHARED.glob("*.toml"))
    assert len(shared) >= 16
    # Every reference scenario has its local copy; the local ones beside them are the project's own cases.
    assert set(shared) <= {p.name for p in LOCAL.glob("*.toml")}


@needs_shared
@pytest.mark.parametrize("path", [p for p in sorted(LOCAL.glob("*.toml")) if (SHARED / p.name).exists()],
                         ids=lambda p: p.name)
def test_local_copies_parse_with_stable_cycles(path):
    s = load_scenario(path)
    assert s.stable_cycles == 5
    original = (SHARED / path.name).read_text().splitlines()
    assert [line for line in path.read_text().splitlines() if line != "stable_cycles = 5"] == original


def test_the_consolidation_scenario_state():
    s = load_scenario(LOCAL / "seed001-consolidation.toml")
    assert [job.id for job in s.snapshot.jobs] == ["a-1", "a-2", "a-3", "b", "big"]
    assert [placements(s, f"a-{k}")[0] for k in (1, 2, 3)] == [TaskPlacement("n1", (i,), 1.0) for i in range(3)]
    assert placements(s, "b") == (TaskPlacement("n2", (0,), 1.0),)
    assert placements(s, "big") == (None,)
    assert s.snapshot.now == 3700.0
    assert s.policy.departments["default"].implicit
