"""gpuctl's command line: help for every verb, usage errors, exit codes, and what each verb sends and prints."""

import json
import os
import subprocess
import sys
import time

import pytest

from gpud.cli import gpuctl, queue_cmd, submit_cmd
from gpud.cli.gpuctl import VERBS, main
from gpuctl_helpers import closed_port, stand_in  # noqa: F401  (a fixture)

NESTED = {"policy": ["reload"], "token": ["create"]}
VERB_PATHS = [[verb] for verb in VERBS if verb not in NESTED] + [[v, s] for v, subs in NESTED.items() for s in subs]


@pytest.fixture
def api(stand_in, monkeypatch, tmp_path):
    """Point gpuctl at the stand-in server with a user token, and run in a scratch directory."""
    monkeypatch.setenv("GPUD_URL", stand_in.url)
    monkeypatch.setenv("GPUD_TOKEN", "tok")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("GPUD_PROJECT", raising=False)
    monkeypatch.chdir(tmp_path)
    return stand_in


@pytest.mark.parametrize("path", VERB_PATHS, ids=" ".join)
def test_every_verb_has_help_with_examples(path, capsys):
    with pytest.raises(SystemExit) as done:
        main([*path, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and f"gpuctl {' '.join(path)}" in out
    assert "exit status:" in out.lower()


def test_top_level_help_lists_every_verb(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(f"    {verb} " in out for verb in VERBS)


@pytest.mark.parametrize("argv", [[], ["policy"], ["token"]])
def test_no_verb_prints_help_and_exits_2(argv, capsys):
    assert main(argv) == 2
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["submit", "--time", "forever", "-p", "p", "--", "x"], "bad time"),
    (["submit", "--gpus", "1.5", "-p", "p", "--", "x"], "bad GPU count"),
    (["submit", "--array", "9-1", "-p", "p", "--", "x"], "runs backwards"),
    (["submit", "--depends", "after:1", "-p", "p", "--", "x"], "bad dependency"),
    (["submit", "--signal", "NOPE", "-p", "p", "--", "x"], "unknown signal"),
    (["submit", "--constraint", "gpu", "-p", "p", "--", "x"], "KEY=VALUE"),
    (["queue", "--state", "DONE"], "unknown state"),
    (["history", "--since", "yesterday"], "bad time"),
    (["queue", "--", "x"], "only `gpuctl submit` and `gpuctl run` take a command"),
    (["drain", "n1"], "--reason"),
    (["submit", "--time-limit", "1h", "-p", "p", "--", "x"],
     "gpuctl submit: error: unknown option --time-limit (did you mean -t/--time?)"),
    (["queue", "--mine"], "gpuctl queue: error: unknown option --mine (did you mean --me?)"),
    (["cancel", "1", "--frobnicate"], "gpuctl cancel: error: unknown option --frobnicate\n"
                                      "usage: gpuctl cancel JOB [JOB ...]; see `gpuctl cancel --help`"),
    (["show", "1", "2"], "gpuctl show: error: unexpected argument: 2"),
])
def test_argument_errors_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    # The error, then the usage in one line: never argparse's many-line usage first.
    first, second = err.splitlines()
    assert first.startswith("gpuctl") and ": error: " in first, err
    assert second.startswith("usage: gpuctl") and second.endswith("--help`"), err


def test_a_gpud_argument_error_is_two_short_lines_from_the_sub_command(capsys):
    from gpud.cli.gpud_main import main as gpud_main
    with pytest.raises(SystemExit) as done:
        gpud_main(["up", "--no-such-flag", "2"])
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "gpud up: error: unrecognized arguments: --no-such-flag 2", "usage: gpud up [options]; see `gpud up --help`"]


@pytest.mark.parametrize("argv, message", [
    (["submit", "-p", "p"], "nothing to run"),
    (["submit", "-p", "p", "--"], "nothing to run after --"),
    (["submit", "-p", "p", "job.sh", "--", "x"], "not both"),
    (["submit", "--", "x"], "which project?"),
    (["submit", "-p", "p", "missing.sh"], "missing.sh: cannot read the script"),
    (["submit", "-p", "p", "--env", "NOT_SET_ANYWHERE_1", "--", "x"], "is not set in this environment"),
    (["submit", "--from-file", "missing.json"], "missing.json: cannot read"),
    (["history", "--limit", "0"], "--limit must be at least 1"),
    (["queue", "--me", "--user", "bob"], "not both"),
])
def test_usage_errors_found_before_asking_exit_2(argv, message, api, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert api.requests == [] or argv[0] == "queue"


def test_a_bad_directive_names_the_line(api, tmp_path, capsys):
    (tmp_path / "job.sh").write_text("#!/bin/sh\n#GPUD --project p\n#GPUD --gpus many\necho\n")
    assert main(["submit", "job.sh"]) == 2
    assert "gpuctl submit: job.sh, line 3: argument --gpus: not a number: 'many'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["submit", "-p", "p", "--", "true"], ["queue"], ["show", "1"], ["why", "1"],
                                  ["cancel", "1", "2"], ["history"], ["nodes"], ["projects"], ["logs", "1"],
                                  ["drain", "n1", "--reason", "x"], ["resume", "n1"], ["policy", "reload"],
                                  ["token", "create", "--user", "a"], ["whoami"], ["simulate", "--from-controller"]])
def test_unreachable_controller_exits_3(argv, monkeypatch, tmp_path, capsys):
    url = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("GPUD_URL", url)
    monkeypatch.setenv("GPUD_RETRY", "0")   # at once (tests/test_gpuctl_retry.py waits for a controller)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"cannot reach the controller at {url} (connection refused); is it running? set GPUD_URL" in err


def test_unreachable_from_a_real_process(tmp_path):
    env = {**os.environ, "GPUD_URL": f"http://127.0.0.1:{closed_port()}", "XDG_CONFIG_HOME": str(tmp_path),
           "GPUD_RETRY": "0"}
    result = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "queue"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 3
    assert result.stdout == ""
    assert result.stderr.startswith("gpuctl queue: cannot reach the controller")


@pytest.mark.parametrize("argv", [["--version"], ["submit", "--help"], ["submit", "-p", "p", "--", "true"]])
def test_plain_calls_import_neither_aiohttp_nor_the_scheduler(argv, tmp_path):
    code = ("import sys\nfrom gpud.cli.gpuctl import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'asyncio', 'http', 'ssl') "
            "or m.startswith(('gpud.core', 'gpud.scenario', 'gpud.controller', 'gpud.policy')))\n"
            "print('heavy:', ','.join(heavy))\n")
    env = {**os.environ, "GPUD_URL": f"http://127.0.0.1:{closed_port()}", "XDG_CONFIG_HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.stdout.splitlines()[-1] == "heavy: ", result.stdout + result.stderr


def test_submit_a_command(api, tmp_path, capsys, monkeypatch):
    api.routes["POST /api/v1/jobs"] = (201, {"ids": ["42"]}, {})
    monkeypatch.setenv("HOME_LIKE", "/x")
    assert main(["submit", "-p", "vision", "-J", "run1", "--gpus", "0.5", "--mem", "16G", "--cpus", "4",
                 "--tasks", "2", "--min-tasks", "1", "--priority", "build", "--constraint", "gpu=h100",
                 "--constraint", "zone=a", "--pool", "h100", "--env", "A=1", "--env", "HOME_LIKE",
                 "--time", "1:30:00", "--depends", "afterok:1:2,afterany:3", "--hold", "--no-requeue",
                 "--signal", "SIGUSR1", "-o", "out-%j.txt", "-e", "err-%j.txt", "--gpu-memory", "20GiB",
                 "--", "python", "train.py", "--lr", "3"]) == 0
    assert capsys.readouterr().out == "submitted job 42\n"
    request = api.requests[0]
    assert (request["method"], request["path"]) == ("POST", "/api/v1/jobs")
    assert request["headers"]["Authorization"] == "Bearer tok"
    assert request["body"] == {
        "command": ["python", "train.py", "--lr", "3"], "project": "vision", "name": "run1",
        "workdir": str(tmp_path), "env": {"A": "1", "HOME_LIKE": "/x"}, "gpus": 0.5, "gpu_memory_gib": 20,
        "tasks": 2, "min_tasks": 1, "cpus": 4, "memory_gib": 16, "priority": "build",
        "constraint": {"gpu": "h100", "zone": "a"}, "pool": "h100", "time_limit_s": 5400,
        "depends": ["afterok:1", "afterok:2", "afterany:3"], "hold": True, "requeue": False,
        "stop_signal": "USR1", "output": "out-%j.txt", "error": "err-%j.txt"}


def test_submit_sends_only_what_was_given(api, tmp_path):
    api.routes["POST /api/v1/jobs"] = (201, {"ids": ["1"]}, {})
    assert main(["submit", "-p", "p", "--workdir", "sub", "--priority", "80", "--", "true"]) == 0
    assert api.requests[0]["body"] == {"command": ["true"], "project": "p", "workdir": str(tmp_path / "sub"),
                                       "priority": 80}


def test_submit_sends_a_compute_request_and_limit(api, tmp_path):
    api.routes["POST /api/v1/jobs"] = (201, {"ids": ["1"]}, {})
    assert main(["submit", "-p", "p", "--gpus", "0.25", "--gpu-compute-request", "0.2", "--gpu-compute-limit",
                 "0.5", "--", "true"]) == 0
    body = api.requests[0]["body"]
    assert (body["gpus"], body["gpu_compute_request"], body["gpu_compute_limit"]) == (0.25, 0.2, 0.5)
    with pytest.raises(SystemExit) as refused:
        main(["submit", "-p", "p", "--gpu-compute-limit", "1.5", "--", "true"])
    assert refused.value.code == 2


def test_export_env_never_copies_the_token(api, monkeypatch):
    api.routes["POST /api/v1/jobs"] = (201, {"ids": ["1"]}, {})
    monkeypatch.setenv("SOME_SETTING", "on")
    assert main(["submit", "-p", "p", "--export-env", "--env", "SOME_SETTING=off", "--", "true"]) == 0
    env = api.requests[0]["body"]["env"]
    assert env["SOME_SETTING"] == "off" and env["PATH"] == os.environ["PATH"]
    assert "GPUD_TOKEN" not in env


def test_submit_a_script_with_directives(api, tmp_path, capsys):
    api.routes["POST /api/v1/jobs"] = (201, {"ids": ["7_0", "7_1", "7_2", "7_3"], "array_id": "7"}, {})
    script = "#!/bin/bash\n#GPUD --project vision --gpus 2 --array 0-3%2\n#GPUD --time 90m\npython x.py\n"
    (tmp_path / "job.sh").write_text(script)
    assert main(["submit", "--gpus", "1", "job.sh"]) == 0
    assert capsys.readouterr().out == "submitted array job 7 (4 jobs: 7_0 ... 7_3)\n"
    assert api.requests[0]["body"] == {"script": script, "name": "job.sh", "project": "vision",
                                       "workdir": str(tmp_path), "gpus": 1, "time_limit_s": 5400,
                                       "array": "0-3%2"}
    assert main(["submit", "--parsable", "job.sh"]) == 0
    assert capsys.readouterr().out == "7\n"


def test_submit_reads_the_project_from_the_environment(api, monkeypatch, capsys):
    api.routes["POST /api/v1/jobs"] = (201, {"ids": ["5"]}, {})
    monkeypatch.setenv("GPUD_PROJECT", "envproj")
    assert main(["submit", "--parsable", "--", "true"]) == 0
    assert capsys.readouterr().out == "5\n"
    assert api.requests[0]["body"]["project"] == "envproj"


def test_a_refused_submit_exits_1_with_the_message(api, capsys):
    api.routes["POST /api/v1/jobs"] = (422, {"error": "unknown project 'nope'", "field": "project"}, {})
    assert main(["submit", "-p", "nope", "--", "true"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "gpuctl submit: unknown project 'nope' (HTTP 422, field 'project')\n"


def test_batch_submit_from_json_lines_in_chunks(api, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(submit_cmd, "MAX_BATCH", 2)
    api.routes["POST /api/v1/jobs/batch"] = (201, {"ids": ["1", "2"]}, {})
    lines = [json.dumps({"command": ["echo", str(i)], "gpus": 0}) for i in range(3)]
    (tmp_path / "jobs.jsonl").write_text("\n".join(lines) + "\n\n")
    assert main(["submit", "-p", "sweep", "--gpus", "1", "--from-file", "jobs.jsonl", "--parsable"]) == 0
    assert capsys.readouterr().out == "1\n2\n1\n2\n"
    bodies = [r["body"]["jobs"] for r in api.requests]
    assert [len(b) for b in bodies] == [2, 1]
    assert bodies[0][0] == {"command": ["echo", "0"], "gpus": 0, "project": "sweep", "workdir": str(tmp_path)}


def test_batch_submit_from_a_json_list(api, tmp_path, capsys):
    api.routes["POST /api/v1/jobs/batch"] = (201, {"ids": [str(i) for i in range(1, 13)]}, {})
    jobs = [{"command": ["true"], "project": "p", "workdir": "/w"}] * 12
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": jobs}))
    assert main(["submit", "--from-file", "jobs.json"]) == 0
    assert capsys.readouterr().out == "submitted 12 jobs: 1 ... 12\n"
    assert api.requests[0]["body"] == {"jobs": jobs}


def test_batch_refusal_names_the_entry(api, tmp_path, capsys):
    api.routes["POST /api/v1/jobs/batch"] = (422, {"error": "gpus must be at most 1 when a fraction", "field": "gpus",
                                                    "index": 1}, {})
    (tmp_path / "jobs.json").write_text(json.dumps([{"command": ["a"]}, {"command": ["b"], "gpus": 1.5}]))
    assert main(["submit", "-p", "p", "--from-file", "jobs.json"]) == 1
    assert capsys.readouterr().err == ("gpuctl submit: jobs.json, entry 2: gpus must be at most 1 when a fraction "
                                       "(HTTP 422, field 'gpus')\n")
    (tmp_path / "jobs.jsonl").write_text('{"command": ["a"]}\n\n{"command": ["b"], "gpus": 1.5}\n')
    assert main(["submit", "-p", "p", "--from-file", "jobs.jsonl"]) == 1
    assert "jobs.jsonl, line 3: gpus must be" in capsys.readouterr().err


def test_entries_are_counted_from_1_in_every_message(api, tmp_path, capsys):
    (tmp_path / "jobs.json").write_text('[{"command": ["a"]}, 2]')
    assert main(["submit", "-p", "p", "--from-file", "jobs.json"]) == 2
    assert "jobs.json, entry 2: a job must be a JSON object" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [("[1]", "entry 1: a job must be a JSON object"),
                                           ('{"a": 1}\n[2]\n', "line 2: a job must be a JSON object"),
                                           ('{"a": 1}\n{oops\n', "line 2: not JSON"), ("[]", "no jobs"),
                                           ("7", "expected a list")])
def test_bad_job_files(api, tmp_path, capsys, text, message):
    (tmp_path / "jobs.json").write_text(text)
    assert main(["submit", "-p", "p", "--from-file", "jobs.json"]) == 2
    assert message in capsys.readouterr().err


def test_queue_filters_and_me(api, capsys):
    api.routes["GET /api/v1/whoami"] = (200, {"user": "alice", "admin": False}, {})
    api.routes["GET /api/v1/jobs"] = (200, {"jobs": []}, {})
    assert main(["queue", "--me", "--project", "vision", "--state", "pd,R"]) == 0
    assert capsys.readouterr().out.split() == ["ID", "NAME", "USER", "PROJECT", "STATE", "TIME", "GPUS", "NODES",
                                               "REASON"]
    fields = "%2C".join(queue_cmd.QUEUE_FIELDS)  # only what the table shows
    assert api.requests[1]["query"] == f"state=PENDING%2CRUNNING&user=alice&project=vision&fields={fields}&limit=5000"
    assert main(["queue", "--all", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"jobs": []}
    assert api.requests[2]["query"] == "all=1&limit=5000"  # --json: the whole job objects


def test_queue_follows_next_cursor_to_the_last_page(api, capsys):
    pages = iter([{"jobs": [{"id": "1"}], "arrays": {}, "next_cursor": "c1"},
                  {"jobs": [{"id": "2"}], "arrays": {"3": {"elements": 1}}, "next_cursor": "c2"},
                  {"jobs": [{"id": "3_0", "array_id": "3"}], "arrays": {}, "next_cursor": None}])

    class Paged(dict):
        def get(self, key, default=None):
            return (200, next(pages), {}) if key == "GET /api/v1/jobs" else super().get(key, default)

    api.routes = Paged(api.routes)
    assert main(["queue", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert [job["id"] for job in answer["jobs"]] == ["1", "2", "3_0"]
    assert answer["arrays"] == {"3": {"elements": 1}} and answer["next_cursor"] is None
    assert [r["query"] for r in api.requests] == ["limit=5000", "limit=5000&cursor=c1", "limit=5000&cursor=c2"]


def test_squeue_and_sacct_list_every_page(api, capsys):
    from gpud.cli.slurm.jobs import sacct, squeue

    def pages():
        yield {"jobs": [{"id": "1", "user": "ann", "state": "RUNNING"}], "arrays": {}, "next_cursor": "c1"}
        yield {"jobs": [{"id": "2", "user": "ann", "state": "PENDING"}], "arrays": {}, "next_cursor": None}
    listing = pages()

    class Paged(dict):
        def get(self, key, default=None):
            return (200, next(listing), {}) if key == "GET /api/v1/jobs" else super().get(key, default)

    api.routes["GET /api/v1/whoami"] = (200, {"user": "ann"}, {})
    api.routes = Paged(api.routes)
    assert squeue(["-h", "-o", "%i %T"]) == 0
    assert capsys.readouterr().out.split() == ["1", "RUNNING", "2", "PENDING"]
    listing = pages()
    assert sacct(["-n", "-X", "-P", "-o", "JobID,State"]) == 0
    assert capsys.readouterr().out.split() == ["1|RUNNING", "2|PENDING"]


def test_cancel_goes_on_past_a_refusal(api, capsys):
    api.routes["POST /api/v1/jobs/1/cancel"] = (200, {"ids": ["1"]}, {})
    api.routes["POST /api/v1/jobs/3/cancel"] = (200, {"ids": ["3_0", "3_1"]}, {})
    assert main(["cancel", "1", "2", "3"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "cancelled 1\ncancelled 3_0 3_1\n"
    assert captured.err == "gpuctl cancel: job 2: no route /api/v1/jobs/2/cancel (HTTP 404)\n"


def test_history_sends_since_as_unix_time(api, capsys):
    api.routes["GET /api/v1/history"] = (200, {"jobs": []}, {})
    assert main(["history", "--since", "2024-05-01", "--limit", "5", "--project", "p"]) == 0
    import time
    expected = time.mktime((2024, 5, 1, 0, 0, 0, 0, 0, -1))
    query = dict(pair.split("=") for pair in api.requests[0]["query"].split("&"))
    assert float(query["since"]) == expected and query["limit"] == "5" and query["project"] == "p"


def test_logs_pass_the_stream_task_and_follow(api, capsys):
    api.routes["GET /api/v1/jobs/9/logs"] = (200, b"hello\n", {"Content-Type": "text/plain"})
    assert main(["logs", "9", "--err", "--task", "2", "-f"]) == 0
    assert capsys.readouterr().out == "hello\n"
    assert api.requests[0]["query"] == "stream=err&offset=0&follow=1&task=2"


def test_admin_verbs_send_what_the_api_wants(api, capsys):
    api.routes["POST /api/v1/nodes/n1/drain"] = (200, {}, {})
    api.routes["POST /api/v1/nodes/n1/resume"] = (200, {}, {})
    api.routes["POST /api/v1/policy/reload"] = (200, {"ok": True}, {})
    api.routes["POST /api/v1/tokens"] = (201, {"user": "bob", "admin": True, "token": "T0K"}, {})
    api.routes["GET /api/v1/whoami"] = (200, {"user": "root", "admin": True}, {})
    assert main(["drain", "n1", "--reason", "ECC errors"]) == 0
    assert main(["resume", "n1"]) == 0
    assert main(["policy", "reload"]) == 0
    assert main(["token", "create", "--user", "bob", "--admin"]) == 0
    assert main(["whoami"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "draining n1: running jobs finish, no new work starts there", "resumed n1", "policy reloaded", "T0K",
        "root (admin)"]
    assert api.requests[0]["body"] == {"reason": "ECC errors"}
    assert api.requests[3]["body"] == {"user": "bob", "admin": True}


def test_a_refused_policy_reload_exits_1(api, capsys):
    api.routes["POST /api/v1/policy/reload"] = (422, {"error": "policy refused, the old one stays: x.toml: bad"}, {})
    assert main(["policy", "reload"]) == 1
    assert "policy refused, the old one stays" in capsys.readouterr().err


def test_simulate_from_the_controller_adds_the_files_jobs(api, tmp_path, capsys):
    state = {"policy": {"projects": [{"name": "p1", "gpu_quota": 2}, {"name": "p2", "gpu_quota": 2}]},
             "nodes": [{"name": "n1", "gpus": 4}],
             "jobs": [{"name": "live", "project": "p1", "gpus": 4, "running_on": ["n1"], "submitted": 0}]}
    api.routes["GET /api/v1/state"] = (200, state, {})
    (tmp_path / "extra.toml").write_text(
        '[[jobs]]\nname = "new"\nproject = "p2"\ngpus = 2\nsubmitted = 10\n\n'
        '[expect]\nrunning = ["new"]\npreempted = ["live"]\n')
    assert main(["simulate", "--from-controller", "extra.toml"]) == 0, capsys.readouterr()
    assert "Expectations hold." in capsys.readouterr().out
    assert main(["simulate", "--from-controller", "--json"]) == 0
    assert [j["job"] for j in json.loads(capsys.readouterr().out)["jobs"]] == ["live"]


def test_simulate_from_the_controller_queues_the_files_jobs_behind_the_live_ones(api, tmp_path, capsys):
    state = {"now": 1000.0, "policy": {"projects": [{"name": "p1", "gpu_quota": 4}]},
             "nodes": [{"name": "n1", "gpus": 2}],
             "jobs": [{"name": "waiting", "project": "p1", "gpus": 2, "submitted": 500}]}
    api.routes["GET /api/v1/state"] = (200, state, {})
    (tmp_path / "extra.toml").write_text('[[jobs]]\nname = "new"\nproject = "p1"\ngpus = 2\n\n'
                                         '[expect]\nrunning = ["waiting"]\npending = ["new"]\n')
    assert main(["simulate", "--from-controller", "extra.toml"]) == 0, capsys.readouterr()


def test_simulate_from_the_controller_names_a_clash(api, tmp_path, capsys):
    api.routes["GET /api/v1/state"] = (200, {"nodes": [{"name": "n1", "gpus": 2}], "jobs": []}, {})
    (tmp_path / "extra.toml").write_text('[[nodes]]\nname = "n1"\ngpus = 1\n')
    assert main(["simulate", "--from-controller", "extra.toml"]) == 2
    err = capsys.readouterr().err
    assert "controller state + extra.toml" in err and "n1" in err


def test_simulate_needs_a_file_or_the_controller(capsys):
    assert main(["simulate"]) == 2
    assert "give a scenario file, or --from-controller" in capsys.readouterr().err


def test_gpuctl_module_builds_only_the_verb_it_runs():
    parser = gpuctl.build_parser("queue")
    assert parser.parse_args(["queue", "--me"]).me is True


def test_a_refusal_after_accepted_batches_names_the_first_entry_not_submitted(api, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(submit_cmd, "MAX_BATCH", 2)
    answers = iter([(201, {"ids": ["1", "2"]}), (422, {"error": "bad gpus", "field": "gpus", "index": 1})])

    def answer(handler):
        status, body = next(answers)
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
    api.routes["POST /api/v1/jobs/batch"] = (201, answer, {})
    (tmp_path / "jobs.json").write_text(json.dumps([{"command": ["x"]}] * 4))
    assert main(["submit", "-p", "p", "--from-file", "jobs.json"]) == 1
    out, err = capsys.readouterr()
    assert out == "submitted 2 jobs: 1 2\n"
    assert "the 2 jobs before jobs.json, entry 3 were submitted" in err
    assert "jobs.json, entry 4: bad gpus (HTTP 422, field 'gpus')" in err


@pytest.mark.parametrize("argv, route, prefix", [
    (["policy", "reload"], "POST /api/v1/policy/reload", "gpuctl policy reload: "),
    (["token", "create", "--user", "bob"], "POST /api/v1/tokens", "gpuctl token create: "),
])
def test_errors_name_the_verb_as_typed(api, capsys, argv, route, prefix):
    api.routes[route] = (403, {"error": "this needs an admin token"}, {})
    assert main(argv) == 1
    assert capsys.readouterr().err.startswith(prefix + "this needs an admin token")


def test_reload_warns_about_removed_projects_that_still_have_jobs(api, capsys):
    api.routes["POST /api/v1/policy/reload"] = (200, {"ok": True, "removed_projects": [
        {"project": "delta", "running": 1, "pending": 3}, {"project": "empty", "running": 0, "pending": 0},
        {"project": "idle", "running": 0, "pending": 2}]}, {})
    assert main(["policy", "reload"]) == 0
    out, err = capsys.readouterr()
    assert out == "policy reloaded\n"
    assert err == ("gpuctl policy reload: warning: project delta is no longer in the policy: its running jobs (1) run "
                   "on until they end; its pending jobs (3) wait (reason: project delta is not in the policy) until "
                   "it is back or they are cancelled\n"
                   "gpuctl policy reload: warning: project idle is no longer in the policy: its pending jobs (2) wait "
                   "(reason: project idle is not in the policy) until it is back or they are cancelled\n")


def test_no_cpu_and_dev_null_pass_the_command_line(api):
    api.routes["POST /api/v1/jobs"] = (201, {"ids": ["5"]}, {})
    assert main(["submit", "-p", "p", "-c", "0", "-o", "/dev/null", "--", "true"]) == 0
    assert (api.requests[-1]["body"]["cpus"], api.requests[-1]["body"]["output"]) == (0, "/dev/null")


def test_squeue_start_lists_waiting_jobs_by_their_expected_start(api, capsys, monkeypatch):
    from gpud.cli.slurm.jobs import squeue
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    base = {"user": "ann", "name": "train", "pool": None, "tasks": 1, "nodes": [], "reason_short": "no idle GPUs"}
    api.routes["GET /api/v1/jobs"] = (200, {"jobs": [
        {**base, "id": "1", "state": "RUNNING", "started": 1795000000.0, "nodes": ["n1"]},
        {**base, "id": "2", "state": "PENDING", "estimated_start": None},
        {**base, "id": "3", "state": "PENDING", "estimated_start": 1795007200.0, "start_nodes": ["n2", "n3"]},
        {**base, "id": "4", "state": "PENDING", "estimated_start": 1795003600.0, "start_nodes": ["n1"]},
    ], "arrays": {}, "next_cursor": None}, {})
    try:
        assert squeue(["--start"]) == 0
    finally:
        monkeypatch.undo()
        time.tzset()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["JOBID", "PARTITION", "NAME", "USER", "ST", "START_TIME", "NODES", "SCHEDNODES",
                                "NODELIST(REASON)"]
    rows = [line.split() for line in lines[1:]]
    assert [row[0] for row in rows] == ["4", "3", "2"], "the soonest first, no estimate last, no running job"
    assert rows[0][5:8] == ["2026-11-18T12:06:40", "1", "n1"]
    assert rows[1][7] == "n[2-3]" and rows[2][5] == "N/A" and rows[2][7] == "(null)"
    assert "estimated_start" in api.requests[-1]["query"]
