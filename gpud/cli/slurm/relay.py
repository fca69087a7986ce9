"""A step's output passed on in whole lines, as Slurm's srun passes on its tasks' output.

The tasks of a gang often share one output file. A program that writes a
line in pieces (Python unbuffered writes each word of a ``print`` on its
own) would have its words mixed with another task's mid-line. Relayed, each
task's complete lines reach the file in one write each (the file is opened
for appending, so a write lands whole), optionally labelled with the task's
rank as ``srun --label`` does.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading

CHUNK = 64 * 1024
MAX_LINE = 1024 * 1024  # a longer line without its newline is passed on as it is, not held without bound
# Signals srun passes on to its step when one of the task's own processes sends them to srun alone.
FORWARDED = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                       signal.SIGQUIT})


def run_relaying(command: list[str], env: dict[str, str], label: str = "") -> int:
    """Run ``command`` and pass its standard output and error on to ours in whole lines, each begun with
    ``label``; returns its exit status (128 + the signal when a signal ended it), 127 when it cannot run.

    A signal the task's own script sends srun (``kill -USR1 $SRUN_PID`` in a trap) is passed on to the step.
    One sent to the whole process group (the node's stop and ``--signal``, a terminal's Ctrl-C) reached the
    step already, and is not passed on again: a second stop signal may cut a job's handler short.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # taken by the forwarder below, from its start
    try:
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 preexec_fn=_unblock)
    except OSError as exc:
        os.write(2, f"srun: error: cannot run {command[0]}: {exc.strerror}\n".encode())
        return 127
    threading.Thread(target=_forward, args=(child,), daemon=True).start()
    assert child.stdout is not None and child.stderr is not None
    _relay({child.stdout.fileno(): 1, child.stderr.fileno(): 2}, label.encode())
    status = child.wait()
    return 128 - status if status < 0 else status


def _unblock() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)  # in the step, before it runs: as it would be


def _forward(child: subprocess.Popen) -> None:
    """Pass on the signals sent to srun alone by a process of its own group (not the step itself)."""
    while True:
        info = signal.sigwaitinfo(FORWARDED)
        if sent_from_own_group(info.si_pid, child.pid) and child.poll() is None:
            child.send_signal(info.si_signo)


def sent_from_own_group(sender: int, step: int) -> bool:
    """Whether a signal from process ``sender`` came from this process's own group, from a process other than
    the ``step`` (0, the kernel's, as a terminal's Ctrl-C: no; a sender gone since: no)."""
    if sender in (0, step):
        return False
    try:
        return os.getpgid(sender) == os.getpgrp()
    except OSError:
        return False


def _relay(targets: dict[int, int], label: bytes) -> None:
    """Copy each source descriptor to its target in whole lines until every source has ended."""
    held = {source: bytearray() for source in targets}
    with selectors.DefaultSelector() as selector:
        for source in targets:
            selector.register(source, selectors.EVENT_READ)
        while held:
            for key, _ in selector.select():
                source = key.fd
                try:
                    chunk = os.read(source, CHUNK)
                except InterruptedError:
                    continue
                buffer = held[source]
                if not chunk:  # the step closed it: what is left is its last line, without a newline
                    if buffer:
                        _write(targets[source], _labelled(bytes(buffer), label))
                    selector.unregister(source)
                    del held[source]
                    continue
                buffer += chunk
                end = buffer.rfind(b"\n") + 1 if len(buffer) < MAX_LINE else len(buffer)
                if end:
                    _write(targets[source], _labelled(bytes(buffer[:end]), label))
                    del buffer[:end]


def _labelled(text: bytes, label: bytes) -> bytes:
    """``text`` with ``label`` before each of its lines (the last may lack its newline)."""
    if not label:
        return text
    head, newline, rest = text.rpartition(b"\n")
    lines = b"".join(label + line + b"\n" for line in head.split(b"\n")) if newline else b""
    return lines + (label + rest if rest else b"")


def _write(target: int, data: bytes) -> None:
    """One write of the whole of ``data`` (a short write, as to a pipe, goes on with the rest)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(target, view):]
        except InterruptedError:
            continue
        except BrokenPipeError:
            return
