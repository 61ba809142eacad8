"""What a service answers its probes with: liveness, readiness and Prometheus metrics.

Readiness is honest about the real writes: the writability probe updates one row of
a health table in place, which needs no new page, no privilege on the real tables and
fires none of their triggers, so it can pass while every real write fails (the
server's disk full, INSERT revoked, a trigger that raises). A service therefore
reports each real write's outcome to its `WriteHealth`; once one failed, /readyz is
503 until a real write succeeds again or the store's probe of its real tables
(`check_real_writes`) does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from plumbing.http_errors import error
from plumbing.storage import StorageError

Check = Callable[[], Awaitable[None]]


class WriteHealth:
    """What the service's real writes last said of the database: `failure`, the
    reason the last one failed, until one succeeds (None: none failed since)."""

    def __init__(self) -> None:
        self.failure: str | None = None

    def failed(self, reason: str) -> None:
        self.failure = reason

    def succeeded(self) -> None:
        self.failure = None

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Around one real write: StorageError out of it is a failure (raised on).
        A success is the caller's to tell (`succeeded`) once the database took the
        write: a request refused before it reached the database (invalid, say)
        proves nothing either way."""
        try:
            yield
        except StorageError as exc:
            self.failed(str(exc))
            raise


def metrics_response(registry: CollectorRegistry) -> web.Response:
    """The registry in Prometheus text format."""
    response = web.Response(body=generate_latest(registry))
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readiness(
    check_writable: Check,
    gauge: Gauge,
    writes: WriteHealth | None = None,
    check_real_writes: Check | None = None,
) -> web.Response:
    """200 {"status": "ready"} while the database takes a write, else 503 with the
    reason; `gauge` is set to 1 or 0 either way (a liveness check is /healthz).

    With `writes`: once a real write failed, ready again only when a real write has
    succeeded since or `check_real_writes` (the store's writes tried on its real
    tables) passes; till then 503 with the reason it gives, or the real write's."""
    try:
        await check_writable()
        if writes is not None and writes.failure is not None:
            await _real_writes(writes, check_real_writes)
    except StorageError as exc:
        gauge.set(0)
        return error(503, "not ready: the database cannot be written", reason=str(exc))
    gauge.set(1)
    return web.json_response({"status": "ready"})


async def _real_writes(writes: WriteHealth, check: Check | None) -> None:
    """StorageError while the real writes fail: `check` fails, or without one the
    last real write's failure stands."""
    failure = writes.failure
    if check is None:
        raise StorageError(f"the last write failed: {failure}")
    try:
        await check()
    except StorageError as exc:
        writes.failed(str(exc))
        raise
    if writes.failure == failure:  # no other real write failed meanwhile
        writes.succeeded()
