"""srun: inside a job, a step run in this task's share of the allocation; outside one, an interactive job.

gpud runs a batch script once in every task of its job, each with its own
``SLURM_PROCID``; so ``srun CMD`` in the script runs CMD once per task of
the job, as Slurm's srun does, by running it here in this task.
"""

from __future__ import annotations

import os
import sys

# srun's options that take a value (the others it knows are switches): what the step reads, and what it names
# in a warning because the step runs on the job's allocation as it is.
VALUED = {"output": "o", "error": "e", "input": "i", "ntasks": "n", "nodes": "N", "cpus-per-task": "c",
          "job-name": "J", "chdir": "D", "export": None, "gres": None, "gpus": "G", "gpus-per-node": None,
          "gpus-per-task": None, "mem": None, "mem-per-cpu": None, "mem-per-gpu": None, "ntasks-per-node": None,
          "time": "t", "partition": "p", "account": "A", "mpi": None, "cpu-bind": None, "distribution": "m",
          "open-mode": None, "kill-on-bad-exit": "K", "nodelist": "w", "exclude": "x", "constraint": "C",
          "qos": "q", "signal": None, "wait": "W", "label": None, "cpus-per-gpu": None, "het-group": None,
          "threads-per-core": None, "hint": None, "jobid": None, "comment": None, "dependency": "d",
          "reservation": None, "network": None, "nodefile": None, "gres-flags": None,
          "cpu-freq": None, "ntasks-per-gpu": None, "mem-bind": None, "profile": None, "slurmd-debug": None}
_SHORT = {short: name for name, short in VALUED.items() if short}
STEP_READS = frozenset({"output", "error", "ntasks", "chdir", "job-name", "open-mode", "export"})


def parse(argv: list[str]) -> tuple[dict[str, str | None], list[str]]:
    """srun's options (long names) and the command after them."""
    options: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return options, argv[i + 1:]
        if not word.startswith("-") or word == "-":
            return options, argv[i:]
        i += 1
        if word.startswith("--"):
            name, sep, value = word[2:].partition("=")
            given: str | None = value if sep else None
        else:
            name = _SHORT.get(word[1], word[1])
            given = word[2:] or None
        if given is None and name in VALUED and name not in ("label", "kill-on-bad-exit") and i < len(argv):
            given = argv[i]
            i += 1
        options[name] = given
    return options, []


def expand(pattern: str, env: dict[str, str]) -> str:
    """srun's file name pattern: %j job, %A array job, %a array index, %t task, %n node, %N host, %s step, %x name,
    %u user, %% percent."""
    job = env.get("SLURM_JOB_ID", "0")
    values = {"j": job, "J": job, "A": env.get("SLURM_ARRAY_JOB_ID", job), "a": env.get("SLURM_ARRAY_TASK_ID", "4294967294"),
              "t": env.get("SLURM_PROCID", "0"), "n": env.get("SLURM_NODEID", "0"),
              "N": env.get("SLURMD_NODENAME", ""), "s": env.get("SLURM_STEP_ID", "0"),
              "x": env.get("SLURM_JOB_NAME", ""), "u": env.get("USER", ""), "%": "%"}
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] == "%" and i + 1 < len(pattern) and pattern[i + 1] in values:
            out.append(values[pattern[i + 1]])
            i += 2
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


def srun(argv: list[str]) -> int:
    """``srun [OPTIONS] COMMAND``: in a job, run COMMAND in this task, its output passed on in whole lines when the
    job's tasks may share a file (or ``--label``led), else in place of this process; outside one, an interactive job."""
    if not os.environ.get("GPUD_JOB_ID") or not os.environ.get("SLURM_JOB_ID"):
        from gpud.cli.slurm.submit import interactive
        return interactive(argv, "srun")
    options, command = parse(argv)
    if not command:
        print("srun: error: no command to run", file=sys.stderr)
        return 1
    for name in sorted(set(options) - STEP_READS):
        if name in VALUED and name not in ("label", "mpi", "cpu-bind", "kill-on-bad-exit", "distribution", "hint"):
            print(f"srun: warning: --{name} ignored: a step runs on the job's own allocation", file=sys.stderr)
    env = dict(os.environ)
    env.update({"SLURM_STEP_ID": "0", "SLURM_STEPID": "0"})
    procid = int(env.get("SLURM_PROCID", "0"))
    wanted = options.get("ntasks")
    if wanted is not None and wanted.isdigit() and procid >= int(wanted):
        return 0  # a step of fewer tasks than the job runs in its first tasks only
    if wanted is not None and wanted.isdigit() and int(wanted) < int(env.get("SLURM_NTASKS", "1")):
        env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = wanted
    unbuffered = "unbuffered" in options or "u" in options
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    if options.get("chdir"):
        os.chdir(options["chdir"] or ".")
    if options.get("job-name"):
        env["SLURM_JOB_NAME"] = options["job-name"] or ""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if options.get("open-mode") == "truncate" else os.O_APPEND)
    if options.get("output"):
        out = _open(expand(options["output"] or "", env), flags)
        os.dup2(out, 1)
        if not options.get("error"):
            os.dup2(out, 2)
        os.close(out)
    if options.get("error"):
        err = _open(expand(options["error"] or "", env), flags)
        os.dup2(err, 2)
        os.close(err)
    tasks = int(env.get("SLURM_NTASKS", "1"))
    labelled = "label" in options or "l" in options
    if labelled or (tasks > 1 and not unbuffered):
        # The job's tasks may share the output file: pass the step's output on in whole lines, as Slurm's srun.
        from gpud.cli.slurm.relay import run_relaying
        return run_relaying(command, env, f"{procid:>{len(str(tasks - 1))}}: " if labelled else "")
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"srun: error: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127


def _open(path: str, flags: int) -> int:
    """Open a step's output file, making its directory when it is missing, as Slurm's srun does not need to."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    return os.open(path, flags, 0o644)
