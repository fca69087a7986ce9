"""``gpuctl submit``: submit a command, a batch script with ``#GPUD`` lines, or a file of many jobs."""

from __future__ import annotations

import math
import os
import sys

from gpud.cli.common import UsageError
from gpud.cli.options import Namespace, Options, Verb
from gpud.cli.units import parse_array, parse_duration, parse_size_gib

TYPE_CHECKING = False  # argparse is imported only for help, errors and #GPUD lines
if TYPE_CHECKING:
    import argparse

MAX_BATCH = 10_000  # the API's limit for one POST /api/v1/jobs/batch
DEPENDENCY_KINDS = ("afterok", "afterany", "afternotok")
NEVER_EXPORTED = ("GPUD_TOKEN",)  # a credential does not belong in a job's recorded environment

DESCRIPTION = """\
Submit a job, as sbatch does. Give either a command after `--` (run as an
argv list, no shell) or a batch script whose `#GPUD` lines at the top set
options the way `#SBATCH` lines do; options on the command line win over the
script's. Every option is per task; --tasks N asks for a gang of N tasks that
start together or not at all. With --from-file, submit many jobs in one call:
a JSON list (or {"jobs": [...]}) or JSON lines of job objects in the API's
format (docs/api.md); options given on the command line fill the fields a job
leaves out.

For hundreds or thousands of jobs, submit them in one call rather than one
gpuctl per job from a shell loop (each call starts a Python process): the
same command over indices with --array 0-9999 (each job reads its index in
$GPUD_ARRAY_TASK_ID), or different jobs with --from-file jobs.jsonl (up to
10,000 per request).

#SBATCH lines are read too, so a Slurm script runs as it is: --gres=gpu:N
(gpu:TYPE:N asks for nodes labelled gpu_type=TYPE), --gpus-per-node/-task,
--gpus (the job's total), -N/--nodes (one task per node; 2-4 makes an
elastic gang), --ntasks-per-node, -n/--ntasks, -c, --mem (a bare number is MB, as in Slurm),
-t, -J, -o, -e (%j, %t, %x, %u, %A_%a), --array, -p (a pool, a partition
the policy maps, else the default pool), -A (the project), --qos (a
priority class), --dependency, -D, -H and --no-requeue. Every other #SBATCH
option is named in a warning and ignored. #GPUD lines win over #SBATCH
lines. Each task gets Slurm's SLURM_* variables; `gpuctl slurm-shims`
writes sbatch, squeue, sacct, ... commands (docs/user-guide.md).

Sizes: 16G, 20GiB, 512M (powers of 1024; a bare number is GiB).
Times: 90 (minutes), 1:30:00, 2-00:00:00 (days), 90m, 1.5h, 30s.
"""

EXAMPLES = """\
  gpuctl submit --project vision --gpus 1 -- python train.py --lr 3e-4
  gpuctl submit train.sh                  # with '#GPUD --project vision' lines at the top
  gpuctl submit -p nlp --gpus 8 --tasks 4 --time 2-00:00:00 -- torchrun train.py
  gpuctl submit -p nlp --gpus 0.5 --mem 32G -- python serve.py
  gpuctl submit -p hpo --gpu-memory 20GiB --array 0-99%8 -- python trial.py
  gpuctl submit -p nlp --depends afterok:$(gpuctl submit --parsable -p nlp -- ./prep.sh) -- ./train.sh
  gpuctl submit -p sweep --from-file jobs.jsonl --parsable > ids.txt
"""


def add_parsers(subparsers) -> None:
    """Register ``submit`` on the gpuctl sub-command parser."""
    VERB.add_to(subparsers)


def add_options(parser: argparse.ArgumentParser | Options) -> None:
    """The job options shared by the command line and ``#GPUD`` lines; every default is None (unset)."""
    add = parser.add_argument
    add("-p", "--project", help="project (queue) to charge; default $GPUD_PROJECT, "
                                         "then project in the client config")
    add("-J", "--name", help="a name for people (default: the command or script name)")
    add("--gpus", type=_gpus, metavar="N", help="GPUs per task: 0, a fraction such as 0.5, or a whole number")
    add("--gpu-memory", type=_size, metavar="SIZE", help="a slice of one GPU's memory instead of --gpus")
    add("--gpu-compute-request", type=_fraction, metavar="F",
        help="time-sliced GPUs: the compute share this job is sure of (default: its fraction, or 0 for --gpu-memory)")
    add("--gpu-compute-limit", type=_fraction, metavar="F",
        help="time-sliced GPUs: the most compute it may take in fair mode (default: 1)")
    add("-n", "--tasks", type=_positive_int, metavar="N", help="tasks in the gang (default 1)")
    add("--min-tasks", type=_positive_int, metavar="N", help="elastic gang: run with at least N tasks")
    add("-c", "--cpus", type=_non_negative_number, metavar="N",
        help="CPUs per task (default 1; 0 asks for none, for a task that mostly waits on its GPU)")
    add("--mem", type=_size, metavar="SIZE", help="memory per task (default 1G)")
    add("--priority", metavar="CLASS", type=_priority,
        help="priority class (inference, build, interactive-preemptible, train) or an integer")
    add("--constraint", action="append", type=_pair, metavar="KEY=VALUE", help="node label to require (repeatable)")
    add("--pool", help="node pool (default: the policy's)")
    add("--partition", metavar="NAME", help="a Slurm partition: the pool of that name, the pool the policy's "
                                            "[partitions] table maps it to, or else the default pool")
    add("--qos", metavar="NAME", help="a Slurm QOS: the priority class of that name (else ignored, with a warning)")
    add("--workdir", metavar="DIR", help="directory the tasks start in (default: the current directory)")
    add("--env", action="append", type=_env, metavar="K=V",
        help="set a variable in the job (repeatable); a bare K copies it from here")
    add("--export-env", action="store_const", const=True, help="copy this whole environment into the job")
    add("-t", "--time", type=_duration, metavar="TIME", help="time limit; then the job ends TIMEOUT")
    add("-a", "--array", type=_array, metavar="SPEC", help="job array: 0-99, 1,3,5-7, 0-99%%8 (8 at once)")
    add("-d", "--depends", action="append", type=_depends, metavar="KIND:ID",
        help="afterok:ID, afterany:ID or afternotok:ID (repeatable; afterok:1:2,afterany:3 also works)")
    add("-H", "--hold", action="store_const", const=True, help="submit held until `gpuctl release`")
    add("--no-requeue", action="store_const", const=True, help="end PREEMPTED instead of waiting again")
    add("--signal", type=_signal_spec, metavar="[B:]SIG[@LEAD]",
        help="SIG alone: the first signal when the job is stopped (default TERM). SIG@LEAD: SIG goes LEAD "
             "seconds before the time limit, and at once when the job is preempted, with at least LEAD seconds "
             "to checkpoint before the stop; B: sends it to the task's first process alone")
    add("-o", "--output", metavar="FILE", help="stdout file in the workdir; %%j job id, %%t task (default "
        "gpud-%%j.out; a gang's tasks: gpud-%%j.%%t.out, one file each)")
    add("-e", "--error", metavar="FILE", help="stderr file (default: the same as --output)")


OPTIONS = ("project", "name", "gpus", "gpu_memory", "gpu_compute_request", "gpu_compute_limit", "tasks", "min_tasks", "cpus", "mem", "priority",
           "constraint", "pool", "partition", "qos", "workdir", "env", "export_env", "time", "array", "depends", "hold",
           "no_requeue", "signal", "output", "error")


def directive_parser() -> argparse.ArgumentParser:
    """A parser for the options of ``#GPUD`` lines: the job options, no positionals."""
    import argparse

    from gpud.cli.parsing import Formatter
    return JOB_OPTIONS.apply(argparse.ArgumentParser(prog="#GPUD", add_help=False, formatter_class=Formatter))


def merge(command_line: argparse.Namespace | Namespace, directives: argparse.Namespace | Namespace) -> Namespace:
    """The options in effect: the command line's where it set them, else the script's directives."""
    merged = Namespace(**vars(command_line))
    for dest in OPTIONS:
        if getattr(command_line, dest, None) is None and getattr(directives, dest, None) is not None:
            setattr(merged, dest, getattr(directives, dest))
    return merged


def build_job(opts: argparse.Namespace | Namespace, *, command: list[str] | None = None, script: str | None = None,
              script_name: str | None = None, cwd: str | None = None,
              environ: dict[str, str] | None = None, base: dict | None = None) -> dict:
    """The API's job object for these options; ``base`` (a job from a file) keeps the fields it sets.

    Raises UsageError when the project is missing or a bare --env name is
    not set here.
    """
    environ = dict(os.environ if environ is None else environ)
    job = dict(base or {})

    def put(key, value):
        if value is not None and key not in job:
            job[key] = value

    if command is not None:
        job["command"] = list(command)
    if script is not None:
        job["script"] = script
        put("name", opts.name or script_name)
    put("project", opts.project or environ.get("GPUD_PROJECT"))
    if "project" not in job:
        from gpud.client import configured_project
        put("project", configured_project(environ))
    if "project" not in job:
        raise UsageError("which project? give --project (or '#GPUD --project' in the script, GPUD_PROJECT, "
                         "or project = \"NAME\" in the client config)")
    put("name", opts.name)
    put("workdir", os.path.abspath(opts.workdir) if opts.workdir else (cwd or os.getcwd()))
    env = _job_env(opts, environ)
    if env:
        job["env"] = {**env, **job.get("env", {})}
    put("gpus", opts.gpus)
    put("gpu_memory_gib", opts.gpu_memory)
    put("gpu_compute_request", opts.gpu_compute_request)
    put("gpu_compute_limit", opts.gpu_compute_limit)
    put("tasks", opts.tasks)
    put("min_tasks", opts.min_tasks)
    put("cpus", opts.cpus)
    put("memory_gib", opts.mem)
    put("priority", opts.priority)
    if opts.constraint:
        put("constraint", dict(opts.constraint))
    put("pool", opts.pool)
    put("partition", getattr(opts, "partition", None))
    put("qos", getattr(opts, "qos", None))
    put("time_limit_s", opts.time)
    put("array", opts.array)
    if opts.depends:
        put("depends", [d for group in opts.depends for d in group])
    put("hold", opts.hold)
    if opts.no_requeue:
        put("requeue", False)
    if opts.signal is not None:
        name, lead, batch_only = opts.signal
        if lead is None:
            put("stop_signal", name)
        else:
            put("warn_signal", name)
            put("warn_lead_s", lead)
            if batch_only:
                put("warn_batch_only", True)
    put("output", opts.output)
    put("error", opts.error)
    return job


def _job_env(opts: argparse.Namespace | Namespace, environ: dict[str, str]) -> dict[str, str]:
    env = {}
    if opts.export_env:
        env.update({k: v for k, v in environ.items() if k not in NEVER_EXPORTED})
    for key, value in opts.env or []:
        if value is None:
            if key not in environ:
                raise UsageError(f"--env {key}: {key} is not set in this environment (use --env {key}=VALUE)")
            value = environ[key]
        env[key] = value
    return env


def load_jobs_file(path: str) -> list[dict]:
    """The job objects in a JSON file (a list, or ``{"jobs": [...]}``) or a JSON-lines file.

    Raises UsageError naming the file (and the line, for JSON lines) when it
    cannot be read or an entry is not a JSON object.
    """
    return read_jobs_file(path)[0]


def read_jobs_file(path: str) -> tuple[list[dict], list[str]]:
    """The job objects in a jobs file, and where each one is for people: "entry 1", ... in a JSON
    document, "line 7" in JSON lines (both counted from 1, as editors count)."""
    import json
    try:
        with (sys.stdin if path == "-" else open(path, encoding="utf-8")) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        doc = json.loads(text)
        jobs = doc["jobs"] if isinstance(doc, dict) and "jobs" in doc else doc
        if isinstance(jobs, dict):
            jobs = [jobs]
        places = [f"entry {i}" for i in range(1, len(jobs) + 1)] if isinstance(jobs, list) else []
    except ValueError:
        jobs, lines = [], []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    jobs.append(json.loads(line))
                except ValueError as exc:
                    raise UsageError(f"{path}, line {number}: not JSON: {exc}") from None
                lines.append(number)
        places = [f"line {number}" for number in lines]
    if not isinstance(jobs, list):
        raise UsageError(f"{path}: expected a list of jobs, {{\"jobs\": [...]}} or one job per line")
    for index, job in enumerate(jobs):
        if not isinstance(job, dict):
            raise UsageError(f"{path}, {places[index]}: a job must be a JSON object")
    if not jobs:
        raise UsageError(f"{path}: no jobs in the file")
    return jobs, places


def run(args: argparse.Namespace) -> int:
    """Submit what the command line says and print the ids; returns the exit status."""
    if args.from_file:
        if args.script or args.command_argv is not None:
            raise UsageError("--from-file takes its commands from the file; give no script or command")
        jobs, places = read_jobs_file(args.from_file)
        return _submit_batch([build_job(args, base=job) for job in jobs], args.parsable, args.from_file, places)
    if args.script and args.command_argv is not None:
        raise UsageError("give a script or a command after --, not both")
    if args.command_argv is not None:
        if not args.command_argv:
            raise UsageError("nothing to run after --")
        job = build_job(args, command=args.command_argv)
    elif args.script:
        text = _read_script(args.script)
        from gpud.cli.script_options import script_options
        source = "stdin" if args.script == "-" else args.script
        name = None if args.script == "-" else os.path.basename(args.script)
        found = script_options(text, source, args.name or name)
        job = build_job(merge(args, found), script=text, script_name=name)
    else:
        raise UsageError("nothing to run: give a batch script, or a command after -- "
                         "(gpuctl submit -p PROJECT -- python train.py)")
    from gpud.cli.common import client
    answer = client().post("jobs", job, idempotent=True)
    _print_submitted(answer, args.parsable)
    return 0


def _read_script(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the script: {getattr(exc, 'strerror', None) or exc}") from None


def _submit_batch(jobs: list[dict], parsable: bool, path: str, places: list[str]) -> int:
    from gpud.cli.common import client
    from gpud.client import ApiError, ClientError
    api = client()
    ids: list[str] = []
    for start in range(0, len(jobs), MAX_BATCH):
        try:
            answer = api.post("jobs/batch", {"jobs": jobs[start:start + MAX_BATCH]}, idempotent=True)
        except ClientError as exc:
            if ids:  # earlier batches were accepted: say which, so a rerun can skip them
                _print_ids(ids, parsable)
                print(f"gpuctl submit: the {len(ids)} jobs before {path}, {places[start]} were submitted; "
                      f"it and the jobs after it were not", file=sys.stderr)
            index = exc.index if isinstance(exc, ApiError) else None
            if isinstance(exc, ApiError) and index is not None and 0 <= start + index < len(places):
                field = f", field {exc.field!r}" if exc.field else ""
                exc.args = (f"{path}, {places[start + index]}: {exc.message} (HTTP {exc.status}{field})",)
            raise
        ids.extend(str(i) for i in answer.get("ids", []))
    _print_ids(ids, parsable)
    return 0


def _print_ids(ids: list[str], parsable: bool) -> None:
    if parsable:
        print("\n".join(ids))
    elif len(ids) <= 10:
        print(f"submitted {len(ids)} job{'s' if len(ids) != 1 else ''}: {' '.join(ids)}")
    else:
        print(f"submitted {len(ids)} jobs: {ids[0]} ... {ids[-1]}")


def print_notes(answer: dict, prog: str = "gpuctl submit") -> None:
    """Say on stderr how the controller took a Slurm partition or QOS the job named (the answer's ``notes``)."""
    for note in answer.get("notes") or []:
        given = note.get("given")
        how = note.get("how")
        if note.get("field") == "partition" and how == "default":
            print(f"{prog}: warning: no pool or [partitions] entry is named {given!r}; the job goes to the "
                  f"default pool {note.get('pool')!r}", file=sys.stderr)
        elif note.get("field") == "partition" and how == "overridden":
            print(f"{prog}: warning: partition {given!r} ignored: the job names its pool "
                  f"{note.get('pool')!r}", file=sys.stderr)
        elif note.get("field") == "qos" and how == "ignored":
            print(f"{prog}: warning: QOS {given!r} ignored: it is not a priority class of the policy", file=sys.stderr)
        elif note.get("field") == "qos" and how == "overridden":
            print(f"{prog}: warning: QOS {given!r} ignored: the job gives its priority", file=sys.stderr)


def _print_submitted(answer: dict, parsable: bool) -> None:
    print_notes(answer)
    ids = [str(i) for i in answer.get("ids", [])]
    array_id = answer.get("array_id")
    if parsable:
        print(array_id if array_id is not None else "\n".join(ids))
    elif array_id is not None:
        span = f"{ids[0]} ... {ids[-1]}" if len(ids) > 3 else " ".join(ids)
        print(f"submitted array job {array_id} ({len(ids)} jobs: {span})")
    else:
        print(f"submitted job {' '.join(ids)}")


def _checked(convert):
    def check(text: str):
        try:
            return convert(text)
        except ValueError as exc:
            import argparse  # argparse alone calls a type with a value it refuses; it is loaded then
            raise argparse.ArgumentTypeError(str(exc)) from None
    check.__name__ = convert.__name__.strip("_")
    return check


def _number(text: str, integer: bool = False) -> float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        raise ValueError(f"not a{'n integer' if integer else ' number'}: {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {text!r}")
    return int(value) if value == int(value) else value


@_checked
def _gpus(text: str) -> float:
    value = _number(text)
    if value < 0 or (value > 1 and value != int(value)):
        raise ValueError(f"bad GPU count {text!r}: use 0, a fraction below 1 such as 0.5, or a whole number")
    return value


@_checked
def _fraction(text: str) -> float:
    value = _number(text)
    if not 0 <= value <= 1:
        raise ValueError(f"a compute share is between 0 and 1, such as 0.25 (got {text})")
    return value


@_checked
def _positive_int(text: str) -> int:
    value = _number(text, integer=True)
    if value < 1:
        raise ValueError(f"must be at least 1 (got {text})")
    return int(value)


@_checked
def _non_negative_number(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise ValueError(f"must be 0 or more (got {text})")
    return value


_size = _checked(parse_size_gib)
_duration = _checked(parse_duration)


@_checked
def _priority(text: str) -> str | int:
    return int(text) if text.lstrip("-").isdigit() else text


@_checked
def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    return key, value


@_checked
def _env(text: str) -> tuple[str, str | None]:
    key, sep, value = text.partition("=")
    if not key or not (key[0].isalpha() or key[0] == "_") or not key.replace("_", "a").isalnum():
        raise ValueError(f"bad variable name in {text!r}")
    return key, (value if sep else None)


@_checked
def _array(text: str) -> str:
    parse_array(text)
    return text.strip()


@_checked
def _depends(text: str) -> list[str]:
    out: list[str] = []
    for part in text.split(","):
        kind, _, ids = part.partition(":")
        if kind not in DEPENDENCY_KINDS or not ids or not all(ids.split(":")):
            raise ValueError(f"bad dependency {part!r}: use afterok:ID, afterany:ID or afternotok:ID")
        out.extend(f"{kind}:{job_id}" for job_id in ids.split(":"))
    return out


@_checked
def _signal_spec(text: str) -> tuple[str, float | None, bool]:
    """``[B:]SIG[@LEAD]`` as Slurm writes it: (signal name, lead in seconds or None, first process only)."""
    spec = text.strip()
    batch_only = spec[:2].upper() == "B:"
    if batch_only:
        spec = spec[2:]
    name, at, lead_text = spec.partition("@")
    if not at:
        if batch_only:
            raise ValueError(f"{text!r}: B: goes with SIG@LEAD, e.g. B:USR1@60")
        return _signal(name), None, False
    try:
        lead = float(lead_text)
    except ValueError:
        raise ValueError(f"{text!r}: LEAD must be seconds, e.g. USR1@60") from None
    if not 0 <= lead <= 65535:
        raise ValueError(f"{text!r}: LEAD must be 0 to 65535 seconds")
    return _signal(name or "USR1"), lead, batch_only


def _signal(text: str) -> str:
    import signal
    name = text.strip().upper()
    if name.isdigit():
        try:
            return signal.Signals(int(name)).name[3:]
        except ValueError:
            raise ValueError(f"unknown signal number {text}") from None
    name = name[3:] if name.startswith("SIG") else name
    if not hasattr(signal, f"SIG{name}") or name in ("IGN", "DFL"):
        raise ValueError(f"unknown signal {text!r} (TERM, INT, USR1, ...)")
    return name


# The job options alone, as #GPUD and translated #SBATCH lines give them: read quickly, or by directive_parser.
JOB_OPTIONS = Options()
add_options(JOB_OPTIONS)

# The verb as data, after the functions it names: argparse's parser and the quick reader are both made from it.
VERB = Verb("submit", help="submit a job, a batch script or a file of jobs", description=DESCRIPTION,
            examples=EXAMPLES, func=run)
VERB.add_argument("script", nargs="?", help="batch script to run ('-' reads it from stdin)")
add_options(VERB)
VERB.add_argument("--from-file", metavar="FILE", help="submit every job in a JSON or JSON-lines file")
VERB.add_argument("--parsable", action="store_true", help="print only the job ids, one per line")
VERB.set_defaults(takes_command=True, command_argv=None)
