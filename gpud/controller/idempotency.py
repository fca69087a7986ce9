"""Idempotent submits: a request sent again with the same ``Idempotency-Key`` gets the first answer, never a second job.

The answer is stored in the same transaction as the jobs it names, so a
controller killed at any moment either made the jobs and knows the answer,
or made neither. Keys belong to the user who sent them and are kept
ANSWERS_KEPT_S; a key sent again with another request is refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from aiohttp import web

from gpud import jsontext
from gpud.controller.persist import Persister

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
MAX_KEY = 255
ANSWERS_KEPT_S = 24 * 3600.0


class BadKey(ValueError):
    """The Idempotency-Key header is malformed."""


class KeyReused(ValueError):
    """The key was first sent with another request."""


@dataclass(frozen=True, slots=True)
class Claim:
    """A request that holds its key while it runs: it records its answer in the transaction of its changes."""

    user: str
    key: str
    fingerprint: str

    def record(self, persist: Persister, status: int, answer: Any) -> None:
        """Mark the answer for the next batch (the one that carries the jobs it names)."""
        persist.answer(self.user, self.key, self.fingerprint, status, jsontext.dumps(answer), time.time())


def request_key(headers: Any) -> str | None:
    """The request's Idempotency-Key, None when absent; BadKey when it is not 1-255 visible ASCII characters."""
    key = headers.get(HEADER)
    if key is None:
        return None
    if not 0 < len(key) <= MAX_KEY or not key.isascii() or not key.isprintable() or key != key.strip():
        raise BadKey(f"{HEADER} must be 1 to {MAX_KEY} visible ASCII characters (a UUID, say)")
    return key


def fingerprint(method: str, path: str, body: bytes) -> str:
    """What identifies a request, so a key reused for another one is caught."""
    return hashlib.sha256(f"{method} {path}\n".encode() + body).hexdigest()


class Idempotency:
    """Runs each (user, key) once; a repeat waits for the first and gets its stored answer."""

    def __init__(self, lookup: Callable[[str, str], Awaitable[tuple[str, int, str] | None]]) -> None:
        self._lookup = lookup
        self._running: dict[tuple[str, str], asyncio.Future] = {}

    async def once(self, user: str, key: str, print_: str,
                   work: Callable[[Claim], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """The stored answer to this key, or ``work``'s; KeyReused when the key came with another request."""
        slot = (user, key)
        while True:
            running = self._running.get(slot)
            if running is not None:
                await asyncio.shield(running)
                continue
            stored = await self._lookup(user, key)
            if slot in self._running:
                continue  # another request took the key while the store was read
            break
        if stored is not None:
            first, status, body = stored
            if first != print_:
                raise KeyReused(f"{HEADER} {key!r} was used for another request; use a new key for each "
                                f"request")
            return web.Response(text=body, status=status, content_type="application/json",
                                headers={REPLAYED: "true"})
        done = asyncio.get_running_loop().create_future()
        self._running[slot] = done
        try:
            return await work(Claim(user, key, print_))
        finally:
            del self._running[slot]
            done.set_result(None)
