"""gpuctl's quick reader of `submit` and `queue` command lines says what argparse says, or leaves the line to it.

Every command line is built from the verb's own declaration (every option, every spelling of it), with
values valid and not, given with '=' or as the next word, short options glued to their value or to each
other, options repeated, abbreviated or unknown, stray words and a `--` command: wherever the quick reader
answers, argparse, given the same words, answers the same namespace; wherever argparse refuses a line or
shows help, the quick reader declines it.
"""

import argparse
import contextlib
import io

import pytest
from hypothesis import example, given, strategies as st

from gpud.cli import gpuctl, queue_cmd, submit_cmd
from gpud.cli.options import Namespace, Options
from gpud.cli.slurm import jobs

VERBS = {"submit": submit_cmd.VERB, "queue": queue_cmd.VERB}

# Values that each option's type takes or refuses, and words that look like options to argparse, or nearly.
VALUES = ["1", "0", "0.5", "2", "-1", "1.5", "inf", "abc", "K=V", "K", "1K=V", "A=", "=x", "x=y=z", "0-9", "0-9%2",
          "3-1", "afterok:1", "afterok:1:2,afterany:3", "after:1", "1:00:00", "90m", "16G", "0G", "20GiB", "USR1@60",
          "B:USR1@60", "TERM", "train", "inference", "PD,R", "pending", "RUNNING", "bogus", "gpu=a100", "-", "",
          " ", "--x", "-x", "a b", "-p", "-1.5", "--", "ü", "٣"]
# Values each option takes, so that whole command lines of valid options are common; "-" and "" are values too.
VALID = {"gpus": ["1", "0.5", "0", "8"], "gpu_memory": ["20GiB", "512M"], "gpu_compute_request": ["0.25"],
         "gpu_compute_limit": ["1"], "tasks": ["4"], "min_tasks": ["2"], "cpus": ["0", "2.5"], "mem": ["16G"],
         "priority": ["train", "100"], "constraint": ["gpu=a100", "k="], "env": ["A=1", "B_2", "C=x=y"],
         "time": ["90", "1:30:00", "2d"], "array": ["0-9", "0-99%8", "1,3,5-7"],
         "depends": ["afterok:1", "afterok:1:2,afterany:3"], "signal": ["USR1@60", "TERM", "B:USR1@60"],
         "state": ["PD,R", "running"]}
PLAIN = ["x", "vision", "a b", "x=y", "-", ""]
STRAY = ["train.sh", "-", "", "--nope", "-Z", "-h", "--help", "--version", "-1", "- x", "--json=1", "x y"]


def _spellings(options: Options) -> list[tuple[str, bool]]:
    """Every option string of the verb, abbreviations of the long ones too, with whether it takes a value."""
    spelled = []
    for argument in options._arguments:
        if argument.positional:
            continue
        takes = argument.action in ("store", "append")
        for flag in argument.flags:
            spelled.append((flag, takes))
            if flag.startswith("--") and len(flag) > 3:
                spelled.append((flag[:len(flag) - 1], takes))
                spelled.append((flag[:3], takes))
    return spelled


@st.composite
def _option_words(draw, options: Options) -> list[str]:
    flag, takes = draw(st.sampled_from(_spellings(options)))
    value = draw(st.sampled_from(VALUES) | st.text(max_size=4))
    form = draw(st.sampled_from(["alone", "next", "equals", "glued", "switches glued"]))
    if form == "next" or (form == "alone" and takes):
        return [flag, value] if takes or form == "next" else [flag]
    if form == "equals":
        return [f"{flag}={value}"]
    if form == "glued" and not flag.startswith("--"):
        return [flag + value]
    if form == "switches glued" and not flag.startswith("--"):
        other, _ = draw(st.sampled_from([s for s in _spellings(options) if not s[0].startswith("--")]))
        return [flag + other[1:]] + ([value] if draw(st.booleans()) else [])
    return [flag]


@st.composite
def _valid_option_words(draw, options: Options) -> list[str]:
    argument = draw(st.sampled_from([a for a in options._arguments if not a.positional]))
    flag = draw(st.sampled_from(argument.flags))
    if argument.action not in ("store", "append"):
        return [flag]
    value = draw(st.sampled_from(VALID.get(argument.dest, PLAIN)))
    form = draw(st.sampled_from(["next", "equals" if flag.startswith("--") else "glued"]))
    if form == "next":
        return [flag, value]
    if form == "equals" or value.startswith("-") or value == "":
        return [f"{flag}={value}"] if form == "equals" else [flag, value]
    return [flag + value]


@st.composite
def valid_command_lines(draw) -> list[str]:
    """Lines of valid options only (a script for submit, sometimes): the quick reader takes most of them."""
    verb = draw(st.sampled_from(sorted(VERBS)))
    parts = draw(st.lists(_valid_option_words(VERBS[verb]), max_size=8))
    if verb == "submit" and draw(st.booleans()):
        parts.insert(draw(st.integers(0, len(parts))), [draw(st.sampled_from(["train.sh", "-"]))])
    words = [verb] + [word for part in parts for word in part]
    if verb == "submit" and draw(st.booleans()):
        words += ["--", "python", "train.py"]
    return words


@st.composite
def command_lines(draw) -> list[str]:
    verb = draw(st.sampled_from(sorted(VERBS)))
    parts = draw(st.lists(_option_words(VERBS[verb]) | st.sampled_from(STRAY).map(lambda w: [w])
                          | st.text(max_size=4).map(lambda w: [w]), max_size=6))
    words = [verb] + [word for part in parts for word in part]
    if draw(st.booleans()):
        words += ["--"] + draw(st.lists(st.sampled_from(["python", "train.py", "--lr", "-p", "--"]), max_size=3))
    return words


def argparse_reads(argv: list[str]) -> argparse.Namespace | None:
    """What gpuctl's argparse path makes of ``argv``: the namespace it runs, or None where it stops the call
    (an error, help, a stray word, a command after -- for a verb that takes none)."""
    words, command = gpuctl.split_command(argv)
    parser = gpuctl.build_parser(words[0])
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            args, extras = parser.parse_known_args(words)
        except SystemExit:
            return None
    if extras or not hasattr(args, "func") or (command is not None and not getattr(args, "takes_command", False)):
        return None
    if command is not None:
        args.command_argv = command
    return args


def quick_reads(argv: list[str]) -> Namespace | None:
    """What gpuctl's quick path makes of ``argv``, as its main does; None where it leaves the line to argparse."""
    words, command = gpuctl.split_command(argv)
    args = gpuctl.quick_parse(words)
    if args is None or (command is not None and not getattr(args, "takes_command", False)):
        return None
    if command is not None:
        args.command_argv = command
    return args


@given(command_lines() | valid_command_lines())
@example(["submit", "-p", "vision", "--gpus", "1", "--", "python", "train.py"])
@example(["submit", "-pvision", "--constraint=gpu=a100", "--constraint", "x=y", "-a", "0-9%2", "--", "true"])
@example(["submit", "train.sh", "-p", "x", "-H"])
@example(["queue", "--me", "-t", "PD,R", "--json"])
def test_the_quick_reader_says_what_argparse_says_or_declines(argv):
    quick = quick_reads(argv)
    if quick is None:
        return  # argparse reads it, as it always did
    slow = argparse_reads(argv)
    assert slow is not None, f"the quick reader took {argv}, which argparse refuses"
    assert vars(quick) == vars(slow)


@st.composite
def squeue_lines(draw) -> list[str]:
    parts = draw(st.lists(_option_words(jobs.SQUEUE) | _valid_option_words(jobs.SQUEUE)
                          | st.sampled_from(STRAY).map(lambda w: [w]), max_size=6))
    return [word for part in parts for word in part]


@given(squeue_lines())
@example(["-h", "-u", "ann", "-u", "bob", "-o", "%.18i %j", "--start"])
@example(["--help"])
@example(["-hr", "-tPD"])
def test_the_quick_reader_of_squeue_says_what_argparse_says_or_declines(argv):
    quick = jobs.SQUEUE.quick_parse(argv)
    if quick is None:
        return  # argparse reads it, and warns about what it does not know
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        slow, extras = jobs.SQUEUE.apply(jobs._parser("squeue")).parse_known_args(argv)
    assert extras == [] and vars(quick) == vars(slow)


@pytest.mark.parametrize("argv", [
    ["submit", "-p", "vision", "--gpus", "1", "--", "python", "train.py"],
    ["submit", "-p", "hpo", "--array", "0-999", "--", "true"],
    ["submit", "--project=nlp", "-n", "4", "--time", "2-00:00:00", "--env", "A=1", "--env=B", "--", "torchrun"],
    ["submit", "train.sh"], ["submit", "-", "--parsable"], ["submit", "--from-file", "jobs.jsonl", "-p", "x"],
    ["queue"], ["queue", "--me"], ["queue", "-p", "vision", "-t", "PENDING", "--json"], ["queue", "--all", "-r"],
])
def test_the_common_command_lines_are_read_quickly(argv):
    quick = quick_reads(argv)
    assert quick is not None
    assert vars(quick) == vars(argparse_reads(argv))


@pytest.mark.parametrize("argv", [
    ["submit", "-h"], ["submit", "--help"], ["submit", "--proj", "x"], ["submit", "--nope"], ["submit", "-p"],
    ["submit", "--gpus", "-1"], ["submit", "--gpus", "abc"], ["submit", "a.sh", "b.sh"], ["submit", "-Hp", "x"],
    ["submit", "-p=x"], ["submit", "--hold=1"], ["queue", "--", "x"], ["queue", "extra"], ["queue", "-t", "bogus"],
    ["--version"], ["-h", "submit"], ["show", "1"],
])
def test_anything_else_goes_to_argparse(argv):
    assert quick_reads(argv) is None


def test_an_options_declaration_builds_the_same_argparse_parser_it_reads():
    options = Options()
    options.set_defaults(level="info")
    options.add_argument("-l", "--level")
    options.add_argument("-v", "--verbose", action="store_true")
    options.add_argument("--tag", action="append")
    parser = options.apply(argparse.ArgumentParser())
    assert parser.parse_args(["-v", "--tag", "a", "--tag=b"]) == \
        argparse.Namespace(level="info", verbose=True, tag=["a", "b"])
    assert options.quick_parse(["-v"]) is None  # argparse passes a string default through the type: left to it
    plain = Options()
    plain.add_argument("-v", "--verbose", action="store_true")
    assert vars(plain.quick_parse(["-v"], Namespace(verbose=False, seen=1))) == {"verbose": True, "seen": 1}


@given(st.lists(st.lists(_option_words(submit_cmd.JOB_OPTIONS) | _valid_option_words(submit_cmd.JOB_OPTIONS),
                         min_size=1, max_size=4), max_size=4))
@example([[["--gpus", "1"], ["-pvision"]], [["--gpus", "2"], ["--env", "A=1"]], [["--env=B=2"]]])
def test_directive_lines_are_read_quickly_as_argparse_reads_them(lines):
    from gpud.directives import Directive, DirectiveError, parse_directives
    directives = [Directive(number, tuple(word for part in parts for word in part))
                  for number, parts in enumerate(lines, start=1)]
    quick: Namespace | None = Namespace()
    for directive in directives:
        quick = submit_cmd.JOB_OPTIONS.quick_parse(list(directive.args), quick)
        if quick is None:
            return  # argparse reads them all, as it always did
    try:
        slow = parse_directives(submit_cmd.directive_parser(), directives)
    except DirectiveError as exc:
        raise AssertionError(f"the quick reader took {directives}, which argparse refuses: {exc}") from None
    assert vars(quick) == vars(slow)
