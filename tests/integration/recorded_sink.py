"""What the pipelining and predecessor check tests share: the real sink
(sink.create_app over a real inbox file, with its chaos settings) on loopback behind
a middleware that records each POST from its arrival to its reply, a base for
wrappers of HttpSender on the relay's side, and the check that a drain applied every
entry in its line's order."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web
from relay_lines import Line, lines
from support import ASYNC_POLL_S, WAIT_S, sent_events

from plumbing.http_errors import Handler, Middleware
from publisher.http import BatchResult, HttpSender
from publisher.settings import Ordering
from shared import PREDECESSOR_HEADER, Event, Lease
from sink.app import INBOX
from sink.chaos import Chaos, chaos_app

if TYPE_CHECKING:
    from conftest import Query, Serve

T = TypeVar("T")


@dataclass
class Seen:
    """One POST as a sink received it."""

    index: int  # arrival order
    ids: list[str]
    after: str | None  # its Outbox-After header
    line: Line  # None in global order, else the SKU
    arrived: float
    in_flight: int  # requests of its line being handled when it arrived, itself included
    overlapped: bool = False  # another request of its line was handled at the same time
    status: int = 0  # 0 while it is being handled


@dataclass
class Recorder:
    """Every POST in arrival order, and which requests of a line were handled at once.

    With `refuse_naming_predecessor`, that many requests naming a predecessor are
    answered 412 without being applied, once the event they name is in the inbox (a
    sink that gave up waiting).
    """

    by_sku: bool = False
    refuse_naming_predecessor: int = 0
    requests: list[Seen] = field(default_factory=list)
    handling: dict[Line, list[Seen]] = field(default_factory=dict)

    def arrive(self, events: list[Any], after: str | None) -> Seen:
        line = events[0].get("key") if self.by_sku else None
        current = self.handling.setdefault(line, [])
        seen = Seen(
            len(self.requests),
            [e["id"] for e in events],
            after,
            line,
            time.monotonic(),
            len(current) + 1,
        )
        for other in current:
            other.overlapped = seen.overlapped = True
        current.append(seen)
        self.requests.append(seen)
        return seen

    def leave(self, seen: Seen) -> None:
        self.handling[seen.line].remove(seen)

    def in_progress(self) -> int:
        """Requests being handled now, of every line."""
        return sum(len(seen) for seen in self.handling.values())

    def by_line(self, requests: Sequence[Seen] | None = None) -> dict[Line, list[Seen]]:
        keyed: dict[Line, list[Seen]] = {}
        for seen in self.requests if requests is None else requests:
            keyed.setdefault(seen.line, []).append(seen)
        return keyed

    def max_in_flight(self, requests: Sequence[Seen] | None = None) -> dict[Line, int]:
        return {
            line: max(s.in_flight for s in seen) for line, seen in self.by_line(requests).items()
        }


def posted_events(request: web.Request, body: Any) -> list[Any]:
    return sent_events(body)


def recording(recorder: Recorder) -> Middleware:
    """In front of the real sink: records each POST from its arrival to its reply."""

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "POST":
            return await handler(request)
        body = json.loads(await request.read())  # kept by aiohttp for the handler
        seen = recorder.arrive(
            posted_events(request, body), request.headers.get(PREDECESSOR_HEADER)
        )
        try:
            if seen.after is not None and recorder.refuse_naming_predecessor > 0:
                recorder.refuse_naming_predecessor -= 1
                response: web.StreamResponse = await refuse(request, seen.after)
            else:
                response = await handler(request)
            seen.status = response.status
            return response
        finally:
            recorder.leave(seen)

    return record


async def refuse(request: web.Request, after: str) -> web.Response:
    """412 for a request whose predecessor is in the inbox (bounded wait for it)."""
    deadline = time.monotonic() + WAIT_S
    while not await request.app[INBOX].knows(after):
        assert time.monotonic() < deadline, f"{after} never reached the inbox"
        await asyncio.sleep(ASYNC_POLL_S)
    return web.json_response({"error": "gave up waiting", "after": after}, status=412)


async def start_sink(serve: Serve, sink_db: Path, recorder: Recorder, **settings: Any) -> str:
    """The real sink with `settings` (sink.chaos) and the recorder in front; returns
    the /events URL."""
    app = chaos_app(sink_db, Chaos(**settings))
    app.middlewares.insert(0, recording(recorder))
    return f"{await serve(app)}/events"


@dataclass
class WrappedSender:
    """HttpSender's deliver and deliver_batch as the relay calls them, each request
    going through `_request` (what a wrapper adds around the real send), and what the
    sender knows of the sink's predecessor check."""

    sender: HttpSender

    async def deliver(
        self, event: Event, after: str | None = None, lease: Lease | None = None
    ) -> dict[str, object]:
        return await self._request(
            [event], after, lambda: self.sender.deliver(event, after, lease), lease
        )

    async def deliver_batch(
        self, events: Sequence[Event], after: str | None = None, lease: Lease | None = None
    ) -> list[BatchResult]:
        return await self._request(
            events, after, lambda: self.sender.deliver_batch(events, after, lease), lease
        )

    def predecessor_checked(self, event_id: str | None) -> bool:
        return self.sender.predecessor_checked(event_id)

    async def _request(
        self,
        events: Sequence[Event],
        after: str | None,
        send: Callable[[], Awaitable[T]],
        lease: Lease | None,
    ) -> T:
        return await send()


def assert_applied_in_order(
    db_rows: Query, db: Path, sink_db: Path, events: list[Event], ordering: Ordering
) -> None:
    """Every entry marked sent with the ACK that names it, applied by the sink, each
    line in seq order, the inventory totals right."""
    ids = [e["id"] for e in events]
    rows = db_rows(db, "SELECT id, sent, ack FROM outbox_entries ORDER BY seq")
    assert [(i, s) for i, s, _ in rows] == [(i, 1) for i in ids]
    assert [json.loads(ack)["ack"] for *_, ack in rows] == ids
    applied = [r[0] for r in db_rows(sink_db, "SELECT id FROM inbox_events ORDER BY rowid")]
    assert sorted(applied) == sorted(ids)
    for line in lines(events, ordering).values():
        members = set(line)
        assert [i for i in applied if i in members] == line
    totals: dict[str, int] = {}
    for e in events:
        totals[e["sku"]] = totals.get(e["sku"], 0) + e["qty"]
    assert dict(db_rows(sink_db, "SELECT sku, qty FROM inbox_inventory")) == totals
