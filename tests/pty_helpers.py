"""gpuctl on a real pseudo-terminal, as a person at a terminal runs it: type, resize, read the screen's bytes."""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time

TIMEOUT_S = 30.0


class PtyProcess:
    """``python -m gpud.cli.gpuctl ARGS`` with a new pseudo-terminal as its controlling terminal."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: str, rows: int = 24, cols: int = 80) -> None:
        argv = [sys.executable, "-m", "gpud.cli.gpuctl", *args]
        pid, fd = pty.fork()
        if pid == 0:  # the child: only exec, nothing that could take a lock another thread held
            try:
                os.chdir(cwd)
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
                os.execve(sys.executable, argv, env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.seen = b""          # everything read so far
        self.pos = 0             # where the next expect starts looking
        self.status: int | None = None

    def read_some(self, timeout: float) -> bool:
        """Read what the terminal shows within ``timeout``; False once it is closed."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError as exc:
            if exc.errno == errno.EIO:
                return False
            raise
        if not data:
            return False
        self.seen += data
        return True

    def expect(self, pattern: str | bytes, timeout: float = TIMEOUT_S) -> re.Match:
        """Wait until the output since the last match holds ``pattern`` (a regex); fail with the output if not."""
        regex = re.compile(pattern.encode() if isinstance(pattern, str) else pattern)
        deadline = time.monotonic() + timeout
        while True:
            match = regex.search(self.seen, self.pos)
            if match:
                self.pos = match.end()
                return match
            left = deadline - time.monotonic()
            if left <= 0 or not self.read_some(min(left, 0.2)):
                match = regex.search(self.seen, self.pos)
                if match:
                    self.pos = match.end()
                    return match
                raise AssertionError(f"{regex.pattern!r} did not appear; the terminal showed:\n"
                                     f"{self.seen[self.pos:].decode(errors='replace')}")

    def send(self, data: str | bytes) -> None:
        """Type ``data``."""
        os.write(self.fd, data.encode() if isinstance(data, str) else data)

    def resize(self, rows: int, cols: int) -> None:
        """Change the window size, as a terminal emulator does (the foreground process gets SIGWINCH)."""
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def wait(self, timeout: float = TIMEOUT_S) -> int:
        """Wait for gpuctl to exit, reading its output meanwhile; its exit status (or -signal)."""
        deadline = time.monotonic() + timeout
        while self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"gpuctl did not exit; the terminal showed:\n"
                                     f"{self.seen.decode(errors='replace')[-3000:]}")
            if not self.read_some(0.1):
                time.sleep(0.05)
        while self.read_some(0.05):
            if not select.select([self.fd], [], [], 0)[0]:
                break
        return self.status

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal gpuctl (as a lost connection: the client dies, the terminal does not)."""
        if self.status is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """Kill gpuctl if it still runs, reap it and close the terminal."""
        if self.status is None:
            self.kill()
            try:
                _, status = os.waitpid(self.pid, 0)
                self.status = os.waitstatus_to_exitcode(status)
            except ChildProcessError:
                pass
        try:
            os.close(self.fd)
        except OSError:
            pass

    @property
    def text(self) -> str:
        """Everything the terminal has shown."""
        return self.seen.decode(errors="replace")
