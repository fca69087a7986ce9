"""The SLURM_* variables a task gets, and Slurm's hostlist form, as Slurm's own tools write them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpud import slurm_env
from gpud.slurm_env import TaskFacts, array_span, array_vars, expand_hostlist, hostlist, merged_env, task_vars


def facts(**kw) -> TaskFacts:
    base = dict(job_id="7", job_name="train.sh", user="ana", account="vision", partition="default", procid=0,
                nodes=("node01",), cpus_per_task=4.0, gpus_on_node=2, mem_per_node_mib=16384,
                submit_dir="/home/ana", submit_host="login1", restart_count=0)
    base.update(kw)
    return TaskFacts(**base)


def test_single_task_gets_the_sbatch_variables():
    env = task_vars(facts())
    assert env["SLURM_JOB_ID"] == env["SLURM_JOBID"] == "7"
    assert env["SLURM_JOB_NAME"] == "train.sh"
    assert env["SLURM_NTASKS"] == env["SLURM_NPROCS"] == "1"
    assert (env["SLURM_PROCID"], env["SLURM_LOCALID"], env["SLURM_NODEID"]) == ("0", "0", "0")
    assert env["SLURM_JOB_NUM_NODES"] == env["SLURM_NNODES"] == "1"
    assert env["SLURM_JOB_NODELIST"] == env["SLURM_NODELIST"] == "node01"
    assert env["SLURM_CPUS_PER_TASK"] == "4"
    assert env["SLURM_GPUS_ON_NODE"] == "2"
    assert env["SLURM_MEM_PER_NODE"] == "16384"
    assert (env["SLURM_SUBMIT_DIR"], env["SLURM_SUBMIT_HOST"]) == ("/home/ana", "login1")
    assert (env["SLURM_JOB_ACCOUNT"], env["SLURM_JOB_PARTITION"]) == ("vision", "default")
    assert env["SLURM_RESTART_COUNT"] == "0"
    assert not any(name.startswith("SLURM_ARRAY_") for name in env)


def test_gang_ranks_nodes_and_local_ids():
    nodes = ("node02", "node01", "node02", "node03")
    envs = [task_vars(facts(nodes=nodes, procid=rank)) for rank in range(4)]
    assert [e["SLURM_PROCID"] for e in envs] == ["0", "1", "2", "3"]
    assert {e["SLURM_NTASKS"] for e in envs} == {"4"}
    assert [e["SLURM_LOCALID"] for e in envs] == ["0", "0", "1", "0"]
    # The node list is in rank order, so its first node is rank 0's (where a script puts its master).
    assert [e["SLURM_NODEID"] for e in envs] == ["0", "1", "0", "2"]
    assert {e["SLURM_JOB_NODELIST"] for e in envs} == {"node[02,01,03]"}
    assert expand_hostlist(envs[0]["SLURM_JOB_NODELIST"])[0] == "node02"
    assert {e["SLURM_JOB_NUM_NODES"] for e in envs} == {"3"}
    assert envs[0]["SLURM_TASKS_PER_NODE"] == "2,1(x2)"
    assert envs[2]["SLURMD_NODENAME"] == "node02"


def test_cpus_per_task_is_a_whole_number_of_at_least_one():
    assert task_vars(facts(cpus_per_task=0.5))["SLURM_CPUS_PER_TASK"] == "1"
    assert task_vars(facts(cpus_per_task=0))["SLURM_CPUS_PER_TASK"] == "1"
    assert task_vars(facts(cpus_per_task=2.5))["SLURM_CPUS_PER_TASK"] == "3"


def test_array_variables():
    env = array_vars("12", 3, array_span(range(10)))
    assert env == {"SLURM_ARRAY_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "10",
                   "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "9", "SLURM_ARRAY_TASK_STEP": "1"}
    assert array_span([9, 0, 6, 3]) == slurm_env.ArraySpan(count=4, low=0, high=9, step=3)
    assert array_span([1, 3, 7]).step == 1
    assert array_span([5]) == slurm_env.ArraySpan(1, 5, 5, 1)


def test_merged_env_keeps_the_jobs_own_but_not_stale_slurm_names():
    copied = {"PATH": "/bin", "SLURM_JOB_ID": "999", "SLURM_ARRAY_TASK_ID": "4", "SLURM_CPU_BIND": "none"}
    plain = merged_env(copied, task_vars(facts()), is_array=False)
    assert plain["SLURM_JOB_ID"] == "7" and "SLURM_ARRAY_TASK_ID" not in plain
    assert plain["PATH"] == "/bin" and plain["SLURM_CPU_BIND"] == "none"
    element = merged_env({**copied, **array_vars("7", 2, array_span([1, 2]))}, task_vars(facts()), is_array=True)
    assert element["SLURM_ARRAY_TASK_ID"] == "2"


@pytest.mark.parametrize("names, text", [
    (["node01", "node02", "node03"], "node[01-03]"),
    (["n1", "n2", "n3", "n7"], "n[1-3,7]"),
    (["n1", "n3", "n2", "n7"], "n[1,3,2,7]"),
    (["node01", "gpu7", "node02"], "node01,gpu7,node02"),
    (["localhost"], "localhost"),
    (["a", "a"], "a"),
    (["node9", "node10"], "node9,node10"),
])
def test_hostlist_form(names, text):
    assert hostlist(names) == text


def test_expand_hostlist():
    assert expand_hostlist("gpu7,node[01-03,07]") == ["gpu7", "node01", "node02", "node03", "node07"]
    assert expand_hostlist("host") == ["host"]
    with pytest.raises(ValueError, match="unbalanced"):
        expand_hostlist("node[01-03")


@given(st.lists(st.from_regex(r"[a-c]{1,3}[0-9]{0,3}", fullmatch=True), min_size=1, max_size=12))
def test_hostlist_round_trips(names):
    assert expand_hostlist(hostlist(names)) == list(dict.fromkeys(names))


def test_every_variable_set_is_one_the_merge_protects():
    env = task_vars(facts())
    assert set(env) == slurm_env.TASK_NAMES
