"""Who may talk to a service from a browser's point of view: the Host, Origin and
body-type checks that refuse what a page of another site (or DNS rebinding) sends."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from aiohttp import hdrs, web

from plumbing.http_errors import JSON_TYPE, Handler, Middleware, error
from plumbing.net import is_loopback
from shared.cloudevents import is_json_media, media_type


@dataclass(frozen=True)
class HttpGuard:
    """Who may talk to a service from a browser's point of view.

    `host_names`: names a Host header may carry besides the address a connection came
    in on (and, on loopback, `localhost`): a DNS name the service is reached by.
    `origins`: values of an Origin header that are allowed (none by default: a
    browser page of any site is refused).
    `own_page_paths`: path prefixes under which the service's own origin is allowed
    too (an Origin of `http://` plus the Host, which the Host check has found to name
    this service): where the service serves a page of its own that calls it.
    """

    host_names: frozenset[str] = frozenset()
    origins: frozenset[str] = frozenset()
    own_page_paths: tuple[str, ...] = ()

    @classmethod
    def of(cls, host_names: Iterable[str] = (), origins: Iterable[str] = ()) -> HttpGuard:
        return cls(
            frozenset(name.strip().lower().rstrip(".") for name in host_names if name.strip()),
            frozenset(origin.strip().lower().rstrip("/") for origin in origins if origin.strip()),
        )


def _local_host_values(sockname: object) -> frozenset[str]:
    """The Host values that name the local address a connection came in on."""
    if not isinstance(sockname, tuple) or len(sockname) < 2:
        return frozenset()
    address, port = str(sockname[0]).lower(), int(sockname[1])
    names = [f"[{address}]" if ":" in address else address]
    if is_loopback(address):
        names += ["localhost", "127.0.0.1", "[::1]"]
    values = {f"{name}:{port}" for name in names}
    if port == 80:
        values.update(names)
    return frozenset(values)


def _host_name(value: str) -> str:
    """`name` of a Host value `name[:port]` (an IPv6 literal keeps its brackets)."""
    if value.startswith("["):
        return value.partition("]")[0] + "]"
    return value.partition(":")[0].rstrip(".")


def http_guard(guard: HttpGuard) -> Middleware:
    """Refuse what only a browser tricked by another site (or a confused client) sends:
    421 for a Host that names no address of this service (DNS rebinding), 403 for an
    Origin that is not allowed, and on POST 415 for a body that is not plain JSON
    (a cross-site "simple" request cannot send `Content-Type: application/json`)."""
    by_sockname: dict[object, frozenset[str]] = {}

    def host_allowed(request: web.Request, host: str) -> bool:
        transport = request.transport
        sockname = None if transport is None else transport.get_extra_info("sockname")
        allowed = by_sockname.get(sockname)
        if allowed is None:
            if len(by_sockname) > 64:  # a handful of local addresses: never grows
                by_sockname.clear()
            allowed = by_sockname[sockname] = _local_host_values(sockname)
        value = host.lower()
        return value in allowed or _host_name(value) in guard.host_names

    def origin_allowed(request: web.Request, origin: str, host: str | None) -> bool:
        value = origin.lower().rstrip("/")
        if value in guard.origins:
            return True
        own = host is not None and value == f"http://{host.lower()}"
        return own and request.path.startswith(guard.own_page_paths)

    @web.middleware
    async def guard_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
        headers = request.headers
        host = headers.get(hdrs.HOST)
        if host is not None and not host_allowed(request, host):
            return error(421, "the Host header names no address of this service", host=host)
        origin = headers.get(hdrs.ORIGIN)
        if origin is not None and not origin_allowed(request, origin, host):
            return error(403, "requests from this Origin are not allowed", origin=origin)
        # A POST the router will refuse anyway (404, 405 with Allow) gets that answer:
        # the body rules are for the routes that take one.
        if request.method == hdrs.METH_POST and request.match_info.http_exception is None:
            refusal = _body_refusal(request)
            if refusal is not None:
                return refusal
        return await handler(request)

    return guard_requests


def _body_refusal(request: web.Request) -> web.Response | None:
    """415 unless the body is declared JSON (`application/json`, or a JSON type such
    as CloudEvents' `application/cloudevents+json`: none of them can a page of another
    site send without a preflight) and is not encoded."""
    headers = request.headers
    encoding = headers.get(hdrs.CONTENT_ENCODING)
    if encoding is not None and encoding.strip().lower() != "identity":
        return error(
            415,
            "Content-Encoding is not accepted: send the body unencoded",
            content_encoding=encoding,
        )
    content_type = headers.get(hdrs.CONTENT_TYPE)
    if content_type != JSON_TYPE and not is_json_media(media_type(content_type)):
        return error(
            415,
            f"the body must be sent as JSON: Content-Type {JSON_TYPE} or application/*+json",
            content_type=content_type,
        )
    return None
