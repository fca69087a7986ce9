"""The client end of a job's terminal and of a port forward: a WebSocket to the controller, this terminal in raw mode.

Keystrokes go to the job's terminal as they are typed (so Ctrl-C, Ctrl-Z
and Ctrl-D act there), window size changes follow, and output is written
here as it comes. aiohttp is imported only by these verbs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from typing import Any

READ_CHUNK = 64 * 1024
EOF_KEY = b"\x04"  # Ctrl-D: end of input at the start of a line of a terminal in canonical mode


def ws_url(base: str, path: str) -> str:
    """The WebSocket URL of an API path on the controller at ``base`` (http → ws, https → wss)."""
    scheme, _, rest = base.partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/api/v1/{path.lstrip('/')}"


DEFAULT_ROWS, DEFAULT_COLS = 24, 80  # what a terminal that reports no size (0x0: `script`, a bare pty) gets


def window_size(fd: int) -> tuple[int, int] | None:
    """The terminal's rows and columns (24x80 for a size it does not know), or None when ``fd`` is not one."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    return size.lines or DEFAULT_ROWS, size.columns or DEFAULT_COLS


def terminal_query(params: list[tuple[str, str]], stdin_fd: int | None = 0) -> list[tuple[str, str]]:
    """The query of a terminal request: ``params``, then this terminal's size and TERM when known."""
    size = window_size(stdin_fd) if stdin_fd is not None else None
    query = list(params)
    if size is not None:
        query += [("rows", str(size[0])), ("cols", str(size[1]))]
    if os.environ.get("TERM"):
        query.append(("term", os.environ["TERM"]))
    return query


async def run_terminal(base: str, token: str | None, path: str, params: list[tuple[str, str]],
                       stdin_fd: int | None = 0, stdout_fd: int = 1, tls: Any = None) -> dict | None:
    """Relay this terminal to the job's until it ends; returns the controller's last message.

    ``tls``: the ssl context a wss:// connection checks the controller's certificate with (Client.tls_context).

    With ``stdin_fd`` None nothing is typed: the output is only written to ``stdout_fd``.

    That message is ``{"type": "exit", "code", "signal"}``, ``{"type":
    "ended", "reason"}`` or ``{"type": "error", "error"}``; None means the
    connection was lost (the job's terminal keeps running for a while).
    """
    import aiohttp
    query = terminal_query(params, stdin_fd)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    loop = asyncio.get_running_loop()
    outgoing: asyncio.Queue = asyncio.Queue()
    last: dict | None = None
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, path), params=query, headers=headers, heartbeat=20.0,
                                   max_msg_size=1 << 22, ssl=True if tls is None else tls) as ws:
            with _raw(stdin_fd) as is_tty:
                reading = stdin_fd is not None
                in_fd = -1 if stdin_fd is None else stdin_fd  # read only while ``reading``
                def read_input() -> None:
                    try:
                        data = os.read(in_fd, READ_CHUNK)
                    except OSError:
                        data = b""
                    if not data:
                        loop.remove_reader(in_fd)
                        outgoing.put_nowait(EOF_KEY)  # a pipe that ends: end of input on the job's terminal too
                        return
                    outgoing.put_nowait(data)

                def resized() -> None:
                    now = window_size(in_fd)
                    if now is not None:
                        outgoing.put_nowait({"type": "resize", "rows": now[0], "cols": now[1]})

                if reading:
                    try:
                        loop.add_reader(in_fd, read_input)
                    except PermissionError:  # a regular file or /dev/null: no polling, it is all there
                        reading = False
                        outgoing.put_nowait(_read_file(in_fd) + EOF_KEY)
                if is_tty:
                    loop.add_signal_handler(signal.SIGWINCH, resized)
                sender = asyncio.create_task(_send(ws, outgoing))
                try:
                    async for frame in ws:
                        if frame.type == aiohttp.WSMsgType.BINARY:
                            _write_all(stdout_fd, frame.data)
                        elif frame.type == aiohttp.WSMsgType.TEXT:
                            message = _json(frame.data)
                            if message.get("type") in ("exit", "ended", "error"):
                                last = message
                finally:
                    sender.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await sender
                    if reading:
                        loop.remove_reader(in_fd)
                    if is_tty:
                        loop.remove_signal_handler(signal.SIGWINCH)
    return last


async def _send(ws: Any, outgoing: asyncio.Queue) -> None:
    while True:
        item = await outgoing.get()
        if isinstance(item, dict):
            await ws.send_str(json.dumps(item))
        else:
            await ws.send_bytes(item)


@contextlib.contextmanager
def _raw(fd: int | None):
    """This terminal in raw mode for as long as the block runs (nothing changes when ``fd`` is not a TTY)."""
    if fd is None or not os.isatty(fd):
        yield False
        return
    import termios
    import tty
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _read_file(fd: int, limit: int = 1 << 20) -> bytes:
    chunks, size = [], 0
    while size < limit:
        chunk = os.read(fd, READ_CHUNK)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            import select
            select.select([], [fd], [], 1.0)


def _json(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


async def forward_port(base: str, token: str | None, job: str, port: int, local_port: int,
                       ready: Any = None, tls: Any = None) -> None:
    """Listen on 127.0.0.1:``local_port`` and carry each connection to ``port`` of the job's node, until cancelled.

    ``ready(listening_port)`` is called once listening; a connection the
    node refuses is closed with the reason on stderr.
    """
    import aiohttp
    from gpud.client import job_path
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = ws_url(base, job_path(job, "forward"))
    async with aiohttp.ClientSession() as http:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                async with http.ws_connect(url, params={"port": str(port)}, headers=headers,
                                           max_msg_size=1 << 22, ssl=True if tls is None else tls) as ws:
                    async def upstream() -> None:
                        while True:
                            data = await reader.read(READ_CHUNK)
                            if not data:
                                break
                            await ws.send_bytes(data)
                        await ws.close()
                    pushing = asyncio.create_task(upstream())
                    try:
                        async for frame in ws:
                            if frame.type == aiohttp.WSMsgType.BINARY:
                                writer.write(frame.data)
                                await writer.drain()
                            elif frame.type == aiohttp.WSMsgType.TEXT:
                                message = _json(frame.data)
                                if message.get("type") == "error":
                                    print(f"gpuctl forward: {message.get('error')}", file=sys.stderr)
                    finally:
                        pushing.cancel()
                        await asyncio.gather(pushing, return_exceptions=True)
            except (aiohttp.ClientError, OSError) as exc:
                print(f"gpuctl forward: connection to the controller failed: {exc}", file=sys.stderr)
            finally:
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", local_port)
        async with server:
            if ready is not None:
                ready(server.sockets[0].getsockname()[1])
            await server.serve_forever()
