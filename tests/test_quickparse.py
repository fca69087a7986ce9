"""A plain gpuctl submit or queue, read without argparse, means exactly what argparse makes of it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpud.cli import gpuctl, queue_cmd, submit_cmd
from gpud.cli.quickparse import OptionTable

# Words a command line is made of: every option of both verbs, a few misspelt or abbreviated ones, values
# good and bad for their types, and words argparse reads in its own ways (-pvision, --gpus=1, -, -5, -h).
OPTIONS = ["-p", "--project", "-J", "--name", "--gpus", "--gpu-memory", "--gpu-compute-request",
           "--gpu-compute-limit", "-n", "--tasks", "--min-tasks", "-c", "--cpus", "--mem", "--priority",
           "--constraint", "--pool", "--partition", "--qos", "--workdir", "--env", "--export-env", "-t", "--time",
           "-a", "--array", "-d", "--depends", "-H", "--hold", "--no-requeue", "--signal", "-o", "--output", "-e",
           "--error", "--from-file", "--parsable", "-u", "--user", "--me", "--state", "--all", "-r", "--start",
           "--json", "-h", "--help", "--proj", "--gpu", "--bogus", "-x", "-pvision", "--gpus=1", "--gpus=2.5",
           "--env=A=1", "--hold=yes", "-p=vision", "--name="]
VALUES = ["vision", "1", "0.5", "2.5", "-5", "-", "", "16G", "20GiB", "90", "1:30:00", "0-99%8", "1,3,5-7",
          "afterok:1", "afterok:1:2,afterany:3", "bogus:1", "A=1", "HOME", "gpu_type=h100", "USR1@60", "B:USR1@60",
          "TERM", "inference", "7", "PD,R", "RUNNING", "nope", "train.sh", "jobs.jsonl", "a b"]
WORDS = st.lists(st.sampled_from(OPTIONS + VALUES), max_size=8)


def argparse_reading(verb: str, argv: list[str]) -> dict | None:
    """What gpuctl's argparse parser makes of ``verb argv``: its namespace, or None when it refuses the line."""
    parser = gpuctl.build_parser(verb)
    try:
        args, extras = parser.parse_known_args([verb, *argv])
    except SystemExit:
        return None
    return None if extras else vars(args)


def compared(namespace: dict) -> dict:
    """A namespace with its function named by what it runs (each parse wraps it anew)."""
    return {**namespace, "func": namespace["func"].__wrapped__}


@settings(max_examples=400, deadline=None)
@given(verb=st.sampled_from(sorted(gpuctl.QUICK)), argv=WORDS)
def test_a_line_read_quickly_is_read_as_argparse_reads_it(verb, argv):
    quick = gpuctl.quick_parse(verb, [verb, *argv])
    if quick is None:
        return  # argparse reads it
    expected = argparse_reading(verb, argv)
    assert expected is not None, f"argparse refuses {argv}, the quick reading took it as {vars(quick)}"
    assert compared(vars(quick)) == compared(expected)


@pytest.mark.parametrize("verb,argv", [
    ("submit", ["-p", "vision", "--gpus", "1"]),
    ("submit", ["--project=vision", "--gpus", "0.5", "--mem", "32G", "--time", "90", "--env", "A=1", "--env", "B"]),
    ("submit", ["-p", "hpo", "--array", "0-99%8", "--depends", "afterok:1:2", "--hold", "--parsable"]),
    ("submit", ["train.sh", "-J", "first"]),
    ("submit", ["-p", "sweep", "--from-file", "jobs.jsonl"]),
    ("queue", []),
    ("queue", ["--me", "--state", "PD,R", "--json"]),
    ("queue", ["-u", "ann", "-p", "vision", "--all", "-r"]),
])
def test_the_usual_lines_are_read_quickly(verb, argv):
    quick = gpuctl.quick_parse(verb, [verb, *argv])
    assert quick is not None
    assert compared(vars(quick)) == compared(argparse_reading(verb, argv))


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["--proj", "vision"], ["-pvision"], ["--priority", "-5"],
                                  ["--gpus", "1.5"], ["a.sh", "b.sh"], ["--hold=yes"], ["-p"]])
def test_what_argparse_says_more_about_goes_to_argparse(argv):
    assert gpuctl.quick_parse("submit", ["submit", *argv]) is None


def test_a_declaration_the_table_does_not_read_leaves_every_line_to_argparse():
    table = OptionTable()
    submit_cmd.add_arguments(table)
    assert table.parse(["-p", "vision"]) is not None
    table.add_argument("--mode", choices=["a", "b"])
    assert table.parse(["-p", "vision"]) is None


def test_only_the_verb_first_is_read_quickly():
    assert gpuctl.quick_parse("queue", ["--version", "queue"]) is None
    assert gpuctl.quick_parse("history", ["history"]) is None
    assert set(gpuctl.QUICK) == {"submit", "queue"}
    assert queue_cmd.run_queue is gpuctl.quick_parse("queue", ["queue"]).func.__wrapped__
