"""The gate a task starts at on a hybrid cgroup host: it runs the task's program only once the task is in all its groups.

On a hybrid host the supervisor forks a task inside its v2 group alone; its
cgroup worker moves it into its v1 groups (memory, cpu, cpuset, pids,
devices) just after, off the supervisor's loop, since each move waits for an
RCU grace period. Until then the task would run without its limits, and in
cgroup v1 what it allocated stays charged to the group it came from and a
device it opened stays open. So the task's first program is this gate,
``/bin/sh -c SCRIPT PROGRAM ARGS...``: it reads a line from its standard
input, a pipe whose other end the worker holds, then makes its standard
input /dev/null again and execs the task's program (same process, same
pid). The worker writes the line once the moves are done; when a move
fails it closes the pipe without a line, and the gate exits
:data:`REFUSED_EXIT` without running anything. A gate whose supervisor dies
sees the pipe close too: nothing ever runs outside its groups.

A shell cannot report a failed exec the way the supervisor's own spawn
does (through a close-on-exec pipe), so :func:`check_runnable` looks the
program up first, as the task's user, the way exec would.
"""

from __future__ import annotations

import errno
import os
import stat

SHELL = "/bin/sh"
REFUSED_EXIT = 125  # the gate was closed without a line: the task's program never ran
# dash sets PWD in what it exports; a task whose environment has none gets none, as without the gate.
_SCRIPT = 'read -r _ || exit {refused}; exec <>/dev/null; exec "$0" "$@"'.format(refused=REFUSED_EXIT)


def wrap(argv: list[str], env: dict[str, str]) -> list[str]:
    """The command line that runs ``argv`` behind the gate, with ``env`` as its environment unchanged."""
    script = _SCRIPT if "PWD" in env else f"unset PWD; {_SCRIPT}"
    return [SHELL, "-c", script, *argv]


def open_pipe() -> tuple[int, int]:
    """A new gate: the end the task reads (its standard input) and the end the worker opens it with."""
    return os.pipe2(os.O_CLOEXEC)


def release(fd: int) -> None:
    """Let the task behind the gate ``fd`` run its program (one that is gone already is fine); closes ``fd``."""
    try:
        os.write(fd, b"\n")
    except BrokenPipeError:
        pass  # it was stopped at the gate
    finally:
        os.close(fd)


def refuse(fd: int) -> None:
    """Make the task behind the gate ``fd`` exit without running its program; closes ``fd``."""
    os.close(fd)


def check_runnable(program: str, path: str, cwd: str) -> None:
    """Raise OSError (ENOENT, EACCES) as exec would for ``program``, searched in ``path`` unless it holds a slash.

    Call it as the task's user: the permission checks are that user's.
    Relative names are taken from ``cwd``, where the task starts.
    """
    candidates = [program] if "/" in program else [os.path.join(d or ".", program) for d in path.split(os.pathsep)]
    refused = False
    for candidate in candidates:
        full = os.path.join(cwd, candidate)
        try:
            info = os.stat(full)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and os.access(full, os.X_OK, effective_ids=True):
            return
        refused = True
    code = errno.EACCES if refused else errno.ENOENT
    raise OSError(code, os.strerror(code), program)
