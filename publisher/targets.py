"""Which sink URLs the publisher may send to. Pure: decided before any connection."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from yarl import URL

from plumbing.net import is_loopback
from publisher.errors import TargetNotAllowed

# The sink's own path for its events endpoint: the usual one, not the only one allowed.
EVENTS_PATH: Final = "/events"
__all__ = ["EVENTS_PATH", "check_target", "is_loopback"]


def check_target(url: str | URL, allowed_hosts: Iterable[str] = ()) -> URL:
    """Return the parsed URL if the publisher may send to it, else raise TargetNotAllowed.

    By default only plain HTTP to a loopback host. A host the operator names in
    `allowed_hosts` may also be reached over HTTPS. No credentials, query or fragment.

    The path is the sink's events endpoint, wherever it is mounted: /events for the
    sink on its own, /outbox/events for one inside another application. Batches go to
    that path plus /batch and inbox lookups to that path plus /ID. A path that ends in
    a slash (/events/, or / for none at all) is refused rather than guessed at: single
    events would go to /events/ while batches went to /events/batch.
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
    _check_path(target)
    return target


def _check_path(target: URL) -> None:
    if target.query_string or target.fragment:
        raise TargetNotAllowed(f"a query or fragment is not allowed, got {str(target)!r}")
    path = target.raw_path
    if not path.strip("/"):
        raise TargetNotAllowed(f"the URL needs the sink's events path, e.g. {EVENTS_PATH}")
    if path.endswith("/"):
        raise TargetNotAllowed(
            f"a trailing slash is not allowed, got {path!r}: give {path.rstrip('/')!r}"
        )
