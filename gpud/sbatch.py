"""``#SBATCH`` lines translated into gpud's job options, so a Slurm user's batch script runs as it is.

A gpud task is one Slurm task: ``-N 2 --gres=gpu:4`` is a gang of 2 tasks
with 4 GPUs each, ``-N 2 --ntasks-per-node=4 --gres=gpu:4`` a gang of 8 with
one GPU each; the script runs once in every task.
What has no gpud meaning is not guessed at: it comes back as an ``Ignored``
entry for the caller to show.
"""

from __future__ import annotations

from gpud.directives import Directive, DirectiveError

PREFIX = "#SBATCH"

# Slurm's short options and the long option each stands for.
SHORT = {"N": "nodes", "n": "ntasks", "c": "cpus-per-task", "t": "time", "J": "job-name", "o": "output",
         "e": "error", "a": "array", "p": "partition", "A": "account", "d": "dependency", "G": "gpus",
         "D": "chdir", "H": "hold"}
FLAGS = frozenset({"hold", "no-requeue", "requeue", "exclusive"})  # the translated options that take no value
TRANSLATED = frozenset({"gres", "gpus", "gpus-per-task", "gpus-per-node", "nodes", "ntasks", "ntasks-per-node",
                        "cpus-per-task", "mem", "time", "job-name", "output", "error", "array", "partition",
                        "account", "dependency", "chdir", "qos", "open-mode", "signal"}) | FLAGS
# Slurm's options that take no value, read or not: on a command line the word after one is not its value.
SWITCHES = FLAGS | frozenset({"parsable", "wait", "W", "test-only", "quiet", "Q", "verbose", "v", "overcommit", "O",
                              "contiguous", "spread-job", "use-min-nodes", "ignore-pbs", "no-kill", "k",
                              "oversubscribe", "s", "unbuffered", "u", "pty", "label", "l", "exact", "overlap",
                              "immediate", "I", "help", "usage", "version", "V"})
GPU_TYPE_LABEL = "gpu_type"  # the node label a GPU type in --gres=gpu:TYPE:N or --gpus-per-node=TYPE:N asks for
DEPENDENCY_KINDS = ("afterok", "afterany", "afternotok")
_MEM_UNITS = ("K", "M", "G", "T")
_SLURM_PATTERNS = {"%A_%a": "%j", "%j": "%j", "%t": "%t", "%%": "%%"}


# Ignored and Translation are tuples with named fields written out: typing.NamedTuple would cost each sbatch an
# import of typing (with re), collections.namedtuple a compile().
class Ignored(tuple):
    """Part of an ``#SBATCH`` line gpud does not act on: where, what was written, and why (a code: "unsupported",
    "exclusive", "open_mode", "other_gres", "ntasks_per_node", "mem_all", "unlimited_time", "partitions",
    "dependency_kind", "dependency_any", "pattern"), with a detail for the message."""

    __slots__ = ()

    def __new__(cls, line: int, option: str, why: str, detail: str = "") -> Ignored:
        return tuple.__new__(cls, (line, option, why, detail))

    line = property(lambda self: self[0], doc="the line (0: sbatch's command line)")
    option = property(lambda self: self[1], doc="the option as written")
    why = property(lambda self: self[2], doc="why it is ignored, a code")
    detail = property(lambda self: self[3], doc="what the message names")

    def __repr__(self) -> str:
        return f"Ignored(line={self[0]!r}, option={self[1]!r}, why={self[2]!r}, detail={self[3]!r})"


class Translation(tuple):
    """gpud's options (as ``#GPUD`` directives, keeping each one's line) and what was left out."""

    __slots__ = ()

    def __new__(cls, directives: list[Directive], ignored: list[Ignored]) -> Translation:
        return tuple.__new__(cls, (directives, ignored))

    directives = property(lambda self: self[0], doc="gpud's options, one directive each")
    ignored = property(lambda self: self[1], doc="what gpud does not act on")


def split_options(directive: Directive) -> list[tuple[str, str | None, str]]:
    """One ``#SBATCH`` line's options as (long name, value or None, text as written).

    Accepts ``--opt=value``, ``--opt value``, ``-X value`` and ``-Xvalue``. An
    option gpud does not translate takes the next word as its value unless
    that word starts with ``-``, or (on a command line, given as line 0)
    Slurm knows the option as one without a value. Raises DirectiveError
    for a stray word.
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
        if given is None and name not in FLAGS and i < len(words) and not words[i].startswith("-") \
                and not (directive.line == 0 and name in SWITCHES):
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

    tasks, per_node = _tasks(seen, ignored, emit)
    _gpus(seen, tasks, per_node, ignored, emit)
    simple = {"cpus-per-task": "--cpus", "job-name": "--name", "array": "--array", "account": "--project",
              "chdir": "--workdir", "qos": "--qos", "signal": "--signal"}
    for name, option in simple.items():
        if name in seen:
            line, value, _ = seen[name]
            emit(line, option, value)
    for flag in ("hold", "no-requeue"):
        if flag in seen:
            emit(seen[flag][0], f"--{flag}")
    if "mem" in seen:
        _mem(seen["mem"], per_node, ignored, emit)
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
        emit(line, "--partition", first)
    if "exclusive" in seen:
        ignored.append(Ignored(seen["exclusive"][0], seen["exclusive"][2], "exclusive"))
    if "open-mode" in seen and seen["open-mode"][1] != "append":
        ignored.append(Ignored(seen["open-mode"][0], seen["open-mode"][2], "open_mode"))
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


def _tasks(seen, ignored, emit) -> tuple[int, int]:
    """The gang's size and its tasks per node: one gpud task per Slurm task.

    ``-N 2 --ntasks-per-node=4`` (or ``-N 2 -n 8``) is a gang of 8, each
    task with a quarter of a node's GPUs and memory; ``-N 2-4`` is an elastic
    gang. Tasks that would need part of a GPU above one (3 GPUs a node for 2
    tasks) stay one task per node, with a warning.
    """
    per_node = _per_node(seen, ignored)
    if "nodes" in seen:
        line, value, written = seen["nodes"]
        low, _, high = value.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise DirectiveError(f"line {line}: {PREFIX} {written}: nodes must be a count such as 2 or 2-4")
        tasks = int(high or low) * per_node
        emit(line, "--tasks", str(tasks))
        if high and int(low) * per_node < tasks:
            emit(line, "--min-tasks", str(int(low) * per_node))
        return tasks, per_node
    if "ntasks" in seen:
        line, value, written = seen["ntasks"]
        if not value.isdigit():
            raise DirectiveError(f"line {line}: {PREFIX} {written}: ntasks must be a count such as 4")
        emit(line, "--tasks", value)
        return int(value), per_node if per_node > 1 else 1
    if per_node > 1:
        line, _, _ = seen["ntasks-per-node"]
        emit(line, "--tasks", str(per_node))
    return per_node, per_node


def _per_node(seen, ignored) -> int:
    """Tasks per node: --ntasks-per-node, or --ntasks over --nodes; 1 when the node's GPUs cannot be split so."""
    entry = seen.get("ntasks-per-node")
    count = 1
    if entry is not None:
        if not entry[1].isdigit() or int(entry[1]) < 1:
            raise DirectiveError(f"line {entry[0]}: {PREFIX} {entry[2]}: ntasks-per-node must be a count such as 4")
        count = int(entry[1])
    elif "ntasks" in seen and "nodes" in seen and seen["ntasks"][1].isdigit():
        nodes = seen["nodes"][1].partition("-")[2] or seen["nodes"][1].partition("-")[0]
        ntasks = int(seen["ntasks"][1])
        entry = seen["ntasks"]
        if nodes.isdigit() and ntasks % int(nodes) == 0:
            count = ntasks // int(nodes)
        elif nodes.isdigit():
            ignored.append(Ignored(entry[0], entry[2], "ntasks_per_node", nodes))
            return 1
    if count == 1:
        return 1
    gpus = _node_gpus(seen)
    if gpus is not None and gpus % count and gpus / count > 1:
        ignored.append(Ignored(entry[0], entry[2], "ntasks_per_node", f"{gpus:g} GPUs"))
        return 1
    return count


def _node_gpus(seen) -> float | None:
    """The GPUs a node's share asks for (--gres=gpu:N or --gpus-per-node), or None; unreadable counts are left
    for _gpus to refuse."""
    for name in ("gpus-per-node", "gres"):
        if name not in seen:
            continue
        for item in seen[name][1].split(","):
            kind, _, rest = item.partition(":") if name == "gres" else ("gpu", "", item)
            if kind == "gpu":
                try:
                    return float((rest or "1").rpartition(":")[2])
                except ValueError:
                    return None
    return None


def _gpus(seen, tasks: int, per_node: int, ignored, emit) -> None:
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
                count = _typed_count(rest or "1", line, written, emit)
            if count is None:
                continue
        else:
            count = _typed_count(value, line, written, emit)
        if name == "gpus":
            if count % tasks:
                raise DirectiveError(f"line {line}: {PREFIX} {written}: {count:g} GPUs do not divide among "
                                     f"{tasks} tasks; write --gres=gpu:N for N GPUs on each node")
            count //= tasks
        elif name != "gpus-per-task":
            count /= per_node
        emit(line, "--gpus", f"{count:g}")
        return


def _typed_count(value: str, line: int, written: str, emit) -> float:
    """The count in ``N`` or ``TYPE:N``; a type asks for nodes labelled ``gpu_type=TYPE``."""
    kind, _, count = value.rpartition(":")
    if kind:
        emit(line, "--constraint", f"{GPU_TYPE_LABEL}={kind}")
    try:
        number = float(count)
    except ValueError:
        raise DirectiveError(f"line {line}: {PREFIX} {written}: {count!r} is not a GPU count") from None
    if number < 0 or not number.is_integer():
        raise DirectiveError(f"line {line}: {PREFIX} {written}: {count!r} is not a GPU count")
    return number


def _mem(entry, per_node: int, ignored, emit) -> None:
    """Slurm reads a bare ``--mem`` number as megabytes; gpud as GiB, so the unit is written out.

    ``--mem`` is per node: each of a node's ``per_node`` tasks gets its share.
    """
    line, value, written = entry
    memory = split_memory(value)
    if memory is None:
        raise DirectiveError(f"line {line}: {PREFIX} {written}: memory is a number with K, M, G or T (16G, 4000)")
    number, unit = memory
    if float(number) == 0:
        ignored.append(Ignored(line, written, "mem_all"))
        return
    amount = number if per_node == 1 else f"{float(number) / per_node:g}"
    emit(line, "--mem", f"{amount}{unit or 'M'}")


def split_memory(value: str) -> tuple[str, str] | None:
    """Slurm's ``--mem`` value (``16G``, ``4000``, ``1.5TB``, any case) as its number and its unit letter (upper
    case, "" for none); None when it is not one."""
    body = value.strip()
    body = body[:-1] if body[-1:] in ("B", "b") else body
    unit = body[-1:].upper()
    unit = unit if unit in _MEM_UNITS else ""
    number = body[:len(body) - len(unit)]
    whole, dot, fraction = number.partition(".")
    if not whole.isdecimal() or (dot and not fraction.isdecimal()):
        return None
    return number, unit


def _dependency(entry, ignored, emit) -> None:
    line, value, written = entry
    if "?" in value:
        ignored.append(Ignored(line, written, "dependency_any"))
    kept = []
    for part in value.replace("?", ",").split(","):
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
