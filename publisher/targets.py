"""Which sink URLs the publisher may send to. Pure: decided before any connection."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from yarl import URL

from plumbing.net import is_loopback
from publisher.errors import TargetNotAllowed

EVENTS_PATH: Final = "/events"
__all__ = ["EVENTS_PATH", "check_target", "is_loopback"]


def check_target(url: str | URL, allowed_hosts: Iterable[str] = ()) -> URL:
    """Return the parsed URL if the publisher may send to it, else raise TargetNotAllowed.

    By default only plain HTTP to a loopback host on path /events. A host the operator
    names in `allowed_hosts` may also be reached over HTTPS.
    """
    try:
        target = URL(url)
    except (TypeError, ValueError) as exc:
        raise TargetNotAllowed(f"not a URL: {url!r}") from exc
    host = (target.host or "").lower()
    if not target.absolute or not host:
        raise TargetNotAllowed(f"not an absolute http URL: {str(url)!r}")
    extra = {h.lower() for h in allowed_hosts}
    if target.user is not None or target.password is not None:
        raise TargetNotAllowed("credentials in the URL are not allowed")
    if host in extra:
        schemes = {"http", "https"}
    elif is_loopback(host):
        schemes = {"http"}
    else:
        raise TargetNotAllowed(f"host {host!r} is not loopback and not explicitly allowed")
    if target.scheme not in schemes:
        raise TargetNotAllowed(f"scheme {target.scheme!r} is not allowed for {host!r}")
    if target.path != EVENTS_PATH or target.query_string or target.fragment:
        raise TargetNotAllowed(f"path must be exactly {EVENTS_PATH}, got {target.path_qs!r}")
    return target
