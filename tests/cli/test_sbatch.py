"""#SBATCH lines: which options become gpud's, which are named and ignored, and what gpuctl submit sends."""

import json

import pytest
from hypothesis import example, given, strategies as st

from gpud.cli.gpuctl import main
from gpud.directives import Directive, DirectiveError, read_directives
from gpud.sbatch import slurm_pattern, split_memory, translate
from gpuctl_helpers import stand_in  # noqa: F401  (a fixture)

SLURM_SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=bert
#SBATCH -A vision
#SBATCH -p a100
#SBATCH --nodes=2 --ntasks-per-node=1
#SBATCH --gres=gpu:4
#SBATCH -c 8
#SBATCH --mem=64000
#SBATCH -t 1-12:00:00
#SBATCH -o logs/%x-%j.out
#SBATCH -e /dev/null
#SBATCH --dependency=afterok:12:13
#SBATCH --mail-user=me@example.org
#SBATCH --exclusive
srun python train.py
"""


def sbatch_lines(text: str) -> list[Directive]:
    return read_directives(text, prefix="#SBATCH")


def options(text: str) -> dict[str, tuple]:
    """gpud option -> its value(s), from the translated directives."""
    found = {}
    for directive in translate(sbatch_lines(text)).directives:
        args = list(directive.args)
        while args:
            option = args.pop(0)
            value = args.pop(0) if args and not args[0].startswith("--") else True
            found[option] = value
    return found


def test_a_slurm_script_translates_line_by_line():
    result = translate(sbatch_lines(SLURM_SCRIPT), user="ann")
    got = [(d.line, d.args) for d in result.directives]
    assert got == [(2, ("--name", "bert")), (3, ("--project", "vision")), (4, ("--partition", "a100")),
                   (5, ("--tasks", "2")), (6, ("--gpus", "4")), (7, ("--cpus", "8")), (8, ("--mem", "64000M")),
                   (9, ("--time", "1-12:00:00")), (10, ("--output", "logs/bert-%j.out")),
                   (11, ("--error", "/dev/null")), (12, ("--depends", "afterok:12:13"))]
    assert [(i.line, i.option, i.why) for i in result.ignored] == [
        (13, "--mail-user=me@example.org", "unsupported"), (14, "--exclusive", "exclusive")]


@pytest.mark.parametrize("lines, expected", [
    ("#SBATCH --gpus=8 -N 2", {"--tasks": "2", "--gpus": "4"}),           # --gpus is the job's total
    ("#SBATCH -G 2", {"--gpus": "2"}),
    ("#SBATCH --gpus-per-task=3 -n 4", {"--tasks": "4", "--gpus": "3"}),
    ("#SBATCH --gres=gpu", {"--gpus": "1"}),
    ("#SBATCH -N 2-4", {"--tasks": "4", "--min-tasks": "2"}),             # an elastic gang
    ("#SBATCH -N2\n#SBATCH -N3", {"--tasks": "3"}),                      # the later line wins
    ("#SBATCH --mem 16G", {"--mem": "16G"}),
    ("#SBATCH --mem=512", {"--mem": "512M"}),                              # Slurm's unit is MB
    ("#SBATCH --array=0-15:4%2", {"--array": "0-15:4%2"}),
    ("#SBATCH -J x -H --no-requeue -D /tmp/w", {"--name": "x", "--hold": True, "--no-requeue": True,
                                                "--workdir": "/tmp/w"}),
    ("#SBATCH --time=90", {"--time": "90"}),
    ("#SBATCH -o slurm-%A_%a.out", {"--output": "slurm-%j.out"}),
    ("#SBATCH -p gpu", {"--partition": "gpu"}),                         # the controller says which pool
    ("#SBATCH --qos=high", {"--qos": "high"}),                           # a priority class, if it is one
    ("#SBATCH --gres=gpu:a100:2", {"--constraint": "gpu_type=a100", "--gpus": "2"}),  # the type: a node label
    ("#SBATCH --gpus-per-node=h100:4", {"--constraint": "gpu_type=h100", "--gpus": "4"}),
    ("#SBATCH --requeue --open-mode=append", {}),                         # what gpud does anyway
    ("#SBATCH -N 2 --ntasks-per-node=1", {"--tasks": "2"}),
    # One gpud task per Slurm task: a node's GPUs and memory are shared among its tasks.
    ("#SBATCH -N 2 --ntasks-per-node=4 --gres=gpu:8 --mem=64G", {"--tasks": "8", "--gpus": "2", "--mem": "16G"}),
    ("#SBATCH -N 2 -n 16 --gpus-per-node=8", {"--tasks": "16", "--gpus": "1"}),
    ("#SBATCH --ntasks-per-node=2 --gres=gpu:1", {"--tasks": "2", "--gpus": "0.5"}),
    ("#SBATCH -N 1-2 --ntasks-per-node=4", {"--tasks": "8", "--min-tasks": "4"}),
    ("#SBATCH -N 2 --ntasks-per-node=2 --gpus-per-task=1", {"--tasks": "4", "--gpus": "1"}),
])
def test_each_option_maps_to_gpuds(lines, expected):
    assert options(lines + "\n") == expected


@pytest.mark.parametrize("line, why, detail", [
    ("#SBATCH --exclusive", "exclusive", ""),
    ("#SBATCH --open-mode=truncate", "open_mode", ""),
    ("#SBATCH --gres=gpu:1,nvme:1", "other_gres", "nvme:1"),
    ("#SBATCH -N 2 --gres=gpu:3 --ntasks-per-node=2", "ntasks_per_node", "3 GPUs"),
    ("#SBATCH -N 2 -n 3", "ntasks_per_node", "2"),
    ("#SBATCH -N 2 -n 4 --gres=gpu:3", "ntasks_per_node", "3 GPUs"),
    ("#SBATCH --mem=0", "mem_all", ""),
    ("#SBATCH -t UNLIMITED", "unlimited_time", ""),
    ("#SBATCH -p a,b", "partitions", "a"),
    ("#SBATCH -d singleton", "dependency_kind", "singleton"),
    ("#SBATCH -d afterok:1?afterany:2", "dependency_any", ""),
    ("#SBATCH -o out-%N.txt", "pattern", "%N"),
    ("#SBATCH -w node7", "unsupported", ""),
])
def test_what_gpud_does_not_act_on_is_named(line, why, detail):
    ignored = translate(sbatch_lines(line + "\n")).ignored
    assert [(i.line, i.why, i.detail) for i in ignored] == [(1, why, detail)]


@pytest.mark.parametrize("line, message", [
    ("#SBATCH --gpus=3 -N 2", "do not divide among 2 tasks"),
    ("#SBATCH --gres=gpu:many", "not a GPU count"),
    ("#SBATCH -N lots", "nodes must be a count"),
    ("#SBATCH --ntasks-per-node=x", "ntasks-per-node must be a count"),
    ("#SBATCH --mem=lots", "memory is a number"),
    ("#SBATCH train.py", "is not an option"),
    ("#SBATCH --time", "needs a value"),
])
def test_unreadable_values_are_refused_naming_the_line(line, message):
    with pytest.raises(DirectiveError, match=f"line 2: .*{message}"):
        translate(sbatch_lines("#!/bin/sh\n" + line + "\n"))


def test_output_patterns():
    assert slurm_pattern("%x_%u_%j.%t.log", "run", "ann") == ("run_ann_%j.%t.log", [])
    assert slurm_pattern("100%%-%a.out", None, None) == ("100%%-%%a.out", ["%a"])


@pytest.fixture
def api(stand_in, monkeypatch, tmp_path):
    monkeypatch.setenv("GPUD_URL", stand_in.url)
    monkeypatch.setenv("GPUD_TOKEN", "tok")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("GPUD_PROJECT", raising=False)
    monkeypatch.chdir(tmp_path)
    stand_in.routes["POST /api/v1/jobs"] = (200, {"ids": ["7"]}, {})
    return stand_in


def test_submit_sends_the_translated_job_and_warns_about_the_rest(api, tmp_path, capsys):
    script = tmp_path / "train.sh"
    script.write_text(SLURM_SCRIPT)
    assert main(["submit", str(script)]) == 0
    job = api.requests[-1]["body"]
    assert {k: job[k] for k in ("project", "name", "partition", "tasks", "gpus", "cpus", "memory_gib", "time_limit_s",
                                "output", "error", "depends")} == {
        "project": "vision", "name": "bert", "partition": "a100", "tasks": 2, "gpus": 4, "cpus": 8,
        "memory_gib": pytest.approx(64000 / 1024), "time_limit_s": 36 * 3600, "output": "logs/bert-%j.out",
        "error": "/dev/null", "depends": ["afterok:12", "afterok:13"]}
    err = capsys.readouterr().err
    assert f"{script}, line 13: #SBATCH --mail-user=me@example.org ignored: gpud has no such option" in err
    assert f"{script}, line 14: #SBATCH --exclusive ignored" in err


def test_gpud_lines_and_the_command_line_win_over_sbatch_lines(api, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH -A a --gres=gpu:2 -c 4 -J s\n#GPUD --gpus 1\necho hi\n")
    assert main(["submit", "-c", "2", str(script)]) == 0
    job = api.requests[-1]["body"]
    assert (job["project"], job["gpus"], job["cpus"], job["name"]) == ("a", 1, 2, "s")


def test_a_bad_sbatch_line_exits_2_naming_the_script_and_line(api, tmp_path, capsys):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH -A a\n#SBATCH -t forever\necho hi\n")
    assert main(["submit", str(script)]) == 2
    assert f"{script}, line 3:" in capsys.readouterr().err and not api.requests


def test_submit_help_says_sbatch_lines_are_read(capsys):
    with pytest.raises(SystemExit):
        main(["submit", "--help"])
    out = capsys.readouterr().out
    assert "#SBATCH lines are read too" in out and "--gres=gpu:N" in out


@given(st.text(alphabet=st.sampled_from("0123456789٣.kKmMgGtTbBiI x\n\u212a"), max_size=8))
@example("16G")
@example("1.5tb")
@example("4000")
@example(".5G")
@example("1.G")
def test_memory_is_read_as_the_old_pattern_read_it(value):
    # Read without re: the number and unit that (?i)^(\d+(?:\.\d+)?)([KMGT]?)B?$ found, but for a unit that is
    # a K only to re's case folding (the Kelvin sign), which the pattern let through to fail later.
    import re
    match = re.match(r"(?i)^(\d+(?:\.\d+)?)([KMGT]?)B?$", value.strip())
    expected = None if match is None or not match[2].upper().isascii() else (match[1], match[2].upper())
    assert split_memory(value) == expected
