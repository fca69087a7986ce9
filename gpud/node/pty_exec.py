"""Start one process on a terminal inside a running task: its controlling TTY, cgroups, user, directory and environment.

The node daemon runs ``python -m gpud.node.pty_exec ORDER`` with the
terminal's slave end as stdin, stdout and stderr, in a new session; ORDER is
JSON: ``argv`` (or ``shell`` to run as a login shell), ``env``, ``cwd``,
``uid``, ``gid``, ``user`` and ``cgroup_procs`` (the ``cgroup.procs`` files of
the task's cgroups, which this process joins before giving up root).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import termios

EXIT_CANNOT_RUN = 127


def join_cgroups(paths: list[str]) -> None:
    """Move this process into each cgroup (its ``cgroup.procs`` path); OSError naming the first that cannot be
    joined, since the task's limits would then not hold for what runs here."""
    for path in paths:
        try:
            with open(path, "w") as f:
                f.write("0")
        except OSError as exc:
            raise OSError(exc.errno, f"cannot join the task's cgroup {os.path.dirname(path)}: "
                                     f"{exc.strerror or exc}") from None


def become(uid: int, gid: int, user: str) -> None:
    """Take on the task's user and groups (only when this process runs as someone else)."""
    if os.getuid() == uid and os.getgid() == gid:
        return
    try:
        groups = os.getgrouplist(user, gid)
    except (KeyError, OSError):
        groups = [gid]
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)


def main(argv: list[str] | None = None) -> int:
    """Set the process up as ORDER says and exec its command; 127 with a message when that cannot be done."""
    args = sys.argv[1:] if argv is None else argv
    order = json.loads(args[0])
    try:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    except OSError:
        pass  # still usable, without job control
    try:
        join_cgroups(order.get("cgroup_procs") or [])
    except OSError as exc:
        print(f"gpud: {exc.strerror}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    try:
        become(int(order["uid"]), int(order["gid"]), str(order.get("user") or ""))
    except OSError as exc:
        print(f"gpud: cannot become user {order.get('user')}: {exc.strerror}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    env = {str(k): str(v) for k, v in (order.get("env") or {}).items()}
    for directory in (order.get("cwd"), env.get("HOME"), "/"):
        try:
            if directory:
                os.chdir(directory)
                break
        except OSError:
            continue
    shell = order.get("shell")
    try:
        if shell:
            os.execve(shell, ["-" + os.path.basename(shell)], env)
        command = [str(a) for a in order["argv"]]
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"gpud: cannot run {shell or order['argv'][0]}: {exc.strerror}", file=sys.stderr)
    return EXIT_CANNOT_RUN


if __name__ == "__main__":
    sys.exit(main())
