"""#GPUD directive lines: where they are read, how they split, and how the command line overrides them."""

import argparse

import pytest
from hypothesis import example, given, strategies as st

from gpud.cli.submit_cmd import directive_parser, merge
from gpud.directives import Directive, DirectiveError, parse_directives, read_directives, split_words

SCRIPT = """\
#!/bin/bash
# a comment before the directives
#GPUD --project vision --gpus 2

#GPUD -J "my run"   # a comment after the options
#GPUD --env A=1 --env 'B=two words'
#SBATCH --ignored
set -e
#GPUD --gpus 8
python train.py
"""


def test_directives_are_read_from_the_top_until_the_first_command():
    found = read_directives(SCRIPT)
    assert found == [Directive(3, ("--project", "vision", "--gpus", "2")),
                     Directive(5, ("-J", "my run")),
                     Directive(6, ("--env", "A=1", "--env", "B=two words"))]


@pytest.mark.parametrize("text", ["", "#!/bin/sh\n", "echo hi\n#GPUD --gpus 1\n", "#GPUDX --gpus 1\n",
                                  "# GPUD --gpus 1\n"])
def test_no_directives(text):
    assert read_directives(text) == []


def test_a_tab_after_the_prefix_counts():
    assert read_directives("#GPUD\t--gpus 1\n") == [Directive(1, ("--gpus", "1"))]


def test_unbalanced_quotes_name_the_line():
    with pytest.raises(DirectiveError, match=r"job.sh, line 2: No closing quotation"):
        read_directives("#!/bin/sh\n#GPUD -J 'oops\n", "job.sh")


def test_parsed_options_accumulate_and_later_lines_win():
    options = parse_directives(directive_parser(), read_directives(SCRIPT + "#GPUD --gpus 4\n"))
    assert options.project == "vision"
    assert options.gpus == 2  # the later "#GPUD --gpus" lines come after a command: ignored
    assert options.name == "my run"
    assert options.env == [("A", "1"), ("B", "two words")]
    again = parse_directives(directive_parser(), read_directives("#GPUD --gpus 1\n#GPUD --gpus 3\n"))
    assert again.gpus == 3


@pytest.mark.parametrize("line, message", [
    ("#GPUD --nope", "unrecognized arguments: --nope"),
    ("#GPUD --gpus lots", "not a number"),
    ("#GPUD --time forever", "bad time"),
    ("#GPUD --array 5-1", "runs backwards"),
    ("#GPUD train.py", "unrecognized arguments: train.py"),
])
def test_bad_options_name_the_script_and_line(line, message):
    with pytest.raises(DirectiveError, match=rf"^job.sh, line 2: .*{message}"):
        parse_directives(directive_parser(), read_directives(f"#!/bin/sh\n{line}\n", "job.sh"), "job.sh")


def test_the_parser_raises_again_after_a_refusal():
    parser = directive_parser()
    with pytest.raises(DirectiveError):
        parse_directives(parser, [Directive(1, ("--nope",))])
    assert parser.error.__func__ is argparse.ArgumentParser.error


def test_command_line_wins_over_directives():
    directives = parse_directives(directive_parser(), read_directives(SCRIPT))
    command_line = directive_parser().parse_args(["--gpus", "1", "--env", "C=3"])
    merged = merge(command_line, directives)
    assert merged.gpus == 1
    assert merged.env == [("C", "3")]
    assert merged.project == "vision" and merged.name == "my run"


@given(st.text(alphabet=st.sampled_from("ab -=#\t\r\n\x0b\xa0é\"'\\"), max_size=16))
@example("a # c\nd")
@example("--env A=1 # note")
def test_words_split_as_shlex_splits_them(text):
    import shlex
    try:
        expected: object = shlex.split(text, comments=True)
    except ValueError as exc:
        expected = str(exc)
    try:
        found: object = split_words(text)
    except ValueError as exc:
        found = str(exc)
    assert found == expected
