"""The overview as server-sent events: one `overview` event about every second.

Written by hand on aiohttp's StreamResponse (the format is a few lines; a library
would add a dependency for them). Bounded three ways: a stream ends when its client
goes (the next write fails), after `max_s` (the browser's EventSource reconnects on
its own), and at once when the server shuts down, so that a graceful stop never
waits for open pages. At most MAX_STREAMS are open at once, and readers who are not
signed in hold at most MAX_STREAMS - OPERATOR_STREAMS of them, so that an operator
always gets a live view; more get 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web

from plumbing.http_errors import error
from plumbing.storage import StorageError

log = logging.getLogger(__name__)

MAX_STREAMS: Final = 32
OPERATOR_STREAMS: Final = 8  # kept for signed-in operators
RETRY_MS: Final = 2000  # how long a browser waits before it reconnects
Reader = Callable[[], Awaitable[dict[str, Any]]]


@dataclass
class Streams:
    """The open streams of one console (`anonymous`: those of readers not signed in),
    and the signal that ends them all."""

    interval_s: float
    max_s: float
    open: int = 0
    anonymous: int = 0
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    def refusal(self, signed_in: bool) -> str | None:
        """Why one more stream may not open now, or None."""
        if self.stopping.is_set():
            return "the service is stopping"
        if self.open >= MAX_STREAMS:
            return f"at most {MAX_STREAMS} live views at once: try again later"
        if not signed_in and self.anonymous >= MAX_STREAMS - OPERATOR_STREAMS:
            return (
                f"at most {MAX_STREAMS - OPERATOR_STREAMS} live views at once for readers"
                " who are not signed in: try again later, or sign in"
            )
        return None


def event(name: str, data: dict[str, Any]) -> bytes:
    """One server-sent event (JSON holds no raw newline, so one data line)."""
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


async def serve_stream(
    request: web.Request, streams: Streams, read: Reader, signed_in: bool
) -> web.StreamResponse:
    """Send `await read()` as an `overview` event every interval until the stream ends."""
    refusal = streams.refusal(signed_in)
    if refusal is not None:
        return error(503, refusal)
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
    if request.method == "HEAD":  # the headers only: no events, which HEAD cannot carry
        return web.Response(headers=headers)
    reply = web.StreamResponse(headers=headers)
    anonymous = 0 if signed_in else 1
    streams.open += 1
    streams.anonymous += anonymous
    try:
        await reply.prepare(request)
        await reply.write(f"retry: {RETRY_MS}\n\n".encode())
        await _send_until_done(reply, streams, read)
    except ConnectionError:
        log.debug("console stream closed by its client")
    finally:
        streams.open -= 1
        streams.anonymous -= anonymous
    return reply


async def _send_until_done(reply: web.StreamResponse, streams: Streams, read: Reader) -> None:
    ends_at = time.monotonic() + streams.max_s
    while time.monotonic() < ends_at:
        try:
            await reply.write(event("overview", await read()))
        except StorageError as exc:
            await reply.write(event("unavailable", {"error": f"storage unavailable: {exc}"}))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(streams.stopping.wait(), streams.interval_s)
            return
