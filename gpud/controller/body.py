"""Reading a request's JSON body within bounds: its size, how long it takes to arrive, its depth and item count.

Each bound is checked before the body is parsed, so no request makes the
controller hold more than a small multiple of its size: a 63 MB body is
refused from its Content-Length (or, sent chunked, once the cap is passed
while it streams), and a body of a million empty objects is refused from a
count of its punctuation, not built.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from aiohttp import web

MAX_DEPTH = 32
MAX_ITEMS = 200_000   # values in objects and arrays, all levels together
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class BodyError(ValueError):
    """A body refused before or while it is parsed; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def read_body(request: web.Request, max_bytes: int, timeout_s: float) -> bytes:
    """The body's bytes; BodyError 413 past ``max_bytes`` (from its length or while it streams), 408 when slow."""
    length = request.content_length
    if length is not None and length > max_bytes:
        raise BodyError(413, too_large(max_bytes, f"this one is {length} bytes"))
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BodyError(413, too_large(max_bytes, "this one is larger")) from None
    except TimeoutError:
        raise BodyError(408, f"the body did not arrive within {timeout_s:g} s") from None


def too_large(max_bytes: int, detail: str) -> str:
    """What a body over the cap is told."""
    return (f"the body is too large: the controller takes at most {max_bytes} bytes ({detail}; "
            f"[api] max_body_mib in controller.toml)")


def check_shape(data: bytes, max_depth: int = MAX_DEPTH, max_items: int = MAX_ITEMS) -> None:
    """BodyError 413 when the JSON text nests deeper than ``max_depth`` or holds more than ``max_items`` values.

    Counted on the text with its strings blanked out, so punctuation inside
    strings does not count; a text that is not JSON passes and fails to parse.
    """
    bare = _STRINGS.sub(b"", data) if b'"' in data else data
    items = bare.count(b",") + bare.count(b"[") + bare.count(b"{")
    if items > max_items:
        raise BodyError(413, f"the body holds more than {max_items} JSON values; split it")
    brackets = bare.translate(None, _NOT_BRACKETS)
    if len(brackets) <= max_depth:
        return
    depth = 0
    for byte in brackets:
        depth += 1 if byte in (0x5B, 0x7B) else -1
        if depth > max_depth:
            raise BodyError(400, f"the JSON body nests more than {max_depth} levels deep")


def parse_json(data: bytes) -> Any:
    """The body's JSON value; BodyError 400 naming the problem when it is not JSON."""
    check_shape(data)
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BodyError(400, f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BodyError(400, "the body is not valid JSON: it is nested too deeply") from None
