"""The text channel between a node daemon and the controller: a WebSocket, or memory when both share a process.

Both ends speak the same JSON text messages (docs/api.md) either way. A
channel end offers ``send_str(text)``, ``close()`` and ``closed``, as an
aiohttp WebSocket does; its incoming messages are an async iterator of
texts. ``gpud up`` runs the controller and the node in one process and
joins them with :func:`local_pair`, which skips the loopback socket, the
HTTP upgrade and the WebSocket framing a message would otherwise cross.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from aiohttp import WSMsgType


def ws_texts(ws) -> AsyncIterator[str]:
    """The text messages of an aiohttp WebSocket (client or server side) until it closes or fails."""
    return WsTexts(ws)


class WsTexts:
    """The text messages of an aiohttp WebSocket, as :func:`ws_texts` gives them.

    An iterator rather than an async generator: a connection waiting for its
    next message (a controller holds thousands, each waiting seconds) then
    keeps no generator frame, no ``asend`` object and no last frame alive,
    objects that the garbage collector would otherwise walk in every pass
    while they wait.
    """

    __slots__ = ("ws",)

    def __init__(self, ws) -> None:
        self.ws = ws

    def __aiter__(self) -> WsTexts:
        return self

    async def __anext__(self) -> str:
        while True:
            frame = await self.ws.receive()
            kind = frame.type
            if kind == WSMsgType.TEXT:
                return frame.data
            if kind in _ENDS:
                raise StopAsyncIteration


_ENDS = frozenset({WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR})


class LocalEnd:
    """One end of an in-memory channel; closing either end closes both."""

    def __init__(self) -> None:
        self.peer: LocalEnd = self
        self.closed = False
        self._inbox: asyncio.Queue[str | None] = asyncio.Queue()

    async def send_str(self, text: str) -> None:
        """Deliver ``text`` to the other end; ConnectionResetError once the channel is closed."""
        if self.closed:
            raise ConnectionResetError("the channel is closed")
        self.peer._inbox.put_nowait(text)

    async def close(self) -> None:
        """Close both ends: each end's iteration stops after the texts already delivered to it."""
        for end in (self, self.peer):
            if not end.closed:
                end.closed = True
                end._inbox.put_nowait(None)

    async def texts(self) -> AsyncIterator[str]:
        """The texts the other end sent, in order, until the channel is closed."""
        while True:
            text = await self._inbox.get()
            if text is None:
                return
            yield text


def local_pair() -> tuple[LocalEnd, LocalEnd]:
    """Two joined ends: what one sends, the other receives."""
    first, second = LocalEnd(), LocalEnd()
    first.peer, second.peer = second, first
    return first, second
