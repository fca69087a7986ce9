"""A plain `gpuctl submit` or `gpuctl queue` imports only what it needs (figures: bench/cli_startup.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import gpud
from gpuctl_helpers import stand_in  # noqa: F401  (a fixture)

ROOT = str(Path(gpud.__file__).parent.parent)

# Each costs every call milliseconds and a plain submit or queue needs none of them: the client takes a
# plain URL apart without urllib.parse (and ipaddress), the directives are named tuples, not dataclasses,
# and typing (a third of Python's own start-up) is imported only by the type checker.
NOT_NEEDED = ("pluggy", "tomllib", "socket", "shutil", "difflib", "http.client", "urllib.request", "email",
              "encodings.idna", "aiohttp", "asyncio", "gpud.core", "gpud.model", "dataclasses", "inspect",
              "urllib.parse", "ipaddress", "typing")
# A plain submit or queue is read without argparse (gpud.cli.options) and speaks JSON without the json module
# (gpud.plainjson): with them go re, enum, gettext and locale, each call's largest cost after Python's own start.
QUICK_NOT_NEEDED = NOT_NEEDED + ("argparse", "re", "json", "enum", "gettext", "locale", "functools", "collections")

# The modules gpuctl imported: against those there at start (an editable install's finder imports re, say).
RUN = """\
import sys
before = set(sys.modules)
from gpud.cli.gpuctl import main
status = main(sys.argv[1:])
modules = sorted(set(sys.modules) - before)
import json
print(json.dumps({"status": status, "modules": modules}), file=sys.stderr)
"""


@pytest.mark.parametrize("argv", [["submit", "-p", "vision", "--gpus", "1", "--", "python", "train.py"],
                                  ["queue"], ["submit", "-p", "hpo", "--array", "0-999", "--", "true"]],
                         ids=["submit", "queue", "array"])
def test_a_plain_call_imports_nothing_heavy(argv, stand_in, tmp_path):  # noqa: F811
    stand_in.routes["POST /api/v1/jobs"] = (201, {"ids": ["1"]}, {})
    stand_in.routes["GET /api/v1/jobs"] = (200, {"jobs": [{"id": "1", "name": "x", "user": "ann", "project": "p",
                                                           "state": "PENDING", "gpus": 1, "tasks": 1}]}, {})
    config = tmp_path / "gpud" / "client.toml"
    config.parent.mkdir()
    config.write_text(f'# written by gpud up\nurl = "{stand_in.url}"\ntoken = "tok"\n')
    # -S: without site, whose editable-install finder imports re before gpuctl starts; gpud from its checkout.
    done = subprocess.run([sys.executable, "-S", "-c", RUN, *argv], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(tmp_path), "HOME": str(tmp_path),
                               "PYTHONPATH": ROOT})
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["status"] == 0, done.stderr
    assert stand_in.requests[-1]["headers"]["Authorization"] == "Bearer tok"  # the config file was read
    imported = set(report["modules"])
    assert [m for m in QUICK_NOT_NEEDED if m in imported] == []


def test_the_installed_gpuctl_imports_nothing_heavy_either(stand_in, tmp_path):  # noqa: F811
    # The gpuctl command pip installs, as a user runs it, not only gpuctl's main.
    script = Path(sys.executable).parent / "gpuctl"
    stand_in.routes["POST /api/v1/jobs"] = (201, {"ids": ["1"]}, {})
    config = tmp_path / "gpud" / "client.toml"
    config.parent.mkdir()
    config.write_text(f'url = "{stand_in.url}"\ntoken = "tok"\n')
    env = {"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(tmp_path), "HOME": str(tmp_path)}

    def imports(*argv: str) -> tuple[set[str], str]:
        done = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True, text=True,
                              timeout=60, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        return {line.split("|")[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}, done.stdout

    imported, out = imports(str(script), "submit", "-p", "v", "--", "true")
    assert out == "submitted job 1\n"
    # What Python's start-up imports (an editable install's finder imports some of them), and pip's own script:
    # the pip bundled with Python 3.11's venv writes one that imports re, a current pip one that imports nothing.
    wrapper = [line for line in script.read_text().splitlines() if line.startswith("import ")]
    at_start, _ = imports("-c", "; ".join(["pass", *wrapper]))
    assert "gpud.client" in imported
    assert [m for m in QUICK_NOT_NEEDED if m in imported - at_start] == []


def test_hookimpl_is_still_there_for_plugins():
    done = subprocess.run([sys.executable, "-c", "import sys, gpud; assert 'pluggy' not in sys.modules; "
                           "from gpud import hookimpl; print(type(hookimpl).__name__)"],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "HookimplMarker", done.stderr


def test_submit_help_points_to_one_call_for_many_jobs(capsys):
    from gpud.cli.gpuctl import main
    with pytest.raises(SystemExit):
        main(["submit", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "thousands of jobs, submit them in one call" in out
    assert "--array 0-9999" in out and "--from-file jobs.jsonl" in out


# Counts the annotation texts typing compiles (a process's first compile() builds every type of the ast module,
# over 10 M instructions); a typing.NamedTuple in a module with `from __future__ import annotations` does it.
COMPILED = """\
import sys, typing
compiled = []
made = typing.ForwardRef.__init__
def counting(self, arg, *args, **kwargs):
    compiled.append(arg)
    made(self, arg, *args, **kwargs)
typing.ForwardRef.__init__ = counting
if sys.argv[1] == "sbatch":
    from gpud.cli.slurm import run
    status = run("sbatch", sys.argv[2:])
else:
    from gpud.cli.gpuctl import main
    status = main(sys.argv[1:])
import json
print(json.dumps({"status": status, "compiled": compiled}), file=sys.stderr)
"""


@pytest.mark.parametrize("argv", [["sbatch", "--parsable", "-A", "vision", "train.sh"], ["submit", "train.sh"]],
                         ids=["sbatch", "gpuctl submit SCRIPT"])
def test_a_batch_script_is_read_without_compiling_annotations(argv, stand_in, tmp_path):  # noqa: F811
    stand_in.routes["POST /api/v1/jobs"] = (201, {"ids": ["1"]}, {})
    (tmp_path / "train.sh").write_text("#!/bin/sh\n#SBATCH -N 2 --gres=gpu:2 -t 1:00:00\n#GPUD --project vision\n"
                                       "#SBATCH --exclusive\nsrun python train.py\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path), "GPUD_URL": stand_in.url}
    done = subprocess.run([sys.executable, "-c", COMPILED, *argv], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env=env)
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["status"] == 0, done.stderr
    assert stand_in.requests[-1]["body"]["tasks"] == 2  # the #SBATCH lines were read
    assert report["compiled"] == []


def test_squeue_imports_nothing_heavy(stand_in, tmp_path):  # noqa: F811
    # It prints node lists with gpud.hostlist alone: gpud.slurm_env's dataclasses cost more than Python's start-up;
    # and it reads a plain command line and its -o format without argparse or re, as gpuctl queue does.
    stand_in.routes["GET /api/v1/jobs"] = (200, {"jobs": [
        {"id": "1", "name": "x", "user": "ann", "state": "RUNNING", "nodes": ["n01", "n02"], "tasks": 2}]}, {})
    run = "import sys\nbefore = set(sys.modules)\nfrom gpud.cli.slurm import run\nstatus = run('squeue', [])\n" \
          "modules = sorted(set(sys.modules) - before)\nimport json\n" \
          "print(json.dumps({'status': status, 'modules': modules}), file=sys.stderr)"
    done = subprocess.run([sys.executable, "-S", "-c", run], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GPUD_URL": stand_in.url,
                               "PYTHONPATH": ROOT})
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["status"] == 0 and "n[01-02]" in done.stdout, done.stderr
    assert [m for m in (*QUICK_NOT_NEEDED, "gpud.slurm_env") if m in report["modules"]] == []


@pytest.mark.parametrize("argv", [["--parsable", "-A", "vision", "--wrap", "true"], ["--parsable", "train.sh"]],
                         ids=["wrap", "script"])
def test_sbatch_imports_nothing_heavy(argv, stand_in, tmp_path):  # noqa: F811
    # sbatch shares gpuctl submit's path: its options and the script's #SBATCH lines are read without argparse,
    # re (shlex) or typing (named tuples) when they are plain.
    stand_in.routes["POST /api/v1/jobs"] = (201, {"ids": ["7"]}, {})
    (tmp_path / "train.sh").write_text("#!/bin/sh\n#SBATCH -N 2 --gres=gpu:2 -t 1:00:00\n#SBATCH -A vision --mem=16G\n"
                                       "#GPUD --env A=1\nsrun python train.py\n")
    run = "import sys\nbefore = set(sys.modules)\nfrom gpud.cli.slurm import run\nstatus = run('sbatch', sys.argv[1:])\n" \
          "modules = sorted(set(sys.modules) - before)\nimport json\n" \
          "print(json.dumps({'status': status, 'modules': modules}), file=sys.stderr)"
    done = subprocess.run([sys.executable, "-S", "-c", run, *argv], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GPUD_URL": stand_in.url,
                                             "PYTHONPATH": ROOT})
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["status"] == 0 and done.stdout == "7\n", done.stderr
    if argv[-1] == "train.sh":
        sent = stand_in.requests[-1]["body"]
        assert (sent["tasks"], sent["gpus"], sent["project"], sent["env"]["A"]) == (2, 2, "vision", "1")
    assert [m for m in (*QUICK_NOT_NEEDED, "shlex") if m in report["modules"]] == []
