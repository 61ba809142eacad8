"""Requests aiohttp refuses before any route sees them (bad Content-Length, header
too long, NUL in a header, unknown method), answered as JSON like every other error,
instead of aiohttp's text that echoes the request, and logged once per interval."""

from __future__ import annotations

import logging
import re
from typing import Any, Final

from aiohttp import web

from plumbing.aiohttp_internals import PARSER_ERRORS, HookedHandler, is_payload_error
from plumbing.logs import HTTP_LOG, Throttled

log = HTTP_LOG

_parse_log: Final = Throttled(log)

_DETAIL_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9 '\-]{2,80}")


def parser_detail(message: str | None) -> str | None:
    """The parser's own phrase from its message ("Duplicate Content-Length"), never
    what follows it: aiohttp quotes the offending request bytes after the colon."""
    phrase = (message or "").split(":", 1)[0].strip()
    return phrase if _DETAIL_RE.fullmatch(phrase) else None


class JsonErrorHandler(HookedHandler):
    """aiohttp's connection handler, with its own error replies (a request its parser
    refused: bad Content-Length, header too long, NUL in a header, unknown method) as
    JSON instead of text echoing the request, and logged once per interval."""

    __slots__ = ()

    def error_reply(
        self, status: int, exc: BaseException | None, message: str | None
    ) -> web.StreamResponse:
        kind = type(exc).__name__ if exc is not None else "none"
        if status >= 500:
            _parse_log.error(("handler", kind), "unexpected error on a request", exc_info=True)
            text = "internal error"
        else:
            _parse_log.log(logging.INFO, ("parse", kind), "refused a malformed request: %s", kind)
            text = PARSER_ERRORS.get(kind, "malformed HTTP request")
        body = {"error": text}
        detail = parser_detail(message)
        if detail and detail.lower() != text.lower():
            body["detail"] = detail
        reply = web.json_response(body, status=status)
        reply.force_close()
        return reply

    def log_error(self, args: tuple[Any, ...], exc: object) -> None:
        """aiohttp's own error lines, once per interval; the unread rest of a body
        that could not be decoded (after its request was already answered) without
        a traceback."""
        kind = type(exc).__name__
        if is_payload_error(exc):
            _parse_log.log(logging.INFO, ("payload", kind), "dropped an undecodable body: %s", exc)
        else:
            _parse_log.error(("aiohttp", kind), *args, exc_info=bool(exc))
