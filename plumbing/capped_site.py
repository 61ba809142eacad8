"""The site both services listen on: at most a capped number of connections at once.

At the cap the oldest idle connection is closed to make room; with none idle, a new
connection gets a 503 and is closed. A failed accept() (out of descriptors) is
logged once per interval instead of a traceback each time.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final, cast

from aiohttp import web

from plumbing.aiohttp_internals import attach_listener, close_if_idle
from plumbing.logs import HTTP_LOG, Throttled
from plumbing.protocol_errors import JsonErrorHandler

log = HTTP_LOG

_REFUSED_BODY: Final = b'{"error": "too many open connections, try again"}'
_REFUSED: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_REFUSED_BODY), _REFUSED_BODY)
)
MAX_LINGERING: Final = 32  # refused sockets that may wait for the client's close at once
REFUSED_LINGER_S: Final = 1.0
_connection_log: Final = Throttled(log)


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """asyncio's loop logs a traceback for every failed accept() (out of descriptors,
    say): log those once per interval instead; anything else as asyncio would.
    (uvloop reports no failed accept: see RESERVED_FDS.)"""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        if message.startswith("socket.accept() out of system resource"):
            _connection_log.error(
                ("accept", str(context.get("exception"))), "%s: %s", message,
                context.get("exception"),
            )  # fmt: skip
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(handle)


class _CountedHandler(JsonErrorHandler):
    """A JsonErrorHandler that leaves its site's count when its connection is lost."""

    __slots__ = ("_pool",)
    _pool: _Connections | None

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        pool: _Connections | None = getattr(self, "_pool", None)
        if pool is not None:
            self._pool = None
            pool.open -= 1


class _Refused(asyncio.Protocol):
    """A connection beyond the cap with no idle one to close: a 503, then closed.

    Closing a socket with unread input makes the kernel send a reset, which can
    destroy the 503 before the client reads it: so the write side is shut first,
    and the socket closed when the client closes its side (or after a second).
    At most MAX_LINGERING such sockets wait at once; beyond, they close at once."""

    lingering = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is one without subclassing asyncio.Transport).
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        transport.write(_REFUSED)
        if _Refused.lingering >= MAX_LINGERING or not transport.can_write_eof():
            transport.close()
            return
        _Refused.lingering += 1
        transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(REFUSED_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass  # read and dropped, so that no reset follows

    def eof_received(self) -> bool:
        self._transport.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        timer = getattr(self, "_timer", None)
        if timer is not None:
            timer.cancel()
            _Refused.lingering -= 1


class _Connections:
    """The protocol factory of a capped site: a JsonErrorHandler per connection while
    fewer than `cap` are open; at the cap the oldest idle connection (no request
    under way: idle keep-alive, or headers still trickling in) is closed to make
    room, and with none idle the new one gets a 503.

    Connections are counted from here, not from aiohttp's list: a connection joins
    that list a loop turn after this factory made its handler, and a burst of
    accepts would all see the same, too small, number."""

    def __init__(self, server: web.Server, options: dict[str, Any], cap: int) -> None:
        self._server = server
        self._options = options
        self._cap = cap
        self._loop = asyncio.get_running_loop()
        self.open = 0  # handlers made here whose connection is not lost yet

    def __call__(self) -> asyncio.Protocol:
        server = self._server
        if self.open >= self._cap and not self._close_idle():
            _connection_log.warning(
                "cap", "connection cap of %d reached, all busy: refused with 503", self._cap
            )
            return _Refused()
        handler = _CountedHandler.for_connection(server, self._loop, self._options)
        handler._pool = self
        self.open += 1
        return handler

    def _close_idle(self) -> bool:
        for handler in self._server.connections:  # oldest first
            if close_if_idle(handler):
                _connection_log.warning(
                    "idle", "connection cap of %d reached: closed the oldest idle", self._cap
                )
                return True
        return False


class CappedSite(web.BaseSite):
    """A TCP site whose connections are JsonErrorHandlers, at most `cap` at once."""

    __slots__ = ("_cap", "_host", "_listen_backlog", "_options", "_port", "_web_server")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        options: dict[str, Any],
        cap: int,
        backlog: int,
    ) -> None:
        super().__init__(runner)  # raises unless the runner is set up
        assert runner.server is not None
        self._web_server = runner.server
        self._host, self._port, self._options, self._cap = host, port, options, cap
        self._listen_backlog = backlog

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        listener = await asyncio.get_running_loop().create_server(
            _Connections(self._web_server, self._options, self._cap),
            self._host,
            self._port,
            backlog=self._listen_backlog,
            reuse_address=True,
        )
        attach_listener(self, listener)
