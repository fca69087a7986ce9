"""Slurm's commands (gpuctl slurm-shims) on a live cluster: user-guide scripts and submitit run unchanged."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from daemons import POLICY, running_cluster, wait_for
from waiting import poll

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# What a submitit job needs to unpickle this module's functions: this folder, and tests/ for its imports (daemons).
JOB_PATH = os.pathsep.join((str(HERE), str(HERE.parent)))
EXAMPLES = ROOT / "examples" / "slurm"
PARTITIONS = '\n[partitions]\nbatch = "default"\n'


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A controller and two node daemons (1 fake GPU each), with the shims written into a bin directory."""
    root = tmp_path_factory.mktemp("slurm")
    with running_cluster(root, POLICY + PARTITIONS, nodes={"n01": 1, "n02": 1}) as live:
        bin_dir = root / "bin"
        done = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "slurm-shims", "--dir", str(bin_dir)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        # sbatch copies this environment into the jobs. With PYTHONUNBUFFERED (set in many CI and container
        # shells), Python writes a print word by word, and the ranks of a gang writing one shared file at the
        # same moment mix their words mid-line; a user's shell without it writes each line at once.
        shell = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        env = {**shell, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "GPUD_URL": live.url,
               "GPUD_TOKEN": live.admin_token, "GPUD_PROJECT": "alpha", "GPUD_TIMEOUT": "10",
               "XDG_CONFIG_HOME": str(root / "no-config")}
        yield {"live": live, "bin": bin_dir, "env": env, "work": live.workdir}


def slurm(cluster, *argv: str, cwd: Path | None = None, stdin: str | None = None,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a Slurm command as a user's shell would find it: the shims first on PATH (``env``: more variables)."""
    command = shutil.which(argv[0], path=cluster["env"]["PATH"])
    assert command == str(cluster["bin"] / argv[0]), command
    return subprocess.run([command, *argv[1:]], env={**cluster["env"], **(env or {})}, capture_output=True,
                          text=True, timeout=60, cwd=cwd or cluster["work"], input=stdin)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result.stdout


def sacct(cluster, job_id: str) -> dict[str, tuple[str, str]]:
    """Each job id sacct lists for ``job_id``, with its State and ExitCode."""
    out = ok(slurm(cluster, "sacct", "--parsable2", "-j", job_id, "-o", "JobID,State,ExitCode"))
    lines = out.splitlines()
    assert lines[0] == "JobID|State|ExitCode"
    return {row.split("|")[0]: (row.split("|")[1], row.split("|")[2]) for row in lines[1:]}


def wait_ended(cluster, job_id: str, count: int = 1, timeout: float = 90.0) -> dict[str, tuple[str, str]]:
    def ended():
        rows = sacct(cluster, job_id)
        return rows if len(rows) == count and all(s not in ("PENDING", "RUNNING") for s, _ in rows.values()) \
            else None
    return wait_for(ended, f"job {job_id} to end", timeout, interval=0.5)


def test_shims_are_written_only_where_asked(tmp_path):
    target = tmp_path / "bin"
    (target).mkdir()
    (target / "squeue").write_text("#!/bin/sh\necho real slurm\n")
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    refused = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "slurm-shims", "--dir", str(target)],
                             capture_output=True, text=True, env=env, timeout=60)
    assert refused.returncode == 2 and "were not written by gpuctl" in refused.stderr
    assert (target / "squeue").read_text() == "#!/bin/sh\necho real slurm\n"
    assert not (target / "sbatch").exists()
    default = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "slurm-shims"], capture_output=True,
                             text=True, env=env, timeout=60)
    assert default.returncode == 0, default.stderr
    written = sorted(p.name for p in (tmp_path / "home" / ".local" / "bin").iterdir())
    assert written == sorted(["sbatch", "squeue", "scancel", "sacct", "sinfo", "srun", "salloc", "scontrol"])


def test_array_script_from_a_user_guide_sees_each_index(cluster):
    result = slurm(cluster, "sbatch", str(EXAMPLES / "array.sh"))
    out = ok(result)
    assert out.startswith("Submitted batch job ")
    array_id = out.split()[-1]
    # -p gpu names no pool and no [partitions] entry: the job is not refused, and the warning names the pool.
    assert "'gpu'" in result.stderr and "default pool 'default'" in result.stderr
    rows = wait_ended(cluster, array_id, count=10)
    assert rows == {f"{array_id}_{i}": ("COMPLETED", "0:0") for i in range(10)}
    seen = []
    for index in range(10):
        text = (cluster["work"] / f"sweep_{array_id}_{index}.out").read_text()
        assert f"element {index} of 10 (array {array_id}, job {array_id}_{index})" in text
        assert "with 1 GPU(s), 1 CPU(s), partition default" in text
        seen.append(int(text.split("seed ")[1].split()[0]))
    assert sorted(seen) == [1000 + i for i in range(10)]


def test_gang_script_from_a_user_guide_runs_one_rank_per_task(cluster):
    job_id = ok(slurm(cluster, "sbatch", "--parsable", str(EXAMPLES / "gang.sh"))).strip()
    assert job_id.isdigit()
    assert wait_ended(cluster, job_id) == {job_id: ("COMPLETED", "0:0")}
    text = (cluster["work"] / f"ddp_{job_id}.out").read_text()
    lines = sorted(line for line in text.splitlines() if line.startswith("rank"))
    assert len(lines) == 2, f"output:\n{text}\nevents: {cluster['live'].job(job_id)['events']}"
    # One GPU a node: the ranks are on both nodes, rank 0 on the node list's first node (the head).
    first, second = (line.split() for line in lines)
    assert first[:9] == ["rank", "0", "of", "2", "local", "0", "node", "0", "of"]
    assert second[:9] == ["rank", "1", "of", "2", "local", "0", "node", "1", "of"]
    assert first[9] == second[9] == "2"
    assert {first[11], second[11]} == {"n01", "n02"}
    assert first[13] == second[13] == first[11]


def test_squeue_scancel_sacct_and_scontrol(cluster):
    submitted = slurm(cluster, "sbatch", "--parsable", "-J", "sleeper", "-A", "alpha", "-p", "batch",
                      "--wrap", "sleep 300")
    job_id = ok(submitted).strip()
    assert "warning" not in submitted.stderr  # the policy's [partitions] table maps batch to a pool
    wait_for(lambda: "R" == ok(slurm(cluster, "squeue", "-j", job_id, "-h", "-o", "%t")).strip(), "it to run")
    line = ok(slurm(cluster, "squeue", "--me", "--noheader", "--format=%i|%j|%T|%P|%a|%D|%u"))
    assert f"{job_id}|sleeper|RUNNING|default|alpha|1|root" in line.splitlines()
    table = ok(slurm(cluster, "squeue", "-u", "root")).splitlines()
    assert table[0].split() == ["JOBID", "PARTITION", "NAME", "USER", "ST", "TIME", "NODES", "NODELIST(REASON)"]
    assert any(row.split()[0] == job_id and row.split()[4] == "R" for row in table[1:])
    shown = ok(slurm(cluster, "scontrol", "show", "job", job_id))
    assert f"JobId={job_id} " in shown and "JobState=RUNNING" in shown and "Account=alpha" in shown
    ok(slurm(cluster, "scancel", job_id))
    assert wait_ended(cluster, job_id)[job_id][0] == "CANCELLED"
    assert ok(slurm(cluster, "squeue", "-j", job_id, "-h")) == ""


def test_failed_job_state_and_exit_code(cluster):
    job_id = ok(slurm(cluster, "sbatch", "--parsable", "--wrap", "exit 3")).strip()
    assert wait_ended(cluster, job_id) == {job_id: ("FAILED", "3:0")}
    listed = ok(slurm(cluster, "sacct", "-P", "-n", "-X", "-j", job_id, "--format", "JobID,JobName,Partition,"
                                                                                "Account,State,ExitCode"))
    assert listed.strip() == f"{job_id}|wrap|default|alpha|FAILED|3:0"
    by_name = ok(slurm(cluster, "sacct", "-X", "--parsable2", "--noheader", "--format=JobIdRaw,State",
                       "--starttime", "now-1hour", "--endtime", "now", "--name", "wrap"))
    assert f"{job_id}|FAILED" in by_name.splitlines()
    assert all(line.split("|")[0] != "" for line in by_name.splitlines())
    bad = slurm(cluster, "sacct", "-j", job_id, "-o", "JobID,Nonsense")
    assert bad.returncode == 1 and 'Invalid field requested: "Nonsense"' in bad.stderr


def test_array_element_cancel_forms(cluster):
    array_id = ok(slurm(cluster, "sbatch", "--parsable", "--array=0-3%1", "--wrap", "sleep 300")).strip()
    wait_for(lambda: "RUNNING" in ok(slurm(cluster, "squeue", "-j", f"{array_id}_0", "-h", "-o", "%T")),
             "element 0 to run")
    ok(slurm(cluster, "scancel", f"{array_id}_[0-1]"))
    wait_for(lambda: sacct(cluster, array_id).get(f"{array_id}_1", ("",))[0] == "CANCELLED"
             and sacct(cluster, array_id).get(f"{array_id}_0", ("",))[0] == "CANCELLED", "elements 0, 1 to end")
    ok(slurm(cluster, "scancel", array_id))
    rows = wait_ended(cluster, array_id, count=4)
    assert {state for state, _ in rows.values()} == {"CANCELLED"}


def test_gpuctl_submit_takes_the_same_script_and_names_the_pool_used(cluster):
    env = {k: v for k, v in cluster["env"].items()}
    done = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", "submit", "--parsable", "--hold",
                           str(EXAMPLES / "array.sh")], env=env, capture_output=True, text=True, timeout=60,
                          cwd=cluster["work"])
    array_id = ok(done).strip()
    assert "gpuctl submit: warning: no pool or [partitions] entry is named 'gpu'; the job goes to the default " \
           "pool 'default'" in done.stderr
    assert ok(slurm(cluster, "squeue", "-h", "-o", "%A %T", "-j", array_id)).split("\n")[0] == f"{array_id} PENDING"
    ok(slurm(cluster, "scancel", array_id))
    assert {state for state, _ in wait_ended(cluster, array_id, count=10).values()} == {"CANCELLED"}


def test_sinfo_lists_the_pool(cluster):
    lines = ok(slurm(cluster, "sinfo")).splitlines()
    assert lines[0].split() == ["PARTITION", "AVAIL", "TIMELIMIT", "NODES", "STATE", "NODELIST"]
    nodes = sum(int(line.split()[3]) for line in lines[1:] if line.split()[0] == "default")
    assert nodes == 2


def test_srun_inside_a_job_writes_its_own_output_pattern(cluster):
    script = ("#!/bin/bash\n#SBATCH -N 2\n#SBATCH -o step-%j.out\n"
              "srun --unbuffered --output step-%j_%t.log bash -c 'echo $SLURM_PROCID $SLURM_STEP_ID'\n")
    job_id = ok(slurm(cluster, "sbatch", "--parsable", stdin=script)).strip()
    assert wait_ended(cluster, job_id) == {job_id: ("COMPLETED", "0:0")}
    for rank in (0, 1):
        assert (cluster["work"] / f"step-{job_id}_{rank}.log").read_text() == f"{rank} 0\n"


def _add(a: int, b: int) -> int:
    return a + b


def _square(x: int) -> tuple[int, str]:
    return x * x, os.environ["SLURM_ARRAY_TASK_ID"]


def test_submitit_runs_a_function_and_an_array(cluster, tmp_path, monkeypatch):
    submitit = pytest.importorskip("submitit")
    for key, value in cluster["env"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)  # the job's workdir, where gpud's own output file of its script goes
    # The functions are pickled by reference to this module, so the jobs (which get this environment, as
    # sbatch exports it) import it as a user's job imports the user's package.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (JOB_PATH, os.environ.get("PYTHONPATH")) if p))
    executor = submitit.SlurmExecutor(folder=tmp_path / "submitit-%j")
    executor.update_parameters(time=5, cpus_per_task=1, mem="1GB", job_name="submitit-test")
    job = executor.submit(_add, 2, 3)
    assert job.job_id.isdigit()
    assert job.result() == 5
    assert _states_once_ended([job]) == ["COMPLETED"]
    executor.update_parameters(array_parallelism=2)
    jobs = executor.map_array(_square, [1, 2, 3, 4])
    assert len({j.job_id.split("_")[0] for j in jobs}) == 1
    assert [j.result() for j in jobs] == [(1, "0"), (4, "1"), (9, "2"), (16, "3")]
    assert _states_once_ended(jobs) == ["COMPLETED"] * 4


def _rank() -> tuple[str, str, str]:
    return os.environ["SLURM_PROCID"], os.environ["SLURM_NTASKS"], os.environ["SLURM_LOCALID"]


def test_submitit_runs_a_function_in_every_task(cluster, tmp_path, monkeypatch):
    submitit = pytest.importorskip("submitit")
    for key, value in cluster["env"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", JOB_PATH)
    executor = submitit.SlurmExecutor(folder=tmp_path / "tasks-%j")
    executor.update_parameters(time=5, cpus_per_task=1, ntasks_per_node=2, job_name="ranks")
    job = executor.submit(_rank)
    results = sorted(job.results())
    assert [(procid, ntasks) for procid, ntasks, _ in results] == [("0", "2"), ("1", "2")]


def _states_once_ended(jobs) -> list[str]:
    """The jobs' states as submitit reads them from sacct, once none is still running.

    A function's result is written before its process exits, so the job may
    still run for a moment after ``result()`` returns.
    """
    def states() -> list[str]:
        return [j.get_info(mode="force").get("State") for j in jobs]
    poll(lambda: not {"PENDING", "RUNNING"} & set(states()), 60, 0.5)
    return states()


def test_srun_outside_a_job_runs_the_command_as_an_interactive_job(cluster):
    result = slurm(cluster, "srun", "-A", "alpha", "--gres=gpu:1", "bash", "-c", "echo procid=$SLURM_PROCID; exit 4")
    assert "procid=0" in result.stdout, result.stderr
    assert result.returncode == 4


def test_salloc_with_a_command_runs_it_on_an_allocation(cluster):
    result = slurm(cluster, "salloc", "-A", "alpha", "-c", "1", "bash", "-c", "echo nodes=$SLURM_JOB_NODELIST")
    assert result.returncode == 0, result.stderr
    assert "nodes=n0" in result.stdout


def test_sbatch_wait_passes_arguments_and_exits_with_the_jobs_status(cluster, tmp_path):
    script = tmp_path / "args.sh"
    script.write_text("#!/bin/bash\n#SBATCH -o args-%j.out\necho \"[$1] [$2] $#\"\nexit 5\n")
    result = slurm(cluster, "sbatch", "--wait", "--parsable", str(script), "one two", "three")
    assert result.returncode == 5, result.stderr
    job_id = result.stdout.strip()
    assert (cluster["work"] / f"args-{job_id}.out").read_text() == "[one two] [three] 2\n"


# Told its time limit is near (the signal comes 15 s before the 20 s limit), the script asks to run again, as
# Slurm users write it; the run after the requeue finishes.
REQUEUE_SCRIPT = """\
#!/bin/bash
#SBATCH -t 0:20
#SBATCH --signal=B:USR1@15
#SBATCH -o requeue-%j.out
echo "run $SLURM_RESTART_COUNT"
if [ "$SLURM_RESTART_COUNT" -ge 1 ]; then echo finished; exit 0; fi
trap 'echo heard USR1; scontrol requeue "$SLURM_JOB_ID"' USR1
sleep 300 & wait
"""


def test_a_script_requeues_itself_before_its_time_limit_with_scontrol(cluster, tmp_path):
    script = tmp_path / "requeue.sh"
    script.write_text(REQUEUE_SCRIPT)
    # sbatch never copies GPUD_TOKEN into a job: scontrol in the job finds the user's token in the user's client
    # config, as on a cluster where the job runs as its user with its home.
    config = tmp_path / "config"
    (config / "gpud").mkdir(parents=True)
    (config / "gpud" / "client.toml").write_text(f'url = "{cluster["live"].url}"\ntoken = "{cluster["live"].admin_token}"\n')
    job_id = ok(slurm(cluster, "sbatch", "--parsable", str(script), env={"XDG_CONFIG_HOME": str(config)})).strip()
    assert wait_ended(cluster, job_id, timeout=120) == {job_id: ("COMPLETED", "0:0")}
    assert ok(slurm(cluster, "sacct", "-X", "-P", "-n", "-j", job_id, "-o", "JobID,Restarts")).strip() == \
        f"{job_id}|1"
    output = (cluster["work"] / f"requeue-{job_id}.out").read_text().splitlines()
    assert output == ["run 0", "heard USR1", "run 1", "finished"], output  # the requeue stopped run 0 at once
    events = cluster["live"].job(job_id)["events"]
    kinds = [e["kind"] for e in events]
    assert kinds == ["submitted", "started", "requeued", "started", "completed"], kinds
    # Requeued when told, 5 s in (15 s before the 20 s limit), not at the limit.
    assert 4.0 < events[2]["time"] - events[1]["time"] < 15.0, events


def test_scontrol_requeue_refuses_what_cannot_be_requeued(cluster):
    kept = ok(slurm(cluster, "sbatch", "--parsable", "--no-requeue", "--wrap", "sleep 300")).strip()
    wait_for(lambda: "R" == ok(slurm(cluster, "squeue", "-j", kept, "-h", "-o", "%t")).strip(), "it to run")
    refused = slurm(cluster, "scontrol", "requeue", kept)
    assert refused.returncode == 1
    assert f"requeue {kept}: job {kept} was submitted with --no-requeue" in refused.stderr, refused.stderr
    assert cluster["live"].job(kept)["state"] == "RUNNING"
    ok(slurm(cluster, "scancel", kept))
    assert wait_ended(cluster, kept)[kept][0] == "CANCELLED"
    ended = slurm(cluster, "scontrol", "requeue", kept)
    assert ended.returncode == 1 and "has already ended" in ended.stderr, ended.stderr
