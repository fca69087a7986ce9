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

CHUNK = 64 * 1024
MAX_LINE = 1024 * 1024  # a longer line without its newline is passed on as it is, not held without bound
# Signals srun passes on to its step, as Slurm's does (the node also signals every process of a task on a stop).
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)


def run_relaying(command: list[str], env: dict[str, str], label: str = "") -> int:
    """Run ``command`` and pass its standard output and error on to ours in whole lines, each begun with
    ``label``; returns its exit status (128 + the signal when a signal ended it), 127 when it cannot run."""
    try:
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        os.write(2, f"srun: error: cannot run {command[0]}: {exc.strerror}\n".encode())
        return 127
    for number in FORWARDED:
        signal.signal(number, lambda sig, _frame: child.send_signal(sig))
    assert child.stdout is not None and child.stderr is not None
    _relay({child.stdout.fileno(): 1, child.stderr.fileno(): 2}, label.encode())
    status = child.wait()
    return 128 - status if status < 0 else status


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
