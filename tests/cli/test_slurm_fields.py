"""What the Slurm shims print and how they read their command lines, without a cluster."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gpud.cli.slurm import fields
from gpud.cli.slurm.jobs import _expand_ids
from gpud.cli.slurm.srun import expand, parse
from gpud.cli.slurm.submit import _exported, split_command_line

RUNNING = {"id": "12_3", "array_id": "12", "array_index": 3, "name": "sweep", "user": "ann", "project": "vision",
           "state": "RUNNING", "reason": "", "pool": None, "nodes": ["n02", "n01"], "tasks": 2, "cpus": 4,
           "memory_gib": 2, "gpus": 1, "elapsed_s": 3725, "time_limit_s": 7200, "priority_class": "train",
           "priority": 50, "exit_code": None, "term_signal": None}
PENDING = {**RUNNING, "id": "13", "array_id": None, "array_index": None, "state": "PENDING", "nodes": [],
           "reason": "over quota; no idle GPUs", "reason_code": "shortage", "reason_short": "over quota",
           "elapsed_s": 0}


def test_exit_codes_are_code_colon_signal():
    assert fields.exit_code({"exit_code": 0}) == "0:0"
    assert fields.exit_code({"exit_code": 3, "term_signal": None}) == "3:0"
    assert fields.exit_code({"exit_code": None, "term_signal": 9}) == "0:9"


@pytest.mark.parametrize("seconds, sacct, squeue", [
    (5, "00:00:05", "0:05"), (3725, "01:02:05", "1:02:05"), (90061, "1-01:01:01", "1-01:01:01"),
    (None, "UNLIMITED", "UNLIMITED"),
])
def test_durations(seconds, sacct, squeue):
    assert fields.clock(seconds) == sacct
    assert fields.clock(seconds, squeue=True) == squeue


def test_squeue_default_format_heading_and_rows():
    assert fields.squeue_line(fields.SQUEUE_DEFAULT, None).split() == [
        "JOBID", "PARTITION", "NAME", "USER", "ST", "TIME", "NODES", "NODELIST(REASON)"]
    row = fields.squeue_line(fields.SQUEUE_DEFAULT, RUNNING)
    assert row.split() == ["12_3", "default", "sweep", "ann", "R", "1:02:05", "2", "n[01-02]"]
    assert fields.squeue_line("%i %t %R", PENDING) == "13 PD (over quota)"


def test_squeue_widths_and_array_fields():
    assert fields.squeue_line("%.6i|%4t|%5j|%A|%K|%F", RUNNING) == "  12_3|R   |sweep|12|3|12"
    assert fields.squeue_line("%A %K", PENDING) == "13 N/A"
    assert fields.squeue_line("100%%", RUNNING) == "100%"
    with pytest.raises(ValueError, match="%y"):
        fields.squeue_line("%y", RUNNING)


def test_sacct_fields():
    assert fields.sacct_fields("JobID,State%20,exitcode") == ["JobID", "State", "exitcode"]
    with pytest.raises(ValueError, match='Invalid field requested: "Bogus"'):
        fields.sacct_fields("JobID,Bogus")
    row = {name: fields.SACCT_FIELDS[name.lower()](RUNNING) for name in
           ("JobID", "NodeList", "AllocCPUS", "Elapsed", "Timelimit", "AllocTRES", "Partition")}
    assert row == {"JobID": "12_3", "NodeList": "n[01-02]", "AllocCPUS": "8", "Elapsed": "01:02:05",
                   "Timelimit": "02:00:00", "AllocTRES": "cpu=8,mem=4096M,node=2,gres/gpu=2", "Partition": "default"}


def test_sbatch_command_line_splits_options_from_the_script():
    options, own, rest = split_command_line(
        ["--parsable", "-p", "gpu", "--exclusive", "-N2", "--array=0-3", "-J", "x", "job.sh", "--lr", "3"])
    assert options == ["-pgpu", "--exclusive", "-N2", "--array=0-3", "-Jx"]
    assert own == {"parsable": None}
    assert rest == ["job.sh", "--lr", "3"]
    options, own, rest = split_command_line(["--wrap", "echo hi", "--export=NONE"])
    assert (options, own, rest) == ([], {"wrap": "echo hi", "export": "NONE"}, [])


def test_sbatch_export():
    env = {"A": "1", "B": "2"}
    assert _exported(None, env) == (True, {})
    assert _exported("NONE", env) == (False, {})
    assert _exported("ALL,C=3", env) == (True, {"C": "3"})
    assert _exported("A,C=3", env) == (False, {"A": "1", "C": "3"})


def test_scancel_array_forms():
    assert _expand_ids(["12_[1-3,5]", "14", "15_2"]) == ["12_1", "12_2", "12_3", "12_5", "14", "15_2"]
    assert _expand_ids(["12_[0-1%1],13"]) == ["12_0", "12_1", "13"]


def test_srun_reads_its_options_and_the_command():
    options, command = parse(["--unbuffered", "--output", "o/%j_%t.out", "-e", "err", "-n2",
                              "python", "-u", "-m", "x"])
    assert options == {"unbuffered": None, "output": "o/%j_%t.out", "error": "err", "ntasks": "2"}
    assert command == ["python", "-u", "-m", "x"]


def test_srun_output_patterns():
    env = {"SLURM_JOB_ID": "12_3", "SLURM_ARRAY_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "3", "SLURM_PROCID": "1",
           "SLURM_NODEID": "0", "SLURMD_NODENAME": "n01", "SLURM_JOB_NAME": "sweep", "USER": "ann"}
    assert expand("%A_%a_%t.out", env) == "12_3_1.out"
    assert expand("%x-%u-%N-%n-%s-%j-100%%", env) == "sweep-ann-n01-0-0-12_3-100%"


def test_sbatch_passes_script_arguments_to_shell_scripts():
    from gpud.cli.common import UsageError
    from gpud.cli.slurm.submit import with_arguments
    assert with_arguments("#!/bin/bash\n#SBATCH -N 1\necho $1\n", ["a b", "c"]) == \
        "#!/bin/bash\nset -- 'a b' c\n#SBATCH -N 1\necho $1\n"
    assert with_arguments("echo $1\n", ["x"]) == "set -- x\necho $1\n"
    assert with_arguments("#!/usr/bin/env bash\necho\n", ["x"]).splitlines()[1] == "set -- x"
    with pytest.raises(UsageError, match="python3 script"):
        with_arguments("#!/usr/bin/env python3\nprint()\n", ["x"])


@pytest.mark.parametrize("node, state", [
    ({"state": "up", "gpus": [{}, {}], "gpus_used": 0, "gpus_idle": 2, "cpus_used": 0}, "idle"),
    ({"state": "up", "gpus": [{}, {}], "gpus_used": 1, "gpus_idle": 1, "cpus_used": 2}, "mix"),
    ({"state": "up", "gpus": [{}, {}], "gpus_used": 2, "gpus_idle": 0, "cpus_used": 2}, "alloc"),
    ({"state": "up", "gpus": [], "gpus_used": 0, "gpus_idle": 0, "cpus_used": 1}, "mix"),
    ({"state": "draining", "gpus": [{}]}, "drng"), ({"state": "drained", "gpus": [{}]}, "drain"),
    ({"state": "down", "gpus": [{}]}, "down"),
])
def test_sinfo_node_states(node, state):
    from gpud.cli.slurm.jobs import _node_state
    assert _node_state(node) == state


TIMES = st.none() | st.floats(min_value=0, max_value=4e9)
NAMES = st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=8)
# A listed job of any shape: an array element or not, pending or running, with or without limits and nodes.
JOBS = st.fixed_dictionaries({
    "id": NAMES, "array_id": st.none() | NAMES, "array_index": st.none() | st.integers(0, 9999), "name": NAMES,
    "user": NAMES, "state": st.sampled_from(["PENDING", "RUNNING", *sorted(fields.STATE_CODES)]), "pool": st.none() | NAMES,
    "project": NAMES, "priority_class": st.none() | NAMES, "elapsed_s": TIMES, "time_limit_s": TIMES,
    "nodes": st.lists(st.sampled_from(["n01", "n02", "gpu-7"]), max_size=3), "tasks": st.none() | st.integers(1, 64),
    "cpus": st.none() | st.floats(0.5, 64), "memory_gib": st.none() | st.floats(0, 1024),
    "reason_short": st.none() | NAMES, "reason": NAMES, "gpus": st.none() | st.floats(0, 8), "submitted": TIMES,
    "started": TIMES, "ended": TIMES, "workdir": st.none() | NAMES, "command": st.none() | st.lists(NAMES, max_size=3),
    "priority": st.none() | st.integers(0, 10**6), "exit_code": st.none() | st.integers(0, 255),
})


def test_every_squeue_letter_says_which_fields_it_reads():
    assert set(fields.SQUEUE_NEEDS) == set(fields.SQUEUE_FIELDS)


@pytest.mark.parametrize("letter", sorted(fields.SQUEUE_FIELDS))
@settings(max_examples=examples(100), deadline=None)
@given(job=JOBS)
def test_each_squeue_letter_prints_the_same_from_only_the_fields_it_needs(letter, job):
    # squeue asks the controller for those fields alone: each must come out as from the whole job.
    shown = {key: value for key, value in job.items() if key in fields.SQUEUE_NEEDS[letter]}
    assert fields.SQUEUE_FIELDS[letter](shown) == fields.SQUEUE_FIELDS[letter](job)


def test_a_format_needs_the_fields_of_each_of_its_letters():
    assert fields.squeue_needs(fields.SQUEUE_DEFAULT) == {"id", "pool", "name", "user", "state", "elapsed_s",
                                                          "nodes", "tasks", "reason_short"}
    assert fields.squeue_needs("%10j|%.5%%Z %y") == {"name", "workdir"}  # %y: no such letter, refused when printed


def test_start_time_is_the_expected_start_of_a_waiting_job():
    assert fields.start({"state": "PENDING", "estimated_start": None}) == "N/A"
    assert fields.start({"state": "PENDING"}, "Unknown") == "Unknown"
    estimate = 1795003600.0
    assert fields.start({"state": "PENDING", "estimated_start": estimate}) == fields.stamp(estimate)
    assert fields.start({"state": "RUNNING", "started": estimate, "estimated_start": None}) == fields.stamp(estimate)


# squeue reads its -o format and folds node names without importing re: the readers find what these patterns found.
FORMAT_ITEM = r"%(\.)?(\d*)([A-Za-z%])"
TRAILING_DIGITS = r"^(.*?)(\d+)$"


@given(st.text(alphabet=st.sampled_from("%.0123٣9 iMjRxé\n"), max_size=12))
@settings(max_examples=examples(200))
def test_format_items_are_the_ones_the_pattern_finds(fmt):
    import re
    found = [(m.start(), m.end(), m[1] is not None, m[2], m[3]) for m in re.finditer(FORMAT_ITEM, fmt)]
    assert list(fields.format_items(fmt)) == found


@given(st.text(alphabet=st.sampled_from("node01٣9-[],\n "), max_size=10))
@settings(max_examples=examples(200))
def test_node_names_split_where_the_pattern_split_them(name):
    import re

    from gpud.hostlist import _trailing_number
    match = re.match(TRAILING_DIGITS, name)
    assert _trailing_number(name) == (None if match is None else (match[1], match[2]))
