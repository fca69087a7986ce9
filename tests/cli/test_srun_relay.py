"""srun in a job passes its step's output on in whole lines, as Slurm's does: real srun processes, one shared file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

# Once both tasks are ready (the file go exists), writes each word on its own, as Python does with
# PYTHONUNBUFFERED: 1,000 lines of 8 words.
WORDY = ("import os, time\n"
         "rank = os.environ['SLURM_PROCID']\n"
         "while not os.path.exists('go'):\n"
         "    time.sleep(0.01)\n"
         "for line in range(1000):\n"
         "    for word in ['rank', rank, 'line', str(line), 'of', 'the', 'same', 'task']:\n"
         "        os.write(1, (word + ' ').encode())\n"
         "    os.write(1, b'\\n')\n"
         "os.write(1, b'tail of ' + rank.encode())\n")


def srun(tmp_path: Path, rank: int, tasks: int, *argv: str) -> subprocess.Popen:
    """An srun as a task of a running job starts it (the job's variables set)."""
    env = {**os.environ, "GPUD_JOB_ID": "7", "SLURM_JOB_ID": "7", "SLURM_NTASKS": str(tasks),
           "SLURM_PROCID": str(rank)}
    return subprocess.Popen([sys.executable, "-m", "gpud.cli.slurm", "srun", *argv], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_two_tasks_writing_one_file_word_by_word_keep_their_lines_whole(tmp_path):
    steps = [srun(tmp_path, rank, 2, "--output", "shared.out", sys.executable, "-c", WORDY) for rank in (0, 1)]
    (tmp_path / "go").touch()
    assert [step.wait(timeout=60) for step in steps] == [0, 0], [step.stderr.read() for step in steps]
    text = (tmp_path / "shared.out").read_text()
    lines = text.replace("tail of 0", "").replace("tail of 1", "").splitlines()
    assert len(lines) == 2000
    for rank in ("0", "1"):
        mine = [line for line in lines if line.startswith(f"rank {rank} ")]
        assert mine == [f"rank {rank} line {i} of the same task " for i in range(1000)]
    # The last line, without its newline, is passed on too.
    assert text.count("tail of 0") == text.count("tail of 1") == 1


def test_label_puts_each_task_rank_before_its_lines(tmp_path):
    step = srun(tmp_path, 3, 12, "--label", "bash", "-c", "echo one; echo two >&2; printf three")
    out, err = step.communicate(timeout=60)
    assert step.returncode == 0
    assert out == b" 3: one\n 3: three" and err == b" 3: two\n"
    short = srun(tmp_path, 0, 1, "-l", "echo", "alone")
    assert short.communicate(timeout=60)[0] == b"0: alone\n"


# Counts the USR1s it hears, each as it comes; says how many when told to stop.
COUNTER = """\
import os, signal, sys, time
heard = []
def usr1(number, frame):
    heard.append(number)
    os.write(1, f"usr1 {len(heard)}\\n".encode())
def term(number, frame):
    os.write(1, f"term after {len(heard)}\\n".encode())
    sys.exit(0)
signal.signal(signal.SIGUSR1, usr1)
signal.signal(signal.SIGTERM, term)
os.write(1, b"ready\\n")
while True:
    time.sleep(0.01)
"""


def test_the_step_exit_status_passes_through(tmp_path):
    failed = srun(tmp_path, 0, 2, "bash", "-c", "exit 3")
    assert failed.wait(timeout=60) == 3
    killed = srun(tmp_path, 0, 2, "bash", "-c", "kill -KILL $$")
    assert killed.wait(timeout=60) == 128 + 9
    missing = srun(tmp_path, 0, 2, "no-such-program-anywhere")
    assert missing.wait(timeout=60) == 127 and b"cannot run no-such-program-anywhere" in missing.stderr.read()


def test_a_signal_sent_to_srun_alone_by_the_task_reaches_the_step_once(tmp_path):
    # As a script's trap does it: `kill -USR1 $SRUN_PID`, from a process of srun's own group (here, the test).
    step = srun(tmp_path, 0, 2, sys.executable, "-c", COUNTER)
    assert step.stdout.readline() == b"ready\n"
    step.send_signal(signal.SIGUSR1)
    assert step.stdout.readline() == b"usr1 1\n"
    step.send_signal(signal.SIGTERM)
    assert step.wait(timeout=60) == 0
    assert step.stdout.read() == b"term after 1\n"


def test_a_signal_to_the_whole_group_reaches_the_step_once_not_twice(tmp_path):
    # As the node signals a task (its process group, from outside it) for a stop or --signal.
    env = {**os.environ, "GPUD_JOB_ID": "7", "SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"}
    step = subprocess.Popen([sys.executable, "-m", "gpud.cli.slurm", "srun", sys.executable, "-c", COUNTER], env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert step.stdout.readline() == b"ready\n"
        os.killpg(step.pid, signal.SIGUSR1)
        assert step.stdout.readline() == b"usr1 1\n"
        os.killpg(step.pid, signal.SIGTERM)
        assert step.wait(timeout=60) == 0
        assert step.stdout.read() == b"term after 1\n"
    finally:
        if step.poll() is None:
            os.killpg(step.pid, signal.SIGKILL)
            step.wait()


def test_a_single_task_step_runs_in_place_of_srun(tmp_path):
    step = srun(tmp_path, 0, 1, "bash", "-c", "echo $$")
    out, _ = step.communicate(timeout=60)
    assert int(out) == step.pid, "one task: nothing to share, the command replaced srun"


def test_only_a_signal_from_the_own_group_is_passed_on():
    from gpud.cli.slurm.relay import sent_from_own_group
    assert sent_from_own_group(os.getpid(), step=-1)
    assert not sent_from_own_group(0, step=-1), "the kernel's (a terminal's Ctrl-C) reached the whole group"
    outsider = subprocess.Popen(["sleep", "30"], start_new_session=True)
    ours = subprocess.Popen(["sleep", "30"])
    try:
        assert not sent_from_own_group(outsider.pid, step=-1), "from outside the group: the node's signal"
        assert sent_from_own_group(ours.pid, step=-1)
        assert not sent_from_own_group(ours.pid, step=ours.pid), "the step's own"
    finally:
        for process in (outsider, ours):
            process.kill()
            process.wait()
    assert not sent_from_own_group(outsider.pid, step=-1), "a sender gone since"
