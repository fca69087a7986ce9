"""sbatch and salloc over gpud's API: Slurm's options translated as ``#SBATCH`` lines are, then submitted."""

from __future__ import annotations

import os
import sys

from gpud.cli.common import UsageError

# Options only the sbatch command itself reads (not job options), and whether each takes a value.
OWN = {"parsable": False, "wrap": True, "export": True, "wait": False, "W": False, "test-only": False,
       "quiet": False, "Q": False, "get-user-env": False, "export-file": True}
WAIT_POLL_S = 1.0


def split_command_line(argv: list[str]) -> tuple[list[str], dict[str, str | None], list[str]]:
    """sbatch's words as (job options, sbatch's own options, script and its arguments).

    An option takes the next word as its value unless it was written
    ``--opt=value`` or ``-Xvalue``, Slurm knows it as a switch, or the next
    word starts with ``-``; the first other word is the script.
    """
    from gpud.sbatch import SHORT, SWITCHES
    options: list[str] = []
    own: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("-") or word == "-":
            return options, own, argv[i:]
        i += 1
        if word.startswith("--"):
            name, sep, value = word[2:].partition("=")
            given: str | None = value if sep else None
        else:
            name, given = word[1], (word[2:] or None)
            name = SHORT.get(name, name)
        takes = OWN[name] if name in OWN else name not in SWITCHES
        if given is None and takes and i < len(argv) and not argv[i].startswith("-"):
            given = argv[i]
            i += 1
            word = f"{word}={given}" if word.startswith("--") else f"{word}{given}"
        if name in OWN:
            own[name] = given
        else:
            options.append(word)
    return options, own, []


def _exported(spec: str | None, environ: dict[str, str]) -> tuple[bool, dict[str, str]]:
    """sbatch's ``--export``: (copy the whole environment?, the variables it names)."""
    if spec is None:
        return True, {}
    whole, named = False, {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        if key in ("ALL", "NIL"):
            whole = key == "ALL"
        elif key == "NONE":
            whole = False
        elif sep:
            named[key] = value
        elif key in environ:
            named[key] = environ[key]
    return whole, named


def _job(argv: list[str], prog: str, interactive: bool = False) -> tuple[dict, dict[str, str | None]]:
    """The API's job for an sbatch/salloc command line, and sbatch's own options."""
    from gpud.cli.script_options import script_options
    from gpud.cli.submit_cmd import JOB_OPTIONS, build_job, merge
    options, own, rest = split_command_line(argv)
    environ = dict(os.environ)
    command: list[str] | None = None
    script_name = None
    if interactive:
        text, command = "", rest or None
    elif own.get("wrap") is not None:
        text = f"#!/bin/sh\n{own['wrap']}\n"
        script_name = "wrap"
        if rest:
            raise UsageError("give --wrap or a script, not both")
    else:
        path = rest[0] if rest else "-"
        try:
            text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"{path}: cannot read the script: {getattr(exc, 'strerror', None) or exc}") from None
        script_name = None if path == "-" else os.path.basename(path)
    source = "command line" if interactive else ("stdin" if script_name is None else rest[0] if rest else "wrap")
    found = script_options(text, source, script_name, tuple(options), prog)
    unset = JOB_OPTIONS.quick_parse([])  # every job option, None: what the script does not set stays unset
    assert unset is not None  # the job options are all plain ones the quick reader reads
    opts = merge(unset, found)
    _fit_outputs(opts, prog)
    whole, named = _exported(own.get("export"), environ)
    opts.export_env = whole or None
    if not interactive and len(rest) > 1:
        text = with_arguments(text, rest[1:])  # after the directives were read from the script as written
    job = build_job(opts, command=command, script=None if interactive else text, script_name=script_name,
                    environ=environ)
    env = {**job.get("env", {}), **named, "SLURM_SUBMIT_DIR": os.getcwd(),
           "SLURM_SUBMIT_HOST": os.uname().nodename}  # socket.gethostname(), without socket's import
    job["env"] = env
    return job, own


SHELLS = ("sh", "bash", "dash", "ksh", "zsh")


def with_arguments(text: str, arguments: list[str]) -> str:
    """A shell script that sees ``arguments`` as ``$1 ...``, as sbatch passes the words after the script.

    gpud stores a job's script, not a command line, so the arguments are set
    by a ``set --`` line put after the ``#!`` line. Raises UsageError for a
    script of another interpreter, which could not read that line.
    """
    import shlex
    first, newline, rest = text.partition("\n")
    interpreter = first[2:].split() if first.startswith("#!") else ["sh"]
    name = os.path.basename(interpreter[-1] if interpreter and os.path.basename(interpreter[0]) == "env"
                            else interpreter[0] if interpreter else "sh")
    if name not in SHELLS:
        raise UsageError(f"arguments after a {name} script ({' '.join(arguments)}) cannot be passed on by gpud; "
                         f"set them in the script or with --export")
    line = f"set -- {shlex.join(arguments)}"
    return f"{first}\n{line}\n{rest}" if first.startswith("#!") else f"{line}\n{text}"


def _fit_outputs(opts, prog: str) -> None:
    """Output files given as absolute paths, made relative to the workdir; one outside it is named in a warning.

    gpud writes a job's output files only inside its workdir, so an sbatch
    ``-o /elsewhere/%j.out`` falls back to gpud's default file there (what
    the script runs with ``srun --output`` still goes where it says).
    """
    workdir = os.path.abspath(opts.workdir or os.getcwd())
    for name in ("output", "error"):
        path = getattr(opts, name)
        if not path or not os.path.isabs(path) or path == os.devnull:
            continue
        relative = os.path.relpath(path, workdir)
        if relative.startswith(".."):
            print(f"{prog}: warning: --{name}={path} ignored: gpud writes a job's output only inside its "
                  f"working directory ({workdir}); the job's own default file there is used", file=sys.stderr)
            setattr(opts, name, None)
        else:
            setattr(opts, name, relative)


def sbatch(argv: list[str]) -> int:
    """``sbatch [OPTIONS] SCRIPT`` (or ``--wrap CMD``, or the script on stdin): prints ``Submitted batch job ID``,
    or just ``ID`` with ``--parsable``; ``--wait`` waits and exits with the job's exit code."""
    from gpud.cli.common import client
    from gpud.cli.submit_cmd import print_notes
    job, own = _job(argv, "sbatch")
    if "test-only" in own:
        print(f"sbatch: Job would be submitted to pool {job.get('pool') or job.get('partition') or 'default'}",
              file=sys.stderr)
        return 0
    api = client()
    answer = api.post("jobs", job, idempotent=True)
    print_notes(answer, "sbatch")
    job_id = str(answer.get("array_id") or answer["ids"][0])
    if "parsable" in own:
        print(job_id)
    elif "quiet" not in own and "Q" not in own:
        print(f"Submitted batch job {job_id}")
    sys.stdout.flush()
    if "wait" in own or "W" in own:
        return _wait(api, job_id)
    return 0


def _wait(api, job_id: str) -> int:
    import time
    while True:
        job = api.get(f"jobs/{job_id}")
        if job.get("state") not in ("PENDING", "RUNNING"):
            elements = job.get("elements") or [job]
            return max((e.get("exit_code") or (1 if e.get("state") != "COMPLETED" else 0)) for e in elements)
        time.sleep(WAIT_POLL_S)


def salloc(argv: list[str]) -> int:
    """``salloc [OPTIONS] [COMMAND]``: an interactive allocation, as ``gpuctl run`` makes one."""
    return interactive(argv, "salloc")


def interactive(argv: list[str], prog: str) -> int:
    """Submit an interactive job for Slurm options ``argv`` (and a command after them) and attach to it."""
    from gpud.cli.run_cmd import run_new
    job, _ = _job(argv, prog, interactive=True)
    return run_new(job)
