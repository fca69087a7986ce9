"""The systemd notification protocol (sd_notify): tell a Type=notify unit's manager the daemon is ready or stopping."""

from __future__ import annotations

import os
import socket

NOTIFY_ENV = "NOTIFY_SOCKET"


def notify(state: str, env: dict[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``) to the socket named by $NOTIFY_SOCKET; False when there is none.

    A name starting with ``@`` is in the abstract namespace. Errors are
    swallowed: a daemon must keep running when its manager cannot be told.
    """
    address = (os.environ if env is None else env).get(NOTIFY_ENV, "")
    if not address or address[0] not in "/@":
        return False
    if address[0] == "@":
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError:
        return False
    return True


def ready(status: str = "") -> bool:
    """Tell the manager the daemon serves (``READY=1``), with an optional status line."""
    return notify("READY=1" + (f"\nSTATUS={status}" if status else ""))


def stopping() -> bool:
    """Tell the manager the daemon is shutting down (``STOPPING=1``)."""
    return notify("STOPPING=1")
