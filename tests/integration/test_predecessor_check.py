"""Predecessor check negotiation: the relay pipelines only while the sink says it
enforces the predecessor check (Outbox-After).

Every reply of the real sink carries `Outbox-Fencing: enforced`;
HttpSender.enforces_predecessor_check() says whether the last reply it got did. A
relay whose sender reports it (predecessor_checked) starts each run of a line with
one request in flight naming no predecessor, opens up to its depth only after a
reply that carried the header, and goes back to one at a time after one that did not.

The real sink (sink.create_app) runs on loopback over a SQLite file, with a recording
middleware in front of it; a "legacy sink" is a small aiohttp app on loopback that
ACKs like the real one (verifiable ACKs with the payload digest) but ignores
Outbox-After and sends the header only when told. Both record each request as it
arrives: its events, its Outbox-After header and how many requests of its line were
being handled at once. Databases are read through independent sqlite3 connections.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import pytest
from aiohttp import web
from recorded_sink import Recorder, Seen, WrappedSender, assert_applied_in_order, start_sink
from relay_lines import (
    BATCH_LIMIT,
    MODES,
    ORDERINGS,
    Line,
    Mode,
    lines,
    orders,
    relay_for,
    running,
    sender_for,
)
from support import accept_events, eventually, placed, sent_events, sent_ids

import publisher.http as publisher_http
from publisher.errors import NotAcknowledged, Rejected
from publisher.http import HttpSender
from publisher.relay import Relay
from publisher.settings import DEFAULT_DEPTH, Ordering
from publisher.store import Outbox
from shared import (
    MAX_BODY_BYTES,
    PREDECESSOR_CHECK_ENFORCED,
    PREDECESSOR_CHECK_HEADER,
    PREDECESSOR_HEADER,
    Event,
    Lease,
    Receipt,
    make_ack,
    payload_digest,
)
from sink import create_app

if TYPE_CHECKING:
    from conftest import Query, Serve

DEPTH = DEFAULT_DEPTH  # what `publisher serve` runs with
IDLE_POLL_S = 30.0  # a relay that runs again only when woken (stop ends the wait too)
BOUND_S = 10.0  # every request and wait in here ends well within this
LEGACY_STALL_S = 0.01
SINK_STALL_S = 0.02
SETTLE_S = 0.2
TOKEN = "correct-horse-battery-staple-42"
T = TypeVar("T")


# ---------------------------------------------------------------- what the sink saw


@dataclass
class LegacySink:
    """A sink that ACKs every event (verifiably: with its payload digest) and ignores
    Outbox-After, as a sink from before the predecessor check would.

    `check_header` is the Outbox-Fencing value its replies carry (None: no header), read
    when each reply is made; `off_at` turns it off (None) when the request of that
    arrival index comes in. `fail_next` answers that many requests 503, unapplied.
    With `check_header_skus`, only replies to requests of those keys carry the header.
    """

    recorder: Recorder = field(default_factory=Recorder)
    stall_s: float = 0.0
    check_header: str | None = None
    off_at: int | None = None
    off_time: float | None = None
    fail_next: int = 0
    check_header_skus: frozenset[str] | None = None
    applied: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/events", self.post_event)
        app.router.add_post("/events/batch", self.post_batch)
        return app

    async def post_event(self, request: web.Request) -> web.Response:
        return await self._handle(request, batch=False)

    async def post_batch(self, request: web.Request) -> web.Response:
        return await self._handle(request, batch=True)

    async def _handle(self, request: web.Request, *, batch: bool) -> web.Response:
        events = sent_events(json.loads(await request.read()))
        seen = self.recorder.arrive(events, request.headers.get(PREDECESSOR_HEADER))
        if seen.index == self.off_at:
            self.check_header, self.off_time = None, time.monotonic()
        try:
            if self.stall_s > 0:
                await asyncio.sleep(self.stall_s)
            if self.fail_next > 0:
                self.fail_next -= 1
                response = web.json_response({"error": "try again"}, status=503)
            else:
                acks = [self._apply(e) for e in events]
                response = web.json_response({"acks": acks, "rejected": None} if batch else acks[0])
            seen.status = response.status
        finally:
            self.recorder.leave(seen)
        says = self.check_header_skus is None or events[0].get("key") in self.check_header_skus
        if self.check_header is not None and says:
            response.headers[PREDECESSOR_CHECK_HEADER] = self.check_header
        return response

    def _apply(self, event: Event) -> dict[str, str]:
        receipt = Receipt.DUPLICATE if event["id"] in self.applied else Receipt.APPLIED
        if receipt is Receipt.APPLIED:
            self.applied.append(event["id"])
        return make_ack(event["id"], receipt, payload_digest(event))


async def start_legacy(serve: Serve, legacy: LegacySink) -> str:
    return f"{await serve(legacy.app())}/events"


# ---------------------------------------------------------------- the relay side


@dataclass
class Call:
    """One request as the relay made it."""

    ids: list[str]
    after: str | None
    unanswered: int  # requests made before it whose reply had not come back
    untaken: int  # requests made before it whose result the relay had not taken yet
    done: bool = False


@dataclass
class Watched(WrappedSender):
    """HttpSender as the relay uses it (deliver, deliver_batch), and the relay's
    after-delivery hook, recorded in the order the relay calls them: one event loop,
    so the order is exact.

    The hook runs for each verified entry as the relay takes the result of its
    request: a request is taken once all its entries were hooked. `downgrade` notes
    the first result taken after a reply without the Outbox-Fencing header came back
    (the relay asks `predecessor_checked` right after taking it): how many requests
    had been made by then, and how many of the others were still in flight.
    """

    calls: list[Call] = field(default_factory=list)
    hooked: set[str] = field(default_factory=set)
    replied_without: bool = False  # a reply without the header came back
    downgrade: tuple[int, int] | None = None  # (calls made, others untaken)

    def untaken(self, but: str | None = None) -> int:
        return sum(
            not self.hooked.issuperset(call.ids) and but not in call.ids for call in self.calls
        )

    def after_delivery(self, event_id: str) -> None:
        self.hooked.add(event_id)
        if self.replied_without and self.downgrade is None:
            self.downgrade = (len(self.calls), self.untaken(but=event_id))

    async def _request(
        self,
        events: Sequence[Event],
        after: str | None,
        send: Callable[[], Awaitable[T]],
        lease: Lease | None,
    ) -> T:
        unanswered = sum(not call.done for call in self.calls)
        call = Call([e["id"] for e in events], after, unanswered, self.untaken())
        self.calls.append(call)
        try:
            return await send()
        finally:
            call.done = True
            # What the last reply said: once one lacks the header here, all later do.
            self.replied_without |= not self.sender.predecessor_checked(call.ids[0])


def make_relay(outbox: Outbox, sender: HttpSender | Watched, mode: Mode, **options: Any) -> Relay:
    """The relay as `publisher serve` makes it: pipelined, told whether the sink
    enforces the predecessor check."""
    options.setdefault("pipeline", DEPTH)
    if isinstance(sender, HttpSender):
        options.setdefault("predecessor_checked", sender.predecessor_checked)
    return relay_for(outbox, sender, mode, **options)


# ---------------------------------------------------------------- data and disk


def assert_all_sent_once(db_rows: Query, db: Path, ids: list[str]) -> None:
    """Every entry marked sent, with the ACK that names it, after one attempt."""
    rows = db_rows(db, "SELECT id, sent, attempts, ack FROM outbox_entries ORDER BY seq")
    assert [(i, s, n) for i, s, n, _ in rows] == [(i, 1, 1) for i in ids]
    assert [json.loads(ack)["ack"] for *_, ack in rows] == ids


def assert_applied_once_in_order(
    db_rows: Query, db: Path, sink_db: Path, events: list[Event], ordering: Ordering
) -> None:
    """Every entry marked sent after one attempt, applied once by the real sink, each
    line in seq order, the inventory totals right."""
    ids = [e["id"] for e in events]
    assert_all_sent_once(db_rows, db, ids)
    assert_applied_in_order(db_rows, db, sink_db, events, ordering)
    assert dict(db_rows(sink_db, "SELECT id, deliveries FROM inbox_events")) == dict.fromkeys(
        ids, 1
    )


def assert_runs_start_alone_then_overlap(
    requests: Sequence[Seen], events: list[Event], ordering: Ordering, *, one_run: bool = True
) -> None:
    """Each line's requests: a run starts with one that went alone and named no
    predecessor (the line's first request does), every other names the entry just
    before its first, and some were handled at once. With `one_run`, one run per line."""
    keyed = lines(events, ordering)
    by_line: dict[Line, list[Seen]] = {}
    for request in requests:
        by_line.setdefault(request.line, []).append(request)
    assert set(by_line) == set(keyed)
    for line, got in by_line.items():
        ids = keyed[line]
        position = {event_id: n for n, event_id in enumerate(ids)}
        # Each ID once, in requests of consecutive entries (arrival order may differ
        # from the order they were sent in: the sink's inbox order is checked apart).
        assert sorted(i for s in got for i in s.ids) == sorted(ids), (line, got)
        for s in got:
            start = position[s.ids[0]]
            assert s.ids == ids[start : start + len(s.ids)], s
        assert got[0].ids == ids[: len(got[0].ids)], got[0]
        starts = [s for s in got if s.after is None]
        assert starts[0] is got[0], got[0]
        assert len(starts) == 1 or not one_run, starts
        for s in starts:
            assert s.in_flight == 1 and not s.overlapped, s
        for s in got:
            if s.after is not None:
                assert s.after == ids[position[s.ids[0]] - 1], s
        assert 1 < max(s.in_flight for s in got) <= DEPTH, (line, got)
    assert {s.status for s in requests} == {200}


# ================================================================ the sink says so


async def call(
    client: aiohttp.ClientSession,
    method: str,
    url: str,
    body: object = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, str | None]:
    """(status, Outbox-Fencing header) of one request."""
    # Bytes are sent as they are (a malformed or an oversized body), from a stream:
    # aiohttp warns of a large body given as bytes.
    data = (
        None
        if body is None
        else io.BytesIO(body if isinstance(body, bytes) else json.dumps(body).encode())
    )
    async with client.request(
        method, url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    ) as response:
        await response.read()
        return response.status, response.headers.get(PREDECESSOR_CHECK_HEADER)


async def test_every_reply_of_the_sink_says_it_enforces_the_predecessor_check(
    serve: Serve, sink_db: Path, client: aiohttp.ClientSession, db_rows: Query
) -> None:
    base = await serve(create_app(sink_db))
    event = {"id": "e1", "sku": "tea", "qty": 5}
    replies: dict[str, tuple[int, str | None]] = {}

    replies["applied"] = await call(client, "POST", f"{base}/events", event)
    replies["duplicate"] = await call(client, "POST", f"{base}/events", event)
    replies["conflict"] = await call(client, "POST", f"{base}/events", {**event, "qty": 6})
    replies["not JSON"] = await call(client, "POST", f"{base}/events", b"{not json")
    # An invalid event: refused, and its ID counts as over for a request naming it, so
    # the request below that names it as its predecessor is refused at once, without
    # the sink's wait.
    replies["invalid"] = await call(
        client, "POST", f"{base}/events", {"id": "ghost", "sku": "tea", "qty": 0}
    )
    replies["predecessor missing"] = await call(
        client,
        "POST",
        f"{base}/events",
        {"id": "e2", "sku": "tea", "qty": 1},
        {PREDECESSOR_HEADER: "ghost"},
    )
    replies["malformed predecessor"] = await call(
        client,
        "POST",
        f"{base}/events",
        {"id": "e2", "sku": "tea", "qty": 1},
        {PREDECESSOR_HEADER: "a b"},
    )
    replies["predecessor present"] = await call(
        client,
        "POST",
        f"{base}/events",
        {"id": "e2", "sku": "tea", "qty": 1},
        {PREDECESSOR_HEADER: "e1"},
    )
    replies["too large"] = await call(client, "POST", f"{base}/events", b" " * (MAX_BODY_BYTES + 1))
    batch = {"events": [{"id": "e3", "sku": "tea", "qty": 1}, {"id": "e4", "sku": "tea", "qty": 1}]}
    replies["batch"] = await call(client, "POST", f"{base}/events/batch", batch)
    replies["batch invalid"] = await call(client, "POST", f"{base}/events/batch", {"events": []})
    replies["batch predecessor missing"] = await call(
        client,
        "POST",
        f"{base}/events/batch",
        {"events": [{"id": "e5", "sku": "tea", "qty": 1}]},
        {PREDECESSOR_HEADER: "ghost"},
    )
    replies["lookup"] = await call(client, "GET", f"{base}/events/e1")
    replies["lookup unknown"] = await call(client, "GET", f"{base}/events/never-sent")
    replies["inventory"] = await call(client, "GET", f"{base}/inventory/tea")
    replies["healthz"] = await call(client, "GET", f"{base}/healthz")
    replies["metrics"] = await call(client, "GET", f"{base}/metrics")
    replies["no route"] = await call(client, "GET", f"{base}/nowhere")
    replies["wrong method"] = await call(client, "PUT", f"{base}/events", event)

    assert {name: status for name, (status, _) in replies.items()} == {
        "applied": 200,
        "duplicate": 200,
        "conflict": 409,
        "not JSON": 400,
        "invalid": 400,
        "predecessor missing": 412,
        "malformed predecessor": 400,
        "predecessor present": 200,
        "too large": 413,
        "batch": 200,
        "batch invalid": 400,
        "batch predecessor missing": 412,
        "lookup": 200,
        "lookup unknown": 404,
        "inventory": 200,
        "healthz": 200,
        "metrics": 200,
        "no route": 404,
        "wrong method": 405,
    }
    assert {name: said for name, (_, said) in replies.items()} == dict.fromkeys(
        replies, PREDECESSOR_CHECK_ENFORCED
    )
    # The refused requests changed nothing: e1, e2 (its predecessor e1), e3 and e4 only.
    ids = [r[0] for r in db_rows(sink_db, "SELECT id FROM inbox_events ORDER BY rowid")]
    assert ids == ["e1", "e2", "e3", "e4"]


async def test_the_sink_says_so_on_401_and_on_its_open_paths_with_a_token(
    serve: Serve, sink_db: Path, client: aiohttp.ClientSession, db_rows: Query
) -> None:
    base = await serve(create_app(sink_db, token=TOKEN))
    event = {"id": "e1", "sku": "tea", "qty": 5}
    good = {"Authorization": f"Bearer {TOKEN}"}
    wrong = {"Authorization": "Bearer wrong-token-wrong-token-1"}

    replies = {
        "missing": await call(client, "POST", f"{base}/events", event),
        "wrong": await call(client, "POST", f"{base}/events", event, wrong),
        "batch missing": await call(client, "POST", f"{base}/events/batch", {"events": [event]}),
        "lookup missing": await call(client, "GET", f"{base}/events/e1"),
        "healthz": await call(client, "GET", f"{base}/healthz"),
        "metrics": await call(client, "GET", f"{base}/metrics"),
        "with token": await call(client, "POST", f"{base}/events", event, good),
    }

    assert replies == {
        "missing": (401, PREDECESSOR_CHECK_ENFORCED),
        "wrong": (401, PREDECESSOR_CHECK_ENFORCED),
        "batch missing": (401, PREDECESSOR_CHECK_ENFORCED),
        "lookup missing": (401, PREDECESSOR_CHECK_ENFORCED),
        "healthz": (200, PREDECESSOR_CHECK_ENFORCED),
        "metrics": (200, PREDECESSOR_CHECK_ENFORCED),
        "with token": (200, PREDECESSOR_CHECK_ENFORCED),
    }
    assert db_rows(sink_db, "SELECT id FROM inbox_events") == [("e1",)]


# ======================================================= HttpSender.enforces_predecessor_check


async def test_sender_says_no_predecessor_check_until_a_reply_of_the_real_sink_says_so(
    serve: Serve, sink_db: Path, db_rows: Query
) -> None:
    url = f"{await serve(create_app(sink_db))}/events"
    event = placed("e1", "tea", 5)

    async with sender_for(url) as sender:
        assert sender.enforces_predecessor_check() is False  # before any request
        assert sender.enforces_predecessor_check() is False  # asking does not change it
        await sender.deliver(event)
        assert sender.enforces_predecessor_check() is True
        # Any reply of the sink says so, refusals and lookups included.
        with pytest.raises(Rejected):
            await sender.deliver(placed("e1", "tea", 6))
        assert sender.enforces_predecessor_check() is True
        assert await sender.lookup("never-sent") is None
        assert sender.enforces_predecessor_check() is True
        async with sender_for(url) as other:
            assert other.enforces_predecessor_check() is False  # each sender by its own replies

    assert db_rows(sink_db, "SELECT id FROM inbox_events") == [("e1",)]


async def test_sender_predecessor_check_follows_the_last_reply(serve: Serve) -> None:
    legacy = LegacySink()
    legacy_url = await start_legacy(serve, legacy)
    events = [placed(f"e{n}", "tea", n) for n in range(1, 9)]
    said: list[tuple[str | None, bool]] = []

    async with sender_for(legacy_url) as sender:
        # Each reply is a verified ACK; only its Outbox-Fencing header changes.
        for event, header in zip(
            events,
            [
                None,
                PREDECESSOR_CHECK_ENFORCED,
                None,
                PREDECESSOR_CHECK_ENFORCED,
                "off",
                PREDECESSOR_CHECK_ENFORCED,
                "",
            ],
            strict=False,
        ):
            legacy.check_header = header
            await sender.deliver(event)
            said.append((header, sender.enforces_predecessor_check()))
        # A reply that is no ACK counts too: the sink's last word on the predecessor check.
        legacy.check_header, legacy.fail_next = None, 1
        with pytest.raises(NotAcknowledged):
            await sender.deliver(events[-1])
        said.append((None, sender.enforces_predecessor_check()))
        # So does a batch reply.
        legacy.check_header = PREDECESSOR_CHECK_ENFORCED
        await sender.deliver_batch(events[-1:])
        said.append((PREDECESSOR_CHECK_ENFORCED, sender.enforces_predecessor_check()))

    assert said == [
        (None, False),
        (PREDECESSOR_CHECK_ENFORCED, True),
        (None, False),
        (PREDECESSOR_CHECK_ENFORCED, True),
        ("off", False),
        (PREDECESSOR_CHECK_ENFORCED, True),
        ("", False),
        (None, False),
        (PREDECESSOR_CHECK_ENFORCED, True),
    ]


async def test_sender_predecessor_check_flips_between_a_legacy_sink_and_the_real_one(
    serve: Serve, sink_db: Path
) -> None:
    # One sender whose target changes sink under it (a deployment rolled back and
    # forward): a proxy on loopback forwards to whichever is current.
    real_url = f"{await serve(create_app(sink_db))}/events"
    legacy_url = await start_legacy(serve, LegacySink())
    target = {"url": real_url}

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=BOUND_S)) as upstream:

        async def forward(request: web.Request) -> web.Response:
            url = target["url"] + request.path.removeprefix("/events")
            headers = {"Content-Type": request.headers.get("Content-Type", "")}
            async with upstream.request(
                request.method, url, data=await request.read(), headers=headers
            ) as reply:
                said = {k: v for k, v in reply.headers.items() if k == PREDECESSOR_CHECK_HEADER}
                return web.Response(
                    status=reply.status,
                    body=await reply.read(),
                    content_type=reply.content_type,
                    headers=said,
                )

        proxy = web.Application()
        proxy.router.add_route("*", "/{tail:.*}", forward)
        proxy_url = f"{await serve(proxy)}/events"
        said: list[tuple[str, bool]] = []
        async with sender_for(proxy_url) as sender:
            for n, name in enumerate(["real", "legacy", "real", "legacy", "real"]):
                target["url"] = real_url if name == "real" else legacy_url
                await sender.deliver(placed(f"e{n}", "tea"))
                said.append((name, sender.enforces_predecessor_check()))

    assert said == [
        ("real", True),
        ("legacy", False),
        ("real", True),
        ("legacy", False),
        ("real", True),
    ]


# ================================================================ a sink that does not say so


@pytest.mark.parametrize("ordering", ORDERINGS)
@pytest.mark.parametrize("mode", MODES)
async def test_against_a_legacy_sink_each_line_sends_one_request_at_a_time_naming_no_predecessor(
    serve: Serve, outbox: Outbox, db: Path, db_rows: Query, mode: Mode, ordering: Ordering
) -> None:
    legacy = LegacySink(Recorder(by_sku=ordering == "sku"), stall_s=LEGACY_STALL_S)
    url = await start_legacy(serve, legacy)
    events = orders(40)
    ids = await accept_events(outbox, events)

    async with sender_for(url) as sender:
        relay = make_relay(outbox, sender, mode, ordering=ordering)
        async with running(relay):
            await eventually(lambda: len(sent_ids(db)) == len(ids))
            assert relay.blocked is None
        assert sender.enforces_predecessor_check() is False

    assert_all_sent_once(db_rows, db, ids)
    requests = legacy.recorder.requests
    size = 1 if mode == "single" else BATCH_LIMIT
    for line, line_ids in lines(events, ordering).items():
        seen = [s for s in requests if s.line == line]
        # In order, each ID once, in requests of consecutive entries of the line.
        assert [i for s in seen for i in s.ids] == line_ids, line
        assert [len(s.ids) for s in seen[:-1]] == [size] * (len(seen) - 1), line
        assert [i for i in legacy.applied if i in set(line_ids)] == line_ids
    assert legacy.recorder.max_in_flight() == dict.fromkeys(lines(events, ordering), 1)
    assert not any(s.overlapped for s in requests)
    assert [s.after for s in requests] == [None] * len(requests)


@pytest.mark.parametrize("mode", MODES)
async def test_a_lane_pipelines_only_on_its_own_replies_not_another_lanes(
    serve: Serve, outbox: Outbox, db: Path, db_rows: Query, mode: Mode
) -> None:
    # The sink's replies say it enforces the predecessor check for juice requests only
    # (two sink versions behind one address, say). The snack lane shares the sender
    # with the juice lane, but never got such a reply itself: it stays at one, naming
    # no predecessor.
    legacy = LegacySink(
        Recorder(by_sku=True),
        stall_s=LEGACY_STALL_S,
        check_header=PREDECESSOR_CHECK_ENFORCED,
        check_header_skus=frozenset({"juice"}),
    )
    url = await start_legacy(serve, legacy)
    events = orders(120, skus=("snack", "juice"))
    ids = await accept_events(outbox, events)

    async with sender_for(url) as sender:
        relay = make_relay(outbox, sender, mode, ordering="sku")
        async with running(relay):
            await eventually(lambda: len(sent_ids(db)) == len(ids))

    assert_all_sent_once(db_rows, db, ids)
    requests = legacy.recorder.requests
    snack = [s for s in requests if s.line == "snack"]
    juice = [s for s in requests if s.line == "juice"]
    assert [(s.after, s.overlapped) for s in snack] == [(None, False)] * len(snack)
    assert legacy.recorder.max_in_flight()["snack"] == 1
    assert 1 < legacy.recorder.max_in_flight()["juice"] <= DEPTH
    assert juice[0].after is None and all(s.after is not None for s in juice[1:])


async def test_sender_remembers_what_each_requests_reply_said(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(publisher_http, "CHECKED_REPLIES_KEPT", 3)
    legacy = LegacySink(
        check_header=PREDECESSOR_CHECK_ENFORCED, check_header_skus=frozenset({"juice"})
    )
    url = await start_legacy(serve, legacy)
    juice = [placed(f"j{n}", "juice") for n in range(4)]
    snack = placed("s0", "snack")

    async with sender_for(url) as sender:
        assert sender.predecessor_checked("j0") is False  # no reply yet
        await sender.deliver(juice[0])
        await sender.deliver_batch([snack, juice[1]])
        assert (sender.predecessor_checked("j0"), sender.predecessor_checked("s0")) == (True, False)
        assert sender.predecessor_checked("j1") is False  # not the first of its request
        assert sender.enforces_predecessor_check() is False  # the last reply, whoever it was for
        await sender.deliver(juice[1])
        assert (sender.predecessor_checked("j1"), sender.enforces_predecessor_check()) == (
            True,
            True,
        )
        await sender.deliver_batch(juice[2:])
        # Three requests are remembered: the oldest one, j0's, is forgotten.
        assert [sender.predecessor_checked(i) for i in ("j0", "s0", "j1", "j2")] == [
            False,
            False,
            True,
            True,
        ]
        assert sender.predecessor_checked("j3") is False


# ================================================================ the real sink


@pytest.mark.parametrize("ordering", ORDERINGS)
@pytest.mark.parametrize("mode", MODES)
async def test_against_the_real_sink_a_run_starts_alone_then_pipelines(
    serve: Serve,
    outbox: Outbox,
    db: Path,
    sink_db: Path,
    db_rows: Query,
    mode: Mode,
    ordering: Ordering,
) -> None:
    recorder = Recorder(by_sku=ordering == "sku")
    url = await start_sink(serve, sink_db, recorder, stall_s=SINK_STALL_S)
    events = orders(40)
    ids = await accept_events(outbox, events)

    async with sender_for(url) as sender:
        relay = make_relay(outbox, sender, mode, ordering=ordering)
        async with running(relay):
            await eventually(lambda: len(sent_ids(db)) == len(ids))
            assert relay.blocked is None

    assert_applied_once_in_order(db_rows, db, sink_db, events, ordering)
    assert_runs_start_alone_then_overlap(recorder.requests, events, ordering)


@pytest.mark.parametrize("ordering", ORDERINGS)
@pytest.mark.parametrize("mode", MODES)
async def test_each_new_run_starts_alone_again(
    serve: Serve,
    outbox: Outbox,
    db: Path,
    sink_db: Path,
    db_rows: Query,
    mode: Mode,
    ordering: Ordering,
) -> None:
    recorder = Recorder(by_sku=ordering == "sku")
    url = await start_sink(serve, sink_db, recorder, stall_s=SINK_STALL_S)
    first = orders(36)
    second = orders(48, start=len(first))
    await accept_events(outbox, first)

    async with sender_for(url) as sender:
        # Runs only at the start and when woken: the second backlog is one new run.
        relay = make_relay(outbox, sender, mode, ordering=ordering, poll_interval_s=IDLE_POLL_S)
        async with running(relay):
            await eventually(lambda: len(sent_ids(db)) == len(first))
            await eventually(lambda: not any(recorder.handling.values()))
            assert sender.enforces_predecessor_check() is True  # the sink's last reply said so
            # Lanes that end wake the relay for a last look: let it go idle first, so
            # it does not start a run on the first few of the entries accepted next.
            await asyncio.sleep(SETTLE_S)
            done = len(recorder.requests)
            await accept_events(outbox, second)
            relay.wake()
            await eventually(lambda: len(sent_ids(db)) == len(first) + len(second))
            assert relay.blocked is None

    assert_applied_once_in_order(db_rows, db, sink_db, first + second, ordering)
    assert_runs_start_alone_then_overlap(recorder.requests[:done], first, ordering)
    # Should the relay still have started a run early, that run starts alone too.
    assert_runs_start_alone_then_overlap(recorder.requests[done:], second, ordering, one_run=False)


# ================================================================ the sink stops saying so


@pytest.mark.parametrize("mode", MODES)
async def test_a_reply_without_the_header_mid_run_goes_back_to_one_at_a_time(
    serve: Serve, outbox: Outbox, db: Path, db_rows: Query, mode: Mode
) -> None:
    off_at = 12  # the request (by arrival) from which the sink's replies stop saying so
    legacy = LegacySink(
        stall_s=LEGACY_STALL_S, check_header=PREDECESSOR_CHECK_ENFORCED, off_at=off_at
    )
    url = await start_legacy(serve, legacy)
    events = orders(48 if mode == "single" else 48 * BATCH_LIMIT)
    ids = await accept_events(outbox, events)

    async with sender_for(url) as sender:
        watched = Watched(sender)
        relay = make_relay(
            outbox,
            watched,
            mode,
            predecessor_checked=sender.predecessor_checked,
            after_delivery=watched.after_delivery,
        )
        async with running(relay):
            await eventually(lambda: len(sent_ids(db)) == len(ids))
            assert relay.blocked is None

    assert_all_sent_once(db_rows, db, ids)
    assert sorted(legacy.applied) == ids
    calls, requests = watched.calls, legacy.recorder.requests
    assert sorted(i for c in calls for i in c.ids) == ids  # each sent once
    assert legacy.off_time is not None

    # Before the switch: the first request alone, naming no predecessor, then pipelined.
    assert (calls[0].after, calls[0].untaken) == (None, 0)
    assert watched.downgrade is not None
    made, untaken = watched.downgrade
    before = calls[:made]
    assert 1 <= max(c.untaken for c in before) < DEPTH, "never pipelined before the switch"
    assert all(c.after is not None for c in before[1:])
    # The switch came while requests made before it were in flight (the one the
    # header went off on among them), and the relay took a reply without the header
    # while others were still in flight: those finish.
    assert made > off_at
    assert untaken >= 1, watched.downgrade

    # From then on: no request while another is in flight, and none names a predecessor.
    later = calls[made:]
    assert len(later) >= 10
    assert [(c.untaken, c.unanswered, c.after) for c in later] == [(0, 0, None)] * len(later)
    # At the sink: each arrived after the one before was over, naming no predecessor.
    late = requests[made:]
    assert [s.ids for s in late] == [c.ids for c in later]
    assert [(s.in_flight, s.overlapped, s.after) for s in late] == [(1, False, None)] * len(late)
    assert all(s.arrived > legacy.off_time for s in late)
