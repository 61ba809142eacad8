"""Pipelined delivery: up to N requests of a line in flight, each naming its predecessor,
results taken in order.

The sink is the real application (sink.create_app) over a real inbox file, served on
loopback, with a recording middleware in front of it (recorded_sink) that sees each
request as it arrives: its events, its Outbox-After header and the status it got. Failures are
injected by the sink's own chaos settings (reject_skus, stall_s, drop_after_commit)
or by a wrapper around HttpSender on the relay side. Both databases are read through
independent sqlite3 connections.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

import pytest
from recorded_sink import Recorder, WrappedSender, assert_applied_in_order, start_sink
from relay_lines import (
    BATCH_LIMIT,
    MODES,
    ORDERINGS,
    STOP_TIMEOUT_S,
    Mode,
    lines,
    orders,
    relay_for,
    relay_of,
    running,
    sender_for,
)
from support import accept_events, deliveries, eventually, inbox_ids, sent_ids

from publisher.errors import DeliveryError
from publisher.settings import Ordering
from publisher.store import Outbox
from shared import Event, Lease

if TYPE_CHECKING:
    from conftest import Query, Serve

T = TypeVar("T")


# ---------------------------------------------------------------- the relay side


@dataclass
class Flaky(WrappedSender):
    """HttpSender's deliver and deliver_batch as the relay calls them, with chaos.

    Each request draws once: below fail_rate/2 it fails before it is sent, below
    fail_rate it is sent and its reply is lost (the sink committed). `script` fails
    the first request starting at that ID the way it names. Each reply is held up to
    `jitter_s`, so requests finish out of order.
    """

    rng: random.Random = field(default_factory=lambda: random.Random(0))
    fail_rate: float = 0.0
    jitter_s: float = 0.0
    script: dict[str, Literal["before", "lost"]] = field(default_factory=dict)
    calls: list[tuple[list[str], str | None]] = field(default_factory=list)
    finished: list[list[str]] = field(default_factory=list)
    cancelled: list[list[str]] = field(default_factory=list)
    failed: dict[str, int] = field(default_factory=lambda: {"before": 0, "lost": 0})

    async def _request(
        self,
        events: Sequence[Event],
        after: str | None,
        send: Callable[[], Awaitable[T]],
        lease: Lease | None,
    ) -> T:
        ids = [e["id"] for e in events]
        self.calls.append((ids, after))
        roll, hold_s = self.rng.random(), self.rng.uniform(0, self.jitter_s)
        how = self.script.pop(ids[0], None)
        if how is None and roll < self.fail_rate:
            how = "before" if roll < self.fail_rate / 2 else "lost"
        try:
            if how == "before":
                self.failed["before"] += 1
                raise DeliveryError(f"{ids[0]}: chaos: failed before it was sent")
            result = await send()
            await asyncio.sleep(hold_s)
            if how == "lost":
                self.failed["lost"] += 1
                raise DeliveryError(f"{ids[0]}: chaos: the reply was lost")
            self.finished.append(ids)
            return result
        except asyncio.CancelledError:
            self.cancelled.append(ids)
            raise


# ---------------------------------------------------------------- data and disk


def outbox_state(db_rows: Query, db: Path) -> dict[str, tuple[int, int]]:
    """id -> (sent, attempts)."""
    return {i: (s, n) for i, s, n in db_rows(db, "SELECT id, sent, attempts FROM outbox_entries")}


def assert_runs_name_predecessors(
    recorder: Recorder, events: list[Event], ordering: Ordering, *, one_run: bool
) -> None:
    """Every request holds consecutive entries of one line and names, in Outbox-After,
    the entry just before its first. A request naming no predecessor starts a run: with
    `one_run`, only the one at the head of each line."""
    for line in lines(events, ordering).values():
        position = {event_id: n for n, event_id in enumerate(line)}
        for seen in (r for r in recorder.requests if r.ids[0] in position):
            start = position[seen.ids[0]]
            assert seen.ids == line[start : start + len(seen.ids)], seen
            before = line[start - 1] if start else None
            assert seen.after in ((before,) if one_run else (before, None)), seen


# ================================================================ draining a backlog


@pytest.mark.parametrize("depth", [2, 8])
@pytest.mark.parametrize("ordering", ORDERINGS)
@pytest.mark.parametrize("mode", MODES)
async def test_a_backlog_drains_in_order_with_requests_overlapping_each_naming_its_predecessor(
    serve: Serve,
    outbox: Outbox,
    db: Path,
    sink_db: Path,
    db_rows: Query,
    mode: Mode,
    ordering: Ordering,
    depth: int,
) -> None:
    recorder = Recorder(by_sku=ordering == "sku")
    # Each request waits at the sink, so a pipeline shows as requests handled at once.
    url = await start_sink(serve, sink_db, recorder, stall_s=0.02)
    events = orders(48)
    ids = await accept_events(outbox, events)

    async with sender_for(url) as sender:
        relay = relay_for(outbox, sender, mode, ordering=ordering, pipeline=depth)
        async with running(relay):
            await eventually(lambda: len(sent_ids(db)) == len(ids))
            assert relay.blocked is None

    assert_applied_in_order(db_rows, db, sink_db, events, ordering)
    assert deliveries(sink_db) == dict.fromkeys(ids, 1)
    assert outbox_state(db_rows, db) == dict.fromkeys(ids, (1, 1))
    # One request per entry (single) or per BATCH_LIMIT entries, each sent once.
    size = 1 if mode == "single" else BATCH_LIMIT
    assert sorted(i for r in recorder.requests for i in r.ids) == ids
    assert all(len(r.ids) == size and r.status == 200 for r in recorder.requests), recorder.requests
    assert_runs_name_predecessors(recorder, events, ordering, one_run=True)
    for line in lines(events, ordering):
        assert 1 < recorder.max_in_flight()[line] <= depth, (line, recorder.max_in_flight())


async def test_without_pipelining_requests_name_no_predecessor_and_never_overlap(
    serve: Serve, outbox: Outbox, db: Path, sink_db: Path, db_rows: Query
) -> None:
    # The control for the test above: pipeline=1 is the old path, one request at a time.
    recorder = Recorder()
    url = await start_sink(serve, sink_db, recorder, stall_s=0.02)
    events = orders(12)
    await accept_events(outbox, events)

    async with sender_for(url) as sender:
        relay = relay_for(outbox, sender, "single")
        async with running(relay):
            await eventually(lambda: len(sent_ids(db)) == len(events))

    assert_applied_in_order(db_rows, db, sink_db, events, "global")
    assert [r.after for r in recorder.requests] == [None] * len(events)
    assert recorder.max_in_flight() == {None: 1}


# ================================================================ a rejected entry


@pytest.mark.parametrize("depth", [2, 8])
@pytest.mark.parametrize("mode", MODES)
async def test_a_rejected_entry_stops_the_global_line_and_nothing_after_it_is_applied(
    serve: Serve,
    outbox: Outbox,
    db: Path,
    sink_db: Path,
    db_rows: Query,
    mode: Mode,
    depth: int,
) -> None:
    recorder = Recorder()
    url = await start_sink(serve, sink_db, recorder, reject_skus=frozenset({"bad"}))
    events = orders(30, skus=("snack",))
    gap = 9  # batch mode: the second item of the third request of 4
    events[gap] = {"id": events[gap]["id"], "sku": "bad", "qty": 1}
    ids = await accept_events(outbox, events)
    bad = ids[gap]

    async with sender_for(url) as sender:
        relay = relay_for(outbox, sender, mode, pipeline=depth)
        async with running(relay):
            # Two failed attempts: the line stayed stopped across a retry.
            await eventually(lambda: outbox_state(db_rows, db)[bad][1] >= 2)
            blocked = relay.blocked
            snapshot = await outbox.snapshot()

    assert blocked is not None and (blocked.event_id, blocked.permanent) == (bad, True)
    assert "400" in blocked.reason
    assert snapshot.head is not None and snapshot.head.id == bad
    assert snapshot.pending == len(ids) - gap
    state = outbox_state(db_rows, db)
    assert sent_ids(db) == ids[:gap]
    assert {i: state[i] for i in ids[:gap]} == dict.fromkeys(ids[:gap], (1, 1))
    # Each request that reached the rejected entry counted one failed attempt against
    # it, and only against it.
    assert state[bad] == (0, sum(bad in r.ids for r in recorder.requests))
    assert {i: state[i] for i in ids[gap + 1 :]} == dict.fromkeys(ids[gap + 1 :], (0, 0))
    [(last_error,)] = db_rows(db, "SELECT last_error FROM outbox_entries WHERE id = ?", (bad,))
    assert bad in last_error and "400" in last_error
    # The sink holds nothing after the gap, although requests for later entries
    # reached it while the rejected one was in flight. (One that arrives after the
    # rejection may still be waiting for it there: status 0.)
    assert inbox_ids(sink_db) == ids[:gap]
    after_gap = [r for r in recorder.requests if r.ids[0] in set(ids[gap + 1 :])]
    assert after_gap and {r.status for r in after_gap} <= {0, 412}, recorder.requests
    assert_runs_name_predecessors(recorder, events, "global", one_run=False)


@pytest.mark.parametrize("mode", MODES)
async def test_with_lanes_a_rejected_sku_blocks_only_its_own_lane(
    serve: Serve,
    outbox: Outbox,
    db: Path,
    sink_db: Path,
    db_rows: Query,
    mode: Mode,
) -> None:
    recorder = Recorder(by_sku=True)
    url = await start_sink(serve, sink_db, recorder, reject_skus=frozenset({"bad"}))
    events = orders(36, skus=("bad", "snack", "juice"))
    ids = await accept_events(outbox, events)
    keyed = lines(events, "sku")
    good = keyed["snack"] + keyed["juice"]

    async with sender_for(url) as sender:
        relay = relay_for(outbox, sender, mode, ordering="sku", pipeline=8)
        async with running(relay):
            await eventually(lambda: set(good) <= set(sent_ids(db)))
            await eventually(lambda: outbox_state(db_rows, db)[keyed["bad"][0]][1] >= 2)
            blocked_lanes = relay.blocked_lanes

    assert set(blocked_lanes) == {"bad"}
    assert blocked_lanes["bad"].event_id == keyed["bad"][0]
    assert sent_ids(db) == [i for i in ids if i in set(good)]
    applied = inbox_ids(sink_db)
    assert sorted(applied) == sorted(good)
    for sku in ("snack", "juice"):
        assert [i for i in applied if i in set(keyed[sku])] == keyed[sku]
    state = outbox_state(db_rows, db)
    assert [state[i] for i in keyed["bad"][1:]] == [(0, 0)] * (len(keyed["bad"]) - 1)


# ================================================================ failures on the way


@pytest.mark.parametrize("ordering", ORDERINGS)
@pytest.mark.parametrize("mode", MODES)
async def test_random_failures_end_with_every_entry_applied_once_and_in_order(
    serve: Serve,
    outbox: Outbox,
    db: Path,
    sink_db: Path,
    db_rows: Query,
    mode: Mode,
    ordering: Ordering,
) -> None:
    recorder = Recorder(by_sku=ordering == "sku")
    # The sink also drops the connection after its first three commits.
    url = await start_sink(serve, sink_db, recorder, drop_after_commit=3)
    events = orders(60)
    ids = await accept_events(outbox, events)
    # Requests start at multiples of their size within a line (failures are whole
    # requests here), so each line surely fails both ways once, and at random besides.
    size = 1 if mode == "single" else BATCH_LIMIT
    script: dict[str, Literal["before", "lost"]] = {}
    for line in lines(events, ordering).values():
        script |= {line[0]: "lost", line[2 * size]: "before"}

    async with sender_for(url) as sender:
        flaky = Flaky(sender, random.Random(2024), 0.2, 0.005, script)
        relay = relay_for(outbox, flaky, mode, ordering=ordering, pipeline=8)
        async with running(relay):
            await eventually(lambda: len(sent_ids(db)) == len(ids), timeout_s=30.0)

    assert flaky.failed["before"] > 0 and flaky.failed["lost"] > 0, flaky.failed
    assert flaky.cancelled, "no failure had requests behind it in flight"
    assert_applied_in_order(db_rows, db, sink_db, events, ordering)
    assert max(deliveries(sink_db).values()) > 1, "no resend was absorbed"
    assert_runs_name_predecessors(recorder, events, ordering, one_run=False)


@pytest.mark.parametrize("mode", MODES)
async def test_a_failed_request_cancels_the_requests_behind_it_at_once(
    serve: Serve, outbox: Outbox, db: Path, sink_db: Path, db_rows: Query, mode: Mode
) -> None:
    recorder = Recorder()
    url = await start_sink(serve, sink_db, recorder)
    events = orders(40)
    ids = await accept_events(outbox, events)
    # The request starting here fails before it is sent: the sink never sees it, so the
    # requests naming it as their predecessor wait there (up to its predecessor wait of
    # seconds) for nothing.
    failing = ids[5] if mode == "single" else ids[2 * BATCH_LIMIT]
    behind = ids[ids.index(failing) + (1 if mode == "single" else BATCH_LIMIT)]

    async with sender_for(url) as sender:
        flaky = Flaky(sender, script={failing: "before"})
        relay = relay_for(outbox, flaky, mode, pipeline=8)
        started = time.monotonic()
        async with running(relay):
            # Recorded: one attempt, or already two if the retry came between two polls.
            await eventually(lambda: outbox_state(db_rows, db)[failing][1] >= 1)
            recorded_s = time.monotonic() - started
            await eventually(lambda: len(sent_ids(db)) == len(ids))

    assert recorded_s < 1.5, f"the failure was recorded after {recorded_s:.2f}s"
    assert any(request[0] == behind for request in flaky.cancelled), flaky.cancelled
    assert next(after for request, after in flaky.calls if request[0] == behind) is not None
    assert_applied_in_order(db_rows, db, sink_db, events, "global")
    state = outbox_state(db_rows, db)
    assert state[failing] == (1, 2)
    assert {i: n for i, (_, n) in state.items() if i != failing} == dict.fromkeys(
        (i for i in ids if i != failing), 1
    )


@pytest.mark.parametrize("mode", MODES)
async def test_a_412_although_the_predecessor_was_applied_is_resent_naming_no_predecessor(
    serve: Serve, outbox: Outbox, db: Path, sink_db: Path, db_rows: Query, mode: Mode
) -> None:
    recorder = Recorder(refuse_naming_predecessor=1)
    url = await start_sink(serve, sink_db, recorder)
    events = orders(24)
    ids = await accept_events(outbox, events)

    async with sender_for(url) as sender:
        relay = relay_for(outbox, sender, mode, pipeline=8)
        async with running(relay):
            await eventually(lambda: len(sent_ids(db)) == len(ids))
            assert relay.blocked is None

    [refused] = [r for r in recorder.requests if r.status == 412]
    size = 1 if mode == "single" else BATCH_LIMIT
    assert (refused.ids, refused.after) == (ids[size : 2 * size], ids[size - 1])
    again = [r for r in recorder.requests if r.ids == refused.ids]
    assert [(r.after, r.status) for r in again] == [(ids[size - 1], 412), (None, 200)]
    assert_applied_in_order(db_rows, db, sink_db, events, "global")
    assert deliveries(sink_db) == dict.fromkeys(ids, 1)
    # A plain resend, not a failure: nothing recorded, no second attempt.
    assert outbox_state(db_rows, db) == dict.fromkeys(ids, (1, 1))
    assert db_rows(db, "SELECT count(*) FROM outbox_entries WHERE last_error IS NOT NULL") == [(0,)]


# ================================================================ the hook, and stopping


@pytest.mark.parametrize("ordering", ORDERINGS)
@pytest.mark.parametrize("mode", MODES)
async def test_the_hook_runs_in_order_before_the_mark_for_every_verified_entry(
    serve: Serve,
    outbox: Outbox,
    db: Path,
    sink_db: Path,
    db_rows: Query,
    mode: Mode,
    ordering: Ordering,
) -> None:
    recorder = Recorder()
    url = await start_sink(serve, sink_db, recorder)
    events = orders(48)
    ids = await accept_events(outbox, events)
    hooked: list[tuple[str, int]] = []

    def after_delivery(event_id: str) -> None:
        [(sent,)] = db_rows(db, "SELECT sent FROM outbox_entries WHERE id = ?", (event_id,))
        hooked.append((event_id, sent))

    async with sender_for(url) as sender:
        # Replies held at random: later requests often finish before earlier ones.
        flaky = Flaky(sender, random.Random(5), jitter_s=0.02)
        relay = relay_for(
            outbox,
            flaky,
            mode,
            ordering=ordering,
            pipeline=8,
            after_delivery=after_delivery,
        )
        async with running(relay):
            await eventually(lambda: len(sent_ids(db)) == len(ids))

    assert flaky.finished != sorted(flaky.finished), "requests never finished out of order"
    assert sorted(hooked) == [(i, 0) for i in ids]  # once each, none marked yet
    order = [event_id for event_id, _ in hooked]
    for line in lines(events, ordering).values():
        members = set(line)
        assert [i for i in order if i in members] == line
    assert_applied_in_order(db_rows, db, sink_db, events, ordering)


@pytest.mark.parametrize("ordering", ORDERINGS)
@pytest.mark.parametrize("mode", MODES)
async def test_stop_with_requests_in_flight_returns_promptly_and_loses_nothing(
    serve: Serve,
    outbox: Outbox,
    db: Path,
    sink_db: Path,
    db_rows: Query,
    mode: Mode,
    ordering: Ordering,
) -> None:
    stall_s = 0.1
    recorder = Recorder(by_sku=ordering == "sku")
    url = await start_sink(serve, sink_db, recorder, stall_s=stall_s)
    # Several rounds of 8 requests per line, so the stop comes with more to send.
    events = orders(96 if mode == "single" else 240)
    ids = await accept_events(outbox, events)

    async with sender_for(url) as sender:
        relay = relay_for(outbox, sender, mode, ordering=ordering, pipeline=8)
        task = asyncio.create_task(relay.run())
        try:
            await eventually(lambda: len(sent_ids(db)) >= 16 and recorder.in_progress() >= 2)
            in_flight = recorder.in_progress()
            started = time.monotonic()
            relay.stop()
            await asyncio.wait_for(asyncio.shield(task), STOP_TIMEOUT_S)
            stopped_s = time.monotonic() - started
        finally:
            relay.stop()
            await asyncio.wait_for(task, STOP_TIMEOUT_S)

    assert in_flight >= 2
    # The requests in flight stall together, then a line's are applied one after
    # another, a commit each: on a loaded disk those commits are most of the wait.
    assert stopped_s < 10 * stall_s, f"stop took {stopped_s:.2f}s"
    sent = sent_ids(db)
    assert len(sent) < len(ids), "the backlog drained before the stop"
    # Each line stopped at a point: what is sent is a prefix of it. Every request in
    # flight was answered and its entries marked: the inbox holds exactly the sent ones.
    for line in lines(events, ordering).values():
        members = set(line)
        done = [i for i in sent if i in members]
        assert done == line[: len(done)]
        assert [i for i in inbox_ids(sink_db) if i in members] == done
    assert sorted(inbox_ids(sink_db)) == sorted(sent)
    assert db_rows(db, "SELECT count(*) FROM outbox_entries WHERE last_error IS NOT NULL") == [(0,)]
    assert {s for s, _ in outbox_state(db_rows, db).values()} == {0, 1}

    # A new relay picks up where this one stopped; nothing is applied twice.
    async with sender_for(url) as sender:
        relay = relay_for(outbox, sender, mode, ordering=ordering, pipeline=8)
        async with running(relay):
            await eventually(lambda: len(sent_ids(db)) == len(ids))

    assert_applied_in_order(db_rows, db, sink_db, events, ordering)
    assert outbox_state(db_rows, db) == dict.fromkeys(ids, (1, 1))


# ================================================================ settings


@pytest.mark.parametrize("depth", [0, 17, -1])
async def test_a_pipeline_depth_outside_1_to_16_is_refused(outbox: Outbox, depth: int) -> None:
    async with sender_for("http://127.0.0.1:9/events") as sender:
        with pytest.raises(ValueError, match="pipeline depth"):
            relay_of(outbox, sender.deliver, pipeline=depth)
        for good in (1, 16):
            relay_of(outbox, sender.deliver, deliver_batch=sender.deliver_batch, pipeline=good)
