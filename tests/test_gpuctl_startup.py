"""A plain `gpuctl submit` or `gpuctl queue` imports only what it needs (figures: bench/cli_startup.py)."""

import json
import subprocess
import sys

import pytest

from gpuctl_helpers import stand_in  # noqa: F401  (a fixture)

# Each costs every call milliseconds and a plain submit or queue needs none of them.
NOT_NEEDED = ("pluggy", "tomllib", "socket", "typing", "shutil", "difflib", "http.client", "urllib.request",
              "email", "encodings.idna", "aiohttp", "asyncio", "gpud.core", "gpud.model", "dataclasses", "inspect")

RUN = """\
import json, sys
from gpud.cli.gpuctl import main
status = main(sys.argv[1:])
print(json.dumps({"status": status, "modules": sorted(sys.modules)}), file=sys.stderr)
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
    done = subprocess.run([sys.executable, "-c", RUN, *argv], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(tmp_path), "HOME": str(tmp_path)})
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["status"] == 0, done.stderr
    assert stand_in.requests[-1]["headers"]["Authorization"] == "Bearer tok"  # the config file was read
    imported = set(report["modules"])
    assert [m for m in NOT_NEEDED if m in imported] == []


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
