"""``--signal [B:]SIG@LEAD``: parsed as Slurm writes it, on the command line, in #SBATCH and #GPUD lines, and
checked by the controller."""

from __future__ import annotations

import argparse

import pytest

from gpud.cli.submit_cmd import add_options, build_job
from gpud.directives import read_directives
from gpud.policy import Department, Policy, Project
from gpud.sbatch import translate
from gpud.submission import Capacity, SubmitError, admit, read_job

POLICY = Policy(departments={"default": Department("default", implicit=True)}, projects={"p": Project("p")})


def job_of(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    add_options(parser)
    return build_job(parser.parse_args(["-p", "p", *argv]), command=["true"], cwd="/tmp", environ={})


def checked(**fields):
    payload = {"project": "p", "command": ["true"], "workdir": "/tmp", **fields}
    return admit(read_job(payload), user="ann", admin=False, policy=POLICY, capacity=Capacity()).job


def test_sig_at_lead_asks_for_an_early_signal():
    job = job_of("--signal", "USR1@90")
    assert (job["warn_signal"], job["warn_lead_s"]) == ("USR1", 90.0)
    assert "stop_signal" not in job and "warn_batch_only" not in job
    job = job_of("--signal", "B:SIGUSR2@5")
    assert (job["warn_signal"], job["warn_lead_s"], job["warn_batch_only"]) == ("USR2", 5.0, True)


def test_a_bare_signal_is_still_the_stop_signal():
    job = job_of("--signal", "INT")
    assert job["stop_signal"] == "INT" and "warn_signal" not in job


@pytest.mark.parametrize("bad", ["USR1@soon", "USR1@-3", "B:USR1", "NOPE@10"])
def test_a_bad_signal_option_is_refused_naming_it(bad, capsys):
    with pytest.raises(SystemExit):
        job_of("--signal", bad)
    assert "--signal" in capsys.readouterr().err


def test_sbatch_signal_becomes_gpud_signal():
    text = "#!/bin/bash\n#SBATCH --signal=B:USR1@120\n#SBATCH -t 10\n"
    directives = translate(read_directives(text, prefix="#SBATCH")).directives
    assert ("--signal", "B:USR1@120") in [tuple(d.args) for d in directives]


def test_the_controller_checks_the_early_signal():
    job = checked(warn_signal="SIGUSR1", warn_lead_s=30, warn_batch_only=True)
    assert (job.warn_signal, job.warn_lead_s, job.warn_batch_only) == ("USR1", 30.0, True)
    with pytest.raises(SubmitError, match="warn_signal must be one of"):
        checked(warn_signal="SEGV", warn_lead_s=30)
    with pytest.raises(SubmitError, match="warn_lead_s must be"):
        checked(warn_signal="USR1")
    with pytest.raises(SubmitError, match="go with warn_signal"):
        checked(warn_lead_s=30)
