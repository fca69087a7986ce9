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


def test_the_step_exit_status_and_a_signal_pass_through(tmp_path):
    failed = srun(tmp_path, 0, 2, "bash", "-c", "exit 3")
    assert failed.wait(timeout=60) == 3
    missing = srun(tmp_path, 0, 2, "no-such-program-anywhere")
    assert missing.wait(timeout=60) == 127 and b"cannot run no-such-program-anywhere" in missing.stderr.read()
    # srun told to stop passes the signal on to its step, which says so and ends.
    step = srun(tmp_path, 0, 2, "bash", "-c", "trap 'echo got TERM; exit 143' TERM; echo ready; "
                                               "while true; do sleep 0.1; done")
    assert step.stdout.readline() == b"ready\n"
    step.send_signal(signal.SIGTERM)
    assert step.wait(timeout=60) == 143
    assert step.stdout.read() == b"got TERM\n"


def test_a_single_task_step_runs_in_place_of_srun(tmp_path):
    step = srun(tmp_path, 0, 1, "bash", "-c", "echo $$")
    out, _ = step.communicate(timeout=60)
    assert int(out) == step.pid, "one task: nothing to share, the command replaced srun"
