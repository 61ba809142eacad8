"""The relay reads its next batch while the current one is in flight; a batch's verified
prefix is logged as one line; `Outbox.mark_sent_many` marks a mixed batch like single marks.

Real SQLite files and a loopback sink that records each request as it arrives. Every
outbox read is recorded by a wrapper on the instance that calls the real method, so the
order of reads and requests can be checked; the disk is read through independent sqlite3
connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import web
from relay_lines import relay_of
from support import accept_numbered, ack, eventually, placed, sent_events, sent_ids

from publisher.cli.dispatch import deliver_pending
from publisher.driver import Driver, OutboxLine
from publisher.errors import DeliveryError
from publisher.http import HttpSender
from publisher.relay import Relay
from publisher.retry import RetryPolicy
from publisher.settings import RelaySettings
from publisher.store import Outbox, State
from shared import MAX_BATCH, Event, Receipt, make_ack

if TYPE_CHECKING:
    from conftest import Query, Serve

FAST = RetryPolicy(base_s=0.02, cap_s=0.1)  # a permanent failure waits 0.05 to 0.1 s
POLL_INTERVAL_S = 0.05
WAIT_S = 1.5
STOP_TIMEOUT_S = 1.0
# sent_at and quarantined_at come from time.time(); a short pause keeps them apart.
TICK_S = 0.01

Rows = list[tuple[int, Event, int]]


# ---------------------------------------------------------------- what happened, in order


@dataclass
class Read:
    """One call of Outbox.pending_batch: the IDs it was told to skip and what it found."""

    skip: frozenset[str]
    ids: list[str] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Timeline:
    """Outbox reads (recorded when called) and sink requests (recorded on arrival and
    just before the reply), in the order they happened."""

    steps: list[str] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)

    def until(self, step: str) -> list[str]:
        return self.steps[: self.steps.index(step) + 1]


def record_reads(outbox: Outbox, timeline: Timeline, monkeypatch: pytest.MonkeyPatch) -> None:
    """Wrap pending_batch on this instance: each call is recorded, then the real one runs."""
    real = outbox.pending_batch

    def pending_batch(
        limit: int = MAX_BATCH, lane: str | None = None, skip: Iterable[str] = ()
    ) -> Coroutine[Any, Any, Rows]:
        # Recorded at the call, not when the coroutine first runs: a read-ahead is
        # started with ensure_future just before its batch's request is made.
        read = Read(frozenset(skip))
        timeline.reads.append(read)
        timeline.steps.append("read")

        async def run() -> Rows:
            rows = await real(limit, lane, read.skip)
            read.ids = [row.event["id"] for row in rows]
            read.done.set()
            return rows

        return run()

    monkeypatch.setattr(outbox, "pending_batch", pending_batch)


# ---------------------------------------------------------------- a sink we can steer

Answer = Callable[[int, list[Event]], web.Response | None]
OnRequest = Callable[[int, list[str]], Awaitable[None]]


def acks(events: list[Event]) -> list[dict[str, str]]:
    return [ack(e) for e in events]


def conflict_at(events: list[Event], k: int) -> web.Response:
    """The batch reply of a sink that applied the first k events and refused event k."""
    rejected = {"index": k, "status": 409, "error": "conflict", "id": events[k]["id"]}
    return web.json_response({"acks": acks(events[:k]), "rejected": rejected})


def wrong_ack_at(events: list[Event], k: int) -> web.Response:
    """A batch reply whose ACK at k names another event: not verified, may be retried."""
    wrong = make_ack("intruder", Receipt.APPLIED)
    return web.json_response({"acks": [*acks(events[:k]), wrong], "rejected": None})


def unavailable(events: list[Event]) -> web.Response:
    return web.json_response({"error": "overloaded"}, status=503)


@dataclass
class Sink:
    """A loopback /events and /events/batch that ACK like the real sink.

    Request n (from 1) is recorded on arrival; `on_request(n, ids)` is awaited then, and
    `answer(n, events)` may give the reply instead of the ACKs.
    """

    timeline: Timeline
    answer: Answer | None = None
    on_request: OnRequest | None = None
    requests: list[list[str]] = field(default_factory=list)

    async def post_event(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        assert isinstance(body, dict)  # one CloudEvent, structured mode
        return await self._reply(sent_events(body), single=True)

    async def post_batch(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        assert isinstance(body, list)  # an array of CloudEvents, batched mode
        return await self._reply(sent_events(body), single=False)

    async def _reply(self, events: list[Event], single: bool) -> web.Response:
        ids = [e["id"] for e in events]
        self.requests.append(ids)
        self.timeline.steps.append(f"recv {ids[0]}")
        n = len(self.requests)
        if self.on_request is not None:
            await self.on_request(n, ids)
        response = None if self.answer is None else self.answer(n, events)
        if response is None:
            body = acks(events)
            response = web.json_response(body[0] if single else {"acks": body, "rejected": None})
        self.timeline.steps.append(f"reply {ids[0]}")
        return response


@pytest.fixture
def timeline(outbox: Outbox, monkeypatch: pytest.MonkeyPatch) -> Timeline:
    recorded = Timeline()
    record_reads(outbox, recorded, monkeypatch)
    return recorded


@pytest.fixture
def sink(timeline: Timeline) -> Sink:
    return Sink(timeline)


@pytest.fixture
async def sink_url(serve: Serve, sink: Sink) -> str:
    app = web.Application()
    app.router.add_post("/events", sink.post_event)
    app.router.add_post("/events/batch", sink.post_batch)
    return f"{await serve(app)}/events"


@contextlib.asynccontextmanager
async def relay_for(
    outbox: Outbox, url: str, *, batch: bool, **options: Any
) -> AsyncIterator[Relay]:
    """A running relay, in batch mode or one request per entry; stopped (bounded) on exit,
    and a crash of its loop is raised."""
    options.setdefault("retry", FAST)
    options.setdefault("poll_interval_s", POLL_INTERVAL_S)
    async with HttpSender(url, timeout_s=1.0, connect_timeout_s=0.5) as sender:
        deliver_batch = sender.deliver_batch if batch else None
        relay = relay_of(outbox, sender.deliver, deliver_batch=deliver_batch, **options)
        task = asyncio.create_task(relay.run())
        try:
            yield relay
        finally:
            relay.stop()
            await asyncio.wait_for(task, STOP_TIMEOUT_S)


def attempts(db_rows: Query, db: Path) -> dict[str, int]:
    return dict(db_rows(db, "SELECT id, attempts FROM outbox_entries"))


def skips_what_is_held(read: Read, earlier: list[str], in_flight: str) -> bool:
    """A read made ahead leaves out the entry in flight, and may leave out entries
    sent before it whose marks are still being committed, but nothing else."""
    return in_flight in read.skip and read.skip <= frozenset(earlier)


def steps_for(ids: list[str]) -> list[str]:
    return [step for i in ids for step in (f"recv {i}", f"reply {i}")]


# ================================================================ batch mode


async def test_batch_mode_reads_each_next_batch_while_the_current_one_is_in_flight(
    outbox: Outbox, db: Path, db_rows: Query, timeline: Timeline, sink: Sink, sink_url: str
) -> None:
    ids = await accept_numbered(outbox, 3 * 16 + 5)
    batches = [ids[0:16], ids[16:32], ids[32:48], ids[48:]]

    async with relay_for(outbox, sink_url, batch=True) as relay:
        await eventually(lambda: len(sent_ids(db)) == len(ids), WAIT_S)
        await eventually(lambda: relay.blocked is None, WAIT_S)

    assert sink.requests == batches  # in seq order, each entry sent exactly once
    # The read for batch k+1 is made while batch k is at the sink, so no read stands
    # between one reply and the next request; without the read-ahead, one would. It
    # replaces the read pending() would make: four reads for four batches, none wasted.
    assert timeline.until(f"reply {ids[48]}") == [
        "read",
        "read",
        *steps_for([ids[0]]),
        "read",
        *steps_for([ids[16]]),
        "read",
        *steps_for([ids[32]]),
        *steps_for([ids[48]]),  # the partial batch 4 reads nothing ahead
    ]
    first, *ahead = timeline.reads[:4]
    assert (first.skip, first.ids) == (frozenset(), batches[0])
    # Each read-ahead skips the batch in flight, and those before it whose marks may
    # still be committing, and nothing else.
    assert [read.ids for read in ahead] == batches[1:]
    assert ahead[0].skip == frozenset(batches[0])
    for n, read in enumerate(ahead[1:], start=2):
        assert frozenset(batches[n - 1]) <= read.skip <= frozenset(ids[: 16 * n])
    assert sent_ids(db) == ids
    assert attempts(db_rows, db) == dict.fromkeys(ids, 1)
    stored: dict[str, str] = dict(db_rows(db, "SELECT id, ack FROM outbox_entries"))
    assert {i: json.loads(stored[i]) for i in ids} == {i: ack(placed(i)) for i in ids}


async def test_an_entry_quarantined_after_it_was_read_ahead_is_sent_and_closed_as_delivered(
    outbox: Outbox, db: Path, db_rows: Query, timeline: Timeline, sink: Sink, sink_url: str
) -> None:
    # The accepted race, pinned: an operator quarantines an entry of batch 2 while batch
    # 1 is at the sink and batch 2 has already been read ahead. Batch 2 goes as read, so
    # the entry is delivered, and its mark closes the quarantine as "delivered".
    ids = await accept_numbered(outbox, 20)
    victim = ids[17]

    async with Outbox.open(db) as operator:

        async def quarantine_during_batch_1(n: int, sent: list[str]) -> None:
            if n == 1 and len(timeline.reads) == 2:
                await asyncio.wait_for(timeline.reads[1].done.wait(), WAIT_S)
                await operator.quarantine(victim, "looked stuck", "alice")

        sink.on_request = quarantine_during_batch_1
        async with relay_for(outbox, sink_url, batch=True):
            await eventually(lambda: len(sent_ids(db)) == len(ids), WAIT_S)

        assert timeline.reads[1].ids == ids[16:]  # read before the quarantine committed
        assert sink.requests == [ids[:16], ids[16:]]
        entry = await operator.entry(victim)
        assert entry is not None and (entry.state, entry.attempts) == (State.SENT, 1)
        [record] = await operator.quarantines(victim)
        assert (record.quarantined_by, record.released_by, record.released_as) == (
            "alice",
            "relay",
            "delivered",
        )
        assert (await operator.snapshot()).quarantined == 0

    assert db_rows(db, "SELECT sent, quarantined FROM outbox_entries WHERE id = ?", (victim,)) == [
        (1, 0)
    ]
    assert db_rows(
        db, "SELECT released_by, released_as FROM outbox_quarantines WHERE id = ?", (victim,)
    ) == [("relay", "delivered")]


@pytest.mark.parametrize(
    ("answer", "failed_at"),
    [(lambda events: conflict_at(events, 4), 20), (unavailable, 16)],
    ids=["409-on-item-5", "503-for-the-request"],
)
async def test_a_batch_failing_partway_drops_the_read_ahead_and_the_retry_starts_at_the_failure(
    outbox: Outbox,
    db: Path,
    db_rows: Query,
    timeline: Timeline,
    sink: Sink,
    sink_url: str,
    answer: Callable[[list[Event]], web.Response],
    failed_at: int,
) -> None:
    ids = await accept_numbered(outbox, 40)
    marked_at_retry: list[list[str]] = []

    async def look_at_the_disk(n: int, sent: list[str]) -> None:
        if n == 3:
            marked_at_retry.append(sent_ids(db))

    sink.answer = lambda n, events: answer(events) if n == 2 else None
    sink.on_request = look_at_the_disk
    async with relay_for(outbox, sink_url, batch=True):
        await eventually(lambda: len(sent_ids(db)) == len(ids), WAIT_S)

    k = failed_at
    assert sink.requests == [ids[0:16], ids[16:32], ids[k : k + 16], ids[k + 16 :]]
    assert marked_at_retry == [ids[:k]]  # nothing after the failure was marked
    # Batch 3 was read ahead while batch 2 was in flight, then not used: the retry read
    # afresh from the failed entry.
    assert [read.ids for read in timeline.reads[:4]] == [
        ids[0:16],
        ids[16:32],
        ids[32:40],
        ids[k : k + 16],
    ]
    assert timeline.reads[3].skip == frozenset()
    assert sent_ids(db) == ids
    assert attempts(db_rows, db) == {i: 2 if i == ids[k] else 1 for i in ids}


def batch_driver(outbox: Outbox, sender: HttpSender, batch: bool = True) -> Driver:
    """The relay's driver of the global line: batches of 16 (or one event) per request,
    one request in flight, reading on until the line is drained."""
    return Driver(OutboxLine(outbox), sender, once_through(batch))


def once_through(batch: bool = True) -> RelaySettings:
    """Reads of 16, one request in flight, no leases."""
    return RelaySettings(limit=16, batch=batch, pipeline=1, worker=None)


@pytest.mark.parametrize("how", ["kept", "next-run"])
async def test_a_read_ahead_serves_its_own_run_only(
    outbox: Outbox, timeline: Timeline, sink: Sink, sink_url: str, how: str
) -> None:
    # Quarantined after the next batch was read ahead: that run sends the batch as
    # read (the accepted race); a run that starts afterwards reads afresh and leaves
    # the entry out.
    ids = await accept_numbered(outbox, 20)

    async def quarantine_after_the_read_ahead(n: int, sent: list[str]) -> None:
        if n == 1:
            await asyncio.wait_for(timeline.reads[1].done.wait(), WAIT_S)
            await outbox.quarantine(ids[16], "looked stuck", "alice")

    async with HttpSender(sink_url, timeout_s=1.0, connect_timeout_s=0.5) as sender:
        if how == "kept":
            sink.on_request = quarantine_after_the_read_ahead
            assert await batch_driver(outbox, sender).run() == 20
        else:
            assert await deliver_pending(outbox, sender, once_through()) == ids[:16]
            await outbox.quarantine(ids[16], "looked stuck", "alice")
            assert await deliver_pending(outbox, sender, once_through()) == ids[17:]

    expected = ids[16:] if how == "kept" else ids[17:]
    assert sink.requests == [ids[:16], expected]
    assert [read.ids for read in timeline.reads] == [ids[:16], expected]


@pytest.mark.parametrize(
    ("batch", "answer", "failed_at"),
    [
        (True, lambda n, events: conflict_at(events, 4) if n == 1 else None, 4),
        (True, lambda n, events: unavailable(events) if n == 1 else None, 0),
        (False, lambda n, events: unavailable(events) if n == 16 else None, 15),
    ],
    ids=["batch-409-on-item-5", "batch-503-for-the-request", "single-503-on-the-16th"],
)
async def test_a_failed_run_drops_its_read_ahead(
    outbox: Outbox,
    timeline: Timeline,
    sink: Sink,
    sink_url: str,
    batch: bool,
    answer: Answer,
    failed_at: int,
) -> None:
    # The driver on its own, run again straight after the failure: the next run reads
    # afresh from the failed entry, not what was read ahead.
    ids = await accept_numbered(outbox, 40)
    sink.answer = answer
    async with HttpSender(sink_url, timeout_s=1.0, connect_timeout_s=0.5) as sender:
        driver = batch_driver(outbox, sender, batch)
        with pytest.raises(DeliveryError):
            await driver.run()
        failed = len(sink.requests)
        await driver.run()

    k = failed_at
    again = sink.requests[failed]
    assert again == (ids[k : k + 16] if batch else [ids[k]])
    assert [read.ids for read in timeline.reads[:3]] == [ids[:16], ids[16:32], ids[k : k + 16]]
    assert skips_what_is_held(timeline.reads[1], ids[:16], ids[15])


async def test_an_entry_redriven_after_the_next_batch_was_read_ahead_goes_after_that_batch(
    outbox: Outbox, db: Path, db_rows: Query, timeline: Timeline, sink: Sink, sink_url: str
) -> None:
    # Pinned as it is (see the report of this change): a redrive "so it goes next" that
    # commits while batch 1 is in flight waits behind batch 2, already read ahead, and
    # reaches the sink after entries of a higher seq.
    ids = await accept_numbered(outbox, 33)
    held = ids[0]
    await outbox.quarantine(held, "held back", "alice")

    async def redrive_during_batch_1(n: int, sent: list[str]) -> None:
        if n == 1 and len(timeline.reads) == 2:
            await asyncio.wait_for(timeline.reads[1].done.wait(), WAIT_S)
            await outbox.redrive(held, "bob")

    sink.on_request = redrive_during_batch_1
    async with relay_for(outbox, sink_url, batch=True):
        await eventually(lambda: len(sent_ids(db)) == len(ids), WAIT_S)

    assert sink.requests == [ids[1:17], ids[17:33], [held]]
    [record] = await outbox.quarantines(held)
    assert (record.released_by, record.released_as) == ("bob", "redriven")


# ================================================================ one request per entry


async def test_single_mode_reads_ahead_at_the_last_entry_of_a_full_batch(
    outbox: Outbox, db: Path, db_rows: Query, timeline: Timeline, sink: Sink, sink_url: str
) -> None:
    ids = await accept_numbered(outbox, 40)

    async with relay_for(outbox, sink_url, batch=False, limit=16):
        await eventually(lambda: len(sent_ids(db)) == len(ids), WAIT_S)

    assert sink.requests == [[i] for i in ids]  # in order, each exactly once
    expected = [
        "read",
        *steps_for(ids[0:15]),
        "read",  # while the 16th entry is sent
        *steps_for(ids[15:31]),
        "read",
        *steps_for(ids[31:40]),
    ]
    assert timeline.until(f"reply {ids[-1]}") == expected
    assert [read.ids for read in timeline.reads[:3]] == [ids[0:16], ids[16:32], ids[32:40]]
    assert timeline.reads[0].skip == frozenset()
    assert skips_what_is_held(timeline.reads[1], ids[0:16], ids[15])
    assert skips_what_is_held(timeline.reads[2], ids[0:32], ids[31])
    assert sent_ids(db) == ids
    assert attempts(db_rows, db) == dict.fromkeys(ids, 1)


async def test_single_mode_a_failure_on_the_16th_entry_drops_the_read_ahead_and_resends_it_first(
    outbox: Outbox, db: Path, db_rows: Query, timeline: Timeline, sink: Sink, sink_url: str
) -> None:
    ids = await accept_numbered(outbox, 40)
    marked_at_retry: list[list[str]] = []

    def fail_the_16th_once(n: int, events: list[Event]) -> web.Response | None:
        return unavailable(events) if n == 16 else None

    async def look_at_the_disk(n: int, sent: list[str]) -> None:
        if n == 17:
            marked_at_retry.append(sent_ids(db))

    sink.answer = fail_the_16th_once
    sink.on_request = look_at_the_disk
    async with relay_for(outbox, sink_url, batch=False, limit=16):
        await eventually(lambda: len(sent_ids(db)) == len(ids), WAIT_S)

    assert sink.requests == [[i] for i in ids[:16] + ids[15:]]
    assert marked_at_retry == [ids[:15]]  # the 16th and all after it stayed pending
    # The second read was made ahead, then dropped; the retry read afresh.
    reads = [ids[0:16], ids[16:32], ids[15:31], ids[31:40]]
    assert [read.ids for read in timeline.reads[:4]] == reads
    assert timeline.reads[0].skip == timeline.reads[2].skip == frozenset()
    assert skips_what_is_held(timeline.reads[1], ids[0:16], ids[15])
    assert skips_what_is_held(timeline.reads[3], ids[0:31], ids[30])
    assert sent_ids(db) == ids
    assert attempts(db_rows, db) == {i: 2 if i == ids[15] else 1 for i in ids}


# ================================================================ one log line per request

DELIVERY_FIELDS = ("event_id", "seq", "attempt", "outcome", "count", "last_seq", "event_ids")


class Outcomes:
    """An Observer that keeps every delivery outcome."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def delivery(self, outcome: str) -> None:
        self.seen.append(outcome)


@pytest.mark.parametrize(
    ("answer", "k", "outcome"),
    [
        (lambda events: conflict_at(events, 2), 2, "permanent"),
        (lambda events: wrong_ack_at(events, 2), 2, "transient"),
        (unavailable, 0, "transient"),
    ],
    ids=["409-on-item-3", "wrong-ack-on-item-3", "503-for-the-request"],
)
async def test_batch_mode_logs_one_delivery_line_per_request_and_one_per_failed_item(
    outbox: Outbox,
    db: Path,
    db_rows: Query,
    sink: Sink,
    sink_url: str,
    caplog: pytest.LogCaptureFixture,
    answer: Callable[[list[Event]], web.Response],
    k: int,
    outcome: str,
) -> None:
    caplog.set_level(logging.INFO, logger="publisher.relay")
    ids = await accept_numbered(outbox, 5)
    outcomes = Outcomes()
    sink.answer = lambda n, events: answer(events) if n == 1 else None

    async with relay_for(outbox, sink_url, batch=True, observer=outcomes):
        await eventually(lambda: len(sent_ids(db)) == len(ids), WAIT_S)

    assert sink.requests == [ids, ids[k:]]
    records = [r for r in caplog.records if r.name == "publisher.relay"]
    deliveries = [r for r in records if r.getMessage() == "delivery"]
    logged = [(r.levelno, {f: vars(r).get(f) for f in DELIVERY_FIELDS}) for r in deliveries]
    prefix = (
        logging.INFO,
        {
            "event_id": ids[0],
            "seq": 1,
            "attempt": 1,
            "outcome": "delivered",
            "count": k,
            "last_seq": k,
            "event_ids": ids[:k],
        },
    )
    failed = (
        logging.WARNING,
        {"event_id": ids[k], "seq": k + 1, "attempt": 1, "outcome": outcome}
        | dict.fromkeys(("count", "last_seq", "event_ids")),
    )
    retried = (
        logging.INFO,
        {
            "event_id": ids[k],
            "seq": k + 1,
            "attempt": 2,
            "outcome": "delivered",
            "count": len(ids) - k,
            "last_seq": len(ids),
            "event_ids": ids[k:],
        },
    )
    assert logged == ([prefix] if k else []) + [failed, retried]
    assert all(vars(r)["latency_ms"] >= 0 for r in deliveries)
    assert ids[k] in vars(deliveries[-2])["error"]
    assert outcomes.seen == ["delivered"] * k + [outcome] + ["delivered"] * (len(ids) - k)


# ================================================================ Outbox.mark_sent_many


async def test_mark_sent_many_closes_the_quarantine_as_single_marks_in_order_would(
    tmp_path: Path,
) -> None:
    # a, b and c were sent in that order: c was not delivered past b. Marking the pending
    # ones first and b afterwards would record c in b's "delivered past" list.
    records = []
    for many in (False, True):
        async with Outbox.open(tmp_path / f"source-{many}.db") as outbox:
            ids = await accept_numbered(outbox, 3)
            await outbox.quarantine(ids[1], "looked stuck", "alice")
            await asyncio.sleep(TICK_S)
            if many:
                await outbox.mark_sent_many([(i, None) for i in ids])
            else:
                for i in ids:
                    await outbox.mark_sent(i)
            [record] = await outbox.quarantines(ids[1])
            records.append((record.released_as, record.delivered_past_count, record.delivered_past))

    assert records[0] == ("delivered", 0, [])
    assert records[1] == records[0]
