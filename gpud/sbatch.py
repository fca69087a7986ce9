"""``#SBATCH`` lines translated into gpud's job options, so a Slurm user's batch script runs as it is.

A gpud task is one Slurm node's share of the job: ``-N 2 --gres=gpu:4`` is a
gang of 2 tasks with 4 GPUs each, and the script runs once in every task.
What has no gpud meaning is not guessed at: it comes back as an ``Ignored``
entry for the caller to show.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpud.directives import Directive, DirectiveError

PREFIX = "#SBATCH"

# Slurm's short options and the long option each stands for.
SHORT = {"N": "nodes", "n": "ntasks", "c": "cpus-per-task", "t": "time", "J": "job-name", "o": "output",
         "e": "error", "a": "array", "p": "partition", "A": "account", "d": "dependency", "G": "gpus",
         "D": "chdir", "H": "hold"}
FLAGS = frozenset({"hold", "no-requeue", "requeue"})  # the translated options that take no value
TRANSLATED = frozenset({"gres", "gpus", "gpus-per-task", "gpus-per-node", "nodes", "ntasks", "ntasks-per-node",
                        "cpus-per-task", "mem", "time", "job-name", "output", "error", "array", "partition",
                        "account", "dependency", "chdir", "signal"}) | FLAGS
DEPENDENCY_KINDS = ("afterok", "afterany", "afternotok")
_MEM = r"(?i)^(\d+(?:\.\d+)?)([KMGT]?)B?$"
_SLURM_PATTERNS = {"%A_%a": "%j", "%j": "%j", "%t": "%t", "%%": "%%"}


@dataclass(frozen=True, slots=True)
class Ignored:
    """Part of an ``#SBATCH`` line gpud does not act on: where, what was written, and why (a code)."""

    line: int
    option: str
    why: str  # "unsupported", "gpu_type", "other_gres", "ntasks_per_node", "mem_all", "unlimited_time",
    # "partitions", "dependency_kind", "dependency_any", "pattern"
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Translation:
    """gpud's options (as ``#GPUD`` directives, keeping each one's line) and what was left out."""

    directives: list[Directive]
    ignored: list[Ignored]


def split_options(directive: Directive) -> list[tuple[str, str | None, str]]:
    """One ``#SBATCH`` line's options as (long name, value or None, text as written).

    Accepts ``--opt=value``, ``--opt value``, ``-X value`` and ``-Xvalue``. An
    option gpud does not translate takes the next word as its value unless
    that word starts with ``-``. Raises DirectiveError for a stray word.
    """
    words = list(directive.args)
    out = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word.startswith("--") and len(word) > 2:
            name, sep, value = word[2:].partition("=")
            given: str | None = value if sep else None
        elif word.startswith("-") and len(word) > 1:
            short, rest = word[1], word[2:]
            name = SHORT.get(short, short)
            given = rest.removeprefix("=") if rest else None
        else:
            raise DirectiveError(f"line {directive.line}: {PREFIX} {word!r} is not an option")
        if given is None and name not in FLAGS and i < len(words) and not words[i].startswith("-"):
            given = words[i]
            i += 1
        written = word if given is None or given in word else f"{word} {given}"
        out.append((name, given, written))
    return out


def translate(directives: list[Directive], job_name: str | None = None, user: str | None = None) -> Translation:
    """gpud's options for a script's ``#SBATCH`` lines, later lines winning as sbatch reads them.

    ``job_name`` and ``user`` fill ``%x`` and ``%u`` in ``-o``/``-e``. Raises
    DirectiveError (naming the line) when a translated option's value cannot
    be read, such as ``--gpus=3`` over 2 nodes.
    """
    seen: dict[str, tuple[int, str, str]] = {}  # long name -> (line, value, as written)
    ignored: list[Ignored] = []
    for directive in directives:
        for name, value, written in split_options(directive):
            if name not in TRANSLATED:
                ignored.append(Ignored(directive.line, written, "unsupported"))
            elif name not in FLAGS and not value:
                raise DirectiveError(f"line {directive.line}: {PREFIX} {written} needs a value")
            else:
                seen[name] = (directive.line, value or "", written)
    out: list[Directive] = []

    def emit(line: int, *args: str) -> None:
        out.append(Directive(line, tuple(args)))

    tasks = _tasks(seen, ignored, emit)
    _gpus(seen, tasks, ignored, emit)
    simple = {"cpus-per-task": "--cpus", "job-name": "--name", "array": "--array", "account": "--project",
              "chdir": "--workdir", "signal": "--signal"}
    for name, option in simple.items():
        if name in seen:
            line, value, _ = seen[name]
            emit(line, option, value)
    for flag in ("hold", "no-requeue"):
        if flag in seen:
            emit(seen[flag][0], f"--{flag}")
    if "mem" in seen:
        _mem(seen["mem"], ignored, emit)
    if "time" in seen:
        line, value, written = seen["time"]
        if value.lower() in ("unlimited", "infinite"):
            ignored.append(Ignored(line, written, "unlimited_time"))
        else:
            emit(line, "--time", value)
    if "partition" in seen:
        line, value, written = seen["partition"]
        first = value.split(",")[0]
        if first != value:
            ignored.append(Ignored(line, written, "partitions", first))
        emit(line, "--pool", first)
    if "dependency" in seen:
        _dependency(seen["dependency"], ignored, emit)
    title = seen["job-name"][1] if "job-name" in seen else job_name
    for stream in ("output", "error"):
        if stream in seen:
            line, value, written = seen[stream]
            pattern, unknown = slurm_pattern(value, title, user)
            if unknown:
                ignored.append(Ignored(line, written, "pattern", " ".join(unknown)))
            emit(line, f"--{stream}", pattern)
    return Translation(sorted(out, key=lambda d: d.line), sorted(ignored, key=lambda i: i.line))


def _tasks(seen, ignored, emit) -> int:
    """One gpud task per Slurm node; ``-N 2-4`` is an elastic gang of 2 to 4 tasks."""
    if "nodes" in seen:
        line, value, written = seen["nodes"]
        low, _, high = value.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise DirectiveError(f"line {line}: {PREFIX} {written}: nodes must be a count such as 2 or 2-4")
        tasks = int(high or low)
        emit(line, "--tasks", str(tasks))
        if high and int(low) < tasks:
            emit(line, "--min-tasks", low)
        per_node = seen.get("ntasks-per-node")
        if per_node and per_node[1] != "1":
            ignored.append(Ignored(per_node[0], per_node[2], "ntasks_per_node", str(tasks)))
        elif "ntasks" in seen and seen["ntasks"][1] != str(tasks):
            ignored.append(Ignored(seen["ntasks"][0], seen["ntasks"][2], "ntasks_per_node", str(tasks)))
        return tasks
    if "ntasks" in seen:
        line, value, written = seen["ntasks"]
        if not value.isdigit():
            raise DirectiveError(f"line {line}: {PREFIX} {written}: ntasks must be a count such as 4")
        emit(line, "--tasks", value)
        return int(value)
    if "ntasks-per-node" in seen and seen["ntasks-per-node"][1] != "1":
        ignored.append(Ignored(seen["ntasks-per-node"][0], seen["ntasks-per-node"][2], "ntasks_per_node", "1"))
    return 1


def _gpus(seen, tasks: int, ignored, emit) -> None:
    """GPUs per task from --gres=gpu:N (per node), --gpus-per-node/-task, or --gpus (the job's total)."""
    for name in ("gpus-per-task", "gpus-per-node", "gres", "gpus"):
        if name not in seen:
            continue
        line, value, written = seen[name]
        if name == "gres":
            count = None
            for item in value.split(","):
                kind, _, rest = item.partition(":")
                if kind != "gpu":
                    ignored.append(Ignored(line, written, "other_gres", item))
                    continue
                count = _typed_count(rest or "1", line, written, ignored)
            if count is None:
                continue
        else:
            count = _typed_count(value, line, written, ignored)
        if name == "gpus":
            if count % tasks:
                raise DirectiveError(f"line {line}: {PREFIX} {written}: {count:g} GPUs do not divide among "
                                     f"{tasks} tasks; write --gres=gpu:N for N GPUs on each node")
            count //= tasks
        emit(line, "--gpus", f"{count:g}")
        return


def _typed_count(value: str, line: int, written: str, ignored) -> float:
    """The count in ``N`` or ``TYPE:N``; a GPU type is reported, not required."""
    kind, _, count = value.rpartition(":")
    if kind:
        ignored.append(Ignored(line, written, "gpu_type", kind))
    try:
        number = float(count)
    except ValueError:
        raise DirectiveError(f"line {line}: {PREFIX} {written}: {count!r} is not a GPU count") from None
    if number < 0 or not number.is_integer():
        raise DirectiveError(f"line {line}: {PREFIX} {written}: {count!r} is not a GPU count")
    return number


def _mem(entry, ignored, emit) -> None:
    """Slurm reads a bare ``--mem`` number as megabytes; gpud as GiB, so the unit is written out."""
    line, value, written = entry
    match = re.match(_MEM, value.strip())
    if match is None:
        raise DirectiveError(f"line {line}: {PREFIX} {written}: memory is a number with K, M, G or T (16G, 4000)")
    if float(match[1]) == 0:
        ignored.append(Ignored(line, written, "mem_all"))
        return
    emit(line, "--mem", f"{match[1]}{(match[2] or 'M').upper()}")


def _dependency(entry, ignored, emit) -> None:
    line, value, written = entry
    if "?" in value:
        ignored.append(Ignored(line, written, "dependency_any"))
    kept = []
    for part in re.split(r"[,?]", value):
        kind, _, ids = part.partition(":")
        if kind in DEPENDENCY_KINDS and ids:
            kept.append(f"{kind}:{':'.join(i.split('+')[0] for i in ids.split(':'))}")
        elif part:
            ignored.append(Ignored(line, written, "dependency_kind", part))
    if kept:
        emit(line, "--depends", ",".join(kept))


def slurm_pattern(value: str, job_name: str | None, user: str | None) -> tuple[str, list[str]]:
    """An sbatch ``-o``/``-e`` file pattern in gpud's terms, and the %-codes it has no value for.

    ``%j`` (and ``%A_%a``, an array element's id) is the job id, ``%t`` the
    task, ``%x`` the job name, ``%u`` the user; other codes stay as written.
    """
    out, unknown, i = [], [], 0
    while i < len(value):
        if value.startswith("%A_%a", i):
            out.append("%j")
            i += 5
            continue
        code = value[i:i + 2]
        if value[i] != "%" or len(code) < 2:
            out.append(value[i])
            i += 1
            continue
        if code in _SLURM_PATTERNS:
            out.append(_SLURM_PATTERNS[code])
        elif code == "%x" and job_name:
            out.append(job_name.replace("%", "%%"))
        elif code == "%u" and user:
            out.append(user.replace("%", "%%"))
        else:
            out.append("%" + code)  # kept literally: gpud writes '%%' as one percent sign
            unknown.append(code)
        i += 2
    return "".join(out), unknown
