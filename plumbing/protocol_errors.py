"""Requests aiohttp refuses before any route sees them (bad Content-Length, header
too long, NUL in a header, unknown method), answered as JSON like every other error,
instead of aiohttp's text that echoes the request, and logged once per interval."""

from __future__ import annotations

import logging
import re
from typing import Any, Final

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError
from aiohttp.web_request import BaseRequest

from plumbing.logs import Throttled

log = logging.getLogger(__name__)

_PARSE_ERRORS: Final = {
    "BadHttpMethod": "unknown HTTP method",
    "LineTooLong": "request line or header too long",
    "InvalidHeader": "invalid header",
    "BadStatusLine": "malformed request line",
    "ContentEncodingError": "Content-Encoding is not accepted: send the body unencoded",
    "TransferEncodingError": "malformed chunked body",
    "ContentLengthError": "body does not match Content-Length",
}
_parse_log: Final = Throttled(log)

_DETAIL_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9 '\-]{2,80}")


def parser_detail(message: str | None) -> str | None:
    """The parser's own phrase from its message ("Duplicate Content-Length"), never
    what follows it: aiohttp quotes the offending request bytes after the colon."""
    phrase = (message or "").split(":", 1)[0].strip()
    return phrase if _DETAIL_RE.fullmatch(phrase) else None


class JsonErrorHandler(web.RequestHandler):
    """aiohttp's connection handler, with its own error replies (a request its parser
    refused: bad Content-Length, header too long, NUL in a header, unknown method) as
    JSON instead of text echoing the request, and logged once per interval."""

    __slots__ = ()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("a reply was already under way: nothing more can be sent")
        kind = type(exc).__name__ if exc is not None else "none"
        if status >= 500:
            _parse_log.error(("handler", kind), "unexpected error on a request", exc_info=True)
            text = "internal error"
        else:
            _parse_log.log(logging.INFO, ("parse", kind), "refused a malformed request: %s", kind)
            text = _PARSE_ERRORS.get(kind, "malformed HTTP request")
        body = {"error": text}
        detail = parser_detail(message)
        if detail and detail.lower() != text.lower():
            body["detail"] = detail
        reply = web.json_response(body, status=status)
        reply.force_close()
        return reply

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        """aiohttp's own error lines, once per interval; the unread rest of a body
        that could not be decoded (after its request was already answered) without
        a traceback."""
        exc = kwargs.get("exc_info")
        kind = type(exc).__name__
        if isinstance(exc, RequestPayloadError):
            _parse_log.log(logging.INFO, ("payload", kind), "dropped an undecodable body: %s", exc)
        else:
            _parse_log.error(("aiohttp", kind), *args, exc_info=bool(exc))
