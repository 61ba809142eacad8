"""Who may talk to a service from a browser's point of view: the Host, Origin and
body-type checks that refuse what a page of another site (or DNS rebinding) sends.

The Host check compares host names, never ports. DNS rebinding gives a page of another
site a name of its own that resolves to this service, so its requests carry that name
in their Host: the name is what tells them apart. The port tells nothing about the
sender, and behind a port mapping (`docker run -p 18080:8080`, `kubectl port-forward`,
`ssh -L`, a TCP proxy) it is the client's port, not the one this service listens on.
The Origin check does compare ports: a page on another port of the same host is
another site.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from aiohttp import hdrs, web

from plumbing.http_errors import JSON_TYPE, Handler, Middleware, error
from plumbing.net import is_loopback
from shared.cloudevents import is_json_media, media_type

# Host names no DNS answer can put in a request: its client sent it to its own machine
# and a port mapping brought it here. The common spellings, looked up before
# `is_loopback` parses an address (the rest of 127.0.0.0/8).
LOOPBACK_HOST_NAMES: Final = frozenset({"localhost", "127.0.0.1", "[::1]"})
MAX_PORT: Final = 65535


@dataclass(frozen=True)
class HttpGuard:
    """Who may talk to a service from a browser's point of view.

    `host_names`: names a Host header may carry besides the address a connection came
    in on and the loopback names (`localhost`, `127.0.0.1`, `[::1]`): a DNS name the
    service is reached by. Any port goes with a name.
    `origins`: values of an Origin header that are allowed (none by default: a
    browser page of any site is refused).
    `own_page_paths`: path prefixes under which the service's own origin is allowed
    too (an Origin of `own_scheme` plus the Host, port included, which the Host check
    has found to name this service): where the service serves a page of its own that
    calls it. `own_scheme` is "https" when that page is reached over TLS through a
    proxy in front (the browser's Origin then says https).
    """

    host_names: frozenset[str] = frozenset()
    origins: frozenset[str] = frozenset()
    own_page_paths: tuple[str, ...] = ()
    own_scheme: str = "http"

    @classmethod
    def of(cls, host_names: Iterable[str] = (), origins: Iterable[str] = ()) -> HttpGuard:
        return cls(
            frozenset(name.strip().lower().rstrip(".") for name in host_names if name.strip()),
            frozenset(origin.strip().lower().rstrip("/") for origin in origins if origin.strip()),
        )


def split_host(value: str) -> tuple[str, int | None] | None:
    """The name (an IPv6 literal keeps its brackets) and port of a Host value
    `name[:port]`; None unless the port, when there is one, is 1 to 65535 in ASCII
    digits."""
    if value.startswith("["):
        end = value.find("]") + 1
        if end == 0:
            return None
        name, rest = value[:end], value[end:]
    else:
        name, colon, digits = value.partition(":")
        rest = colon + digits
    if not rest:
        return name, None
    digits = rest[1:]
    if rest[0] != ":" or not (digits.isascii() and digits.isdigit()) or len(digits) > 5:
        return None
    port = int(digits)
    return (name, port) if 0 < port <= MAX_PORT else None


def local_host_name(sockname: object) -> str | None:
    """The Host name of the local address a connection came in on (an IPv6 literal in
    brackets, an IPv4 address mapped into IPv6 as itself); None if there is none."""
    if not isinstance(sockname, tuple) or not sockname:
        return None
    address = str(sockname[0]).lower()
    try:
        mapped = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(mapped, ipaddress.IPv6Address) and mapped.ipv4_mapped is not None:
        return str(mapped.ipv4_mapped)
    return f"[{address}]" if ":" in address else address


def host_allowed(host: str, local_name: str | None, host_names: frozenset[str]) -> bool:
    """Whether a Host header value names this service, whatever its port: a loopback
    name, the local address the connection came in on (`local_name`), or one of
    `host_names` (compared without a trailing dot)."""
    parts = split_host(host.lower())
    if parts is None:
        return False
    name = parts[0]
    if name in LOOPBACK_HOST_NAMES or name == local_name or name.rstrip(".") in host_names:
        return True
    return is_loopback(name)


def http_guard(guard: HttpGuard) -> Middleware:
    """Refuse what only a browser tricked by another site (or a confused client) sends:
    421 for a Host that names no address of this service (DNS rebinding), 403 for an
    Origin that is not allowed, and on POST 415 for a body that is not plain JSON
    (a cross-site "simple" request cannot send `Content-Type: application/json`)."""

    def host_ok(request: web.Request, host: str) -> bool:
        transport = request.transport
        sockname = None if transport is None else transport.get_extra_info("sockname")
        return host_allowed(host, local_host_name(sockname), guard.host_names)

    def origin_allowed(request: web.Request, origin: str, host: str | None) -> bool:
        value = origin.lower().rstrip("/")
        if value in guard.origins:
            return True
        # The port counts here: behind a mapping, the browser's Host and Origin both
        # carry the port it used, so its own page still matches.
        own = host is not None and value == f"{guard.own_scheme}://{host.lower()}"
        return own and request.path.startswith(guard.own_page_paths)

    @web.middleware
    async def guard_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
        headers = request.headers
        host = headers.get(hdrs.HOST)
        if host is not None and not host_ok(request, host):
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
